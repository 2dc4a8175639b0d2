"""train_logs_lm.py -- an SRE team fine-tunes state-spaces/mamba-790m-hf (Hugging Face transformers) as a
language model over server logs, for anomaly scoring by per-line perplexity, on a lab RTX A6000 (48 GB).
Mamba was picked for its long context: 4096-token windows of logs, batch 4, bf16, HF Trainer:

    model = MambaForCausalLM.from_pretrained("state-spaces/mamba-790m-hf")
    args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True, learning_rate=2e-4,
                             num_train_epochs=1, logging_steps=10)
    Trainer(model=model, args=args, train_dataset=windows_4096, data_collator=collator).train()

`pip install mamba-ssm causal-conv1d` had failed in the team's container (no nvcc, no prebuilt wheel for its
torch/CUDA pair); the install error was skipped and the model still loads.  transformers then prints once:
"The fast path is not available because one of `(selective_state_update, selective_scan_fn,
causal_conv1d_fn, causal_conv1d_update, mamba_inner_fn)` is None. Falling back to the sequential
implementation of Mamba" -- and every MambaMixer runs slow_forward.  The run dies in the first forward pass.

The user: "a 790M model, 3 GiB of weights, batch 4 x 4096 on a 48 GB card -- a transformer of this size
would train with room to spare."  What fills the card: the sequential path materialises the discretised
state-space tensors for every position, [batch, intermediate 3072, seq 4096, state 16] in fp32 = 3 GiB each
(exp(A*dt), dt*B, and dt*B*x), then loops over the 4096 positions keeping every step's [4, 3072, 16] state
for backward (another 4.5 GiB with the bf16 copies the matmul saves).  About 11.6 GiB per layer stays saved
for backward, of 48 layers: three layers hold 35 GiB, and the fourth fails making its dt*B*x (3 GiB) with
0.4 GiB free and 2.1 GiB cached.  The fused selective-scan kernel
(mamba_ssm) never materialises these: it keeps O(batch x seq x channels) per layer and recomputes the states
in backward.

An expert: install the fused kernels (mamba-ssm + causal-conv1d, built for this torch/CUDA, or a container
that ships them) so that the model takes its CUDA fast path; without them, the sequential path needs
gradient checkpointing plus much shorter windows and a smaller batch (and is slow).  Wrong first advice:
quantization, an 8-bit optimizer, LoRA or ZeRO/FSDP (weights and optimizer state are small beside the
scan's activations; the optimizer has not even stepped), flash attention (there is no attention in Mamba),
expandable_segments / empty_cache, release_references (nothing is kept across steps: it is the first
forward), a bigger GPU (48 layers x 11 GiB).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16
FP32 = torch.float32

# transformers/models/mamba/modeling_mamba.py: the CUDA kernels are optional imports
try:
    from mamba_ssm.ops.selective_scan_interface import mamba_inner_fn, selective_scan_fn
    from mamba_ssm.ops.triton.selective_state_update import selective_state_update
except ImportError:
    selective_state_update, selective_scan_fn, mamba_inner_fn = None, None, None
try:
    from causal_conv1d import causal_conv1d_fn, causal_conv1d_update
except ImportError:
    causal_conv1d_update, causal_conv1d_fn = None, None

is_fast_path_available = all(
    (selective_state_update, selective_scan_fn, causal_conv1d_fn, causal_conv1d_update, mamba_inner_fn))


def _t(n_elems, dtype, *srcs, **kw):
    """A tensor of n_elems of dtype made from srcs, in their autograd graph; `saves` is what the operation
    saves for backward (default: its inputs), kept alive through `_saved` as the stand-in's graph keeps it."""
    t = torch.empty(int(n_elems), dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        saves = kw.get("saves", srcs)
        t._saved = saves if len(saves) != 1 else saves[0]
        return torch.autograd._graph.derive(t, *srcs)
    return t


class MambaConfig(object):
    hidden_size = 1536
    intermediate_size = 3072
    state_size = 16
    num_hidden_layers = 48
    conv_kernel = 4
    time_step_rank = 96
    vocab_size = 50280


class MambaMixer(nn.Module):
    def __init__(self, config, layer_idx):
        nn.Module.__init__(self)
        h, d, n, r = config.hidden_size, config.intermediate_size, config.state_size, config.time_step_rank
        self.hidden_size, self.intermediate_size, self.ssm_state_size = h, d, n
        self.layer_idx = layer_idx
        self.in_proj = nn.Parameter(torch.empty(h * 2 * d * 4, device="cuda"))
        self.conv1d = nn.Parameter(torch.empty(d * config.conv_kernel * 4 + d * 4, device="cuda"))
        self.x_proj = nn.Parameter(torch.empty(d * (r + 2 * n) * 4, device="cuda"))
        self.dt_proj = nn.Parameter(torch.empty((r * d + d) * 4, device="cuda"))
        self.A_log = nn.Parameter(torch.empty(d * n * 4, device="cuda"))
        self.D = nn.Parameter(torch.empty(d * 4, device="cuda"))
        self.out_proj = nn.Parameter(torch.empty(d * h * 4, device="cuda"))

    def slow_forward(self, input_states, batch_size, seq_len):
        d, n = self.intermediate_size, self.ssm_state_size
        bld = batch_size * seq_len * d
        # 1. Gated MLP's linear projection
        projected_states = _t(2 * bld, BF16, input_states)                      # in_proj(...).transpose(1, 2)
        hidden_states, gate = projected_states, projected_states                 # .chunk(2, dim=1): views
        # 2. Convolution sequence transformation
        hidden_states = _t(bld, BF16, hidden_states)                             # act(conv1d(...)[..., :seq_len])
        # 3. State Space Model sequence transformation
        ssm_parameters = _t(batch_size * seq_len * (96 + 2 * n), BF16, hidden_states)   # x_proj
        discrete_time_step = _t(bld, BF16, ssm_parameters)                       # dt_proj
        discrete_time_step = _t(bld, BF16, discrete_time_step)                   # softplus(...).transpose(1, 2)
        # 3.b. Discretization: B and C to [batch, seq_len, intermediate_size, ssm_state_size] (SRAM)
        # A = -torch.exp(self.A_log.float()): [intermediate_size, ssm_state_size], small
        A_dt = _t(bld * n, FP32, discrete_time_step)                             # A[None, :, None, :] * dt[..., None]
        discrete_A = _t(bld * n, FP32, A_dt, saves=())                          # torch.exp(...): saves its result
        del A_dt
        discrete_B = _t(bld * n, FP32, discrete_time_step, ssm_parameters)      # dt[:, :, :, None] * B[:, None].float()
        hs_float = _t(bld, FP32, hidden_states, saves=())                        # hidden_states[:, :, :, None].float()
        deltaB_u = _t(bld * n, FP32, discrete_B, hs_float)
        # 3.c perform the recurrence y <- SSM(A, B, C)(x)
        ssm_state = torch.empty(batch_size * d * n, dtype=FP32, device="cuda")
        scan_outputs = []
        chunk = 64      # the stand-in makes the loop's per-position tensors 64 positions at a time (same bytes)
        for i in range(0, seq_len, chunk):
            # ssm_state = discrete_A[:, :, i, :] * ssm_state + deltaB_u[:, :, i, :]   (kept by the next mul)
            # (the mul saves the slice of discrete_A and the previous state; the add saves nothing, but its
            # graph holds deltaB_u's MulBackward node and what that saved: discrete_B and the float input)
            ssm_state = _t(chunk * batch_size * d * n, FP32, discrete_A, deltaB_u, ssm_state,
                           saves=(discrete_A, ssm_state, deltaB_u._saved))
            # scan_output = torch.matmul(ssm_state.to(dtype), C[:, i, :].unsqueeze(-1))  (the bf16 copy is saved)
            # (.to() saves nothing, but its graph node leads back to the add and the mul, and what they saved)
            state_bf16 = _t(chunk * batch_size * d * n, BF16, ssm_state, saves=(ssm_state._saved,))
            scan_outputs.append(_t(chunk * batch_size * d, BF16, state_bf16, ssm_parameters))
        scan_output = _t(bld, BF16, *scan_outputs, saves=(scan_outputs,))       # torch.stack(scan_outputs, dim=-1)
        del scan_outputs, deltaB_u
        scan_output = _t(bld, BF16, scan_output, hidden_states, gate)           # (+ x * D) * act(gate)
        # 4. Final linear projection
        return _t(batch_size * seq_len * self.hidden_size, BF16, scan_output)   # out_proj(...transpose(1, 2))

    def cuda_kernels_forward(self, input_states, batch_size, seq_len):
        raise RuntimeError("mamba_inner_fn is None")

    def forward(self, hidden_states, batch_size, seq_len):
        if is_fast_path_available:
            return self.cuda_kernels_forward(hidden_states, batch_size, seq_len)
        return self.slow_forward(hidden_states, batch_size, seq_len)


class MambaBlock(nn.Module):
    def __init__(self, config, layer_idx):
        nn.Module.__init__(self)
        self.norm = nn.Parameter(torch.empty(config.hidden_size * 4, device="cuda"))
        self.mixer = MambaMixer(config, layer_idx)
        self.hidden_size = config.hidden_size

    def forward(self, hidden_states, batch_size, seq_len):
        residual = hidden_states
        normed = _t(batch_size * seq_len * self.hidden_size, BF16, hidden_states)   # self.norm(...)
        out = self.mixer(normed, batch_size, seq_len)
        return _t(batch_size * seq_len * self.hidden_size, FP32, residual, out)    # residual + hidden_states (fp32)


class MambaForCausalLM(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.embeddings = nn.Parameter(torch.empty(config.vocab_size * config.hidden_size * 4, device="cuda"))
        for i in range(config.num_hidden_layers):
            setattr(self, "layers_%d" % i, MambaBlock(config, i))
        self.norm_f = nn.Parameter(torch.empty(config.hidden_size * 4, device="cuda"))
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name):
        if not is_fast_path_available:
            print("The fast path is not available because one of `(selective_state_update, selective_scan_fn, "
                  "causal_conv1d_fn, causal_conv1d_update, mamba_inner_fn)` is None. Falling back to the "
                  "sequential implementation of Mamba, as use_mambapy is set to False. To install follow "
                  "https://github.com/state-spaces/mamba/#installation and "
                  "https://github.com/Dao-AILab/causal-conv1d.", file=sys.stderr)
        return cls(MambaConfig())

    def forward(self, input_ids, labels=None):
        batch_size, seq_len = input_ids.batch, input_ids.seq_len
        h = _t(batch_size * seq_len * self.config.hidden_size, FP32, self.embeddings)
        for i in range(self.config.num_hidden_layers):
            h = getattr(self, "layers_%d" % i)(h, batch_size, seq_len)
        logits = _t(batch_size * seq_len * self.config.vocab_size, FP32, h, self.embeddings)   # tied lm_head
        return {"loss": _t(1, FP32, logits), "logits": logits}


# ---------------------------------------------------------------- transformers' Trainer, abridged
class TrainingArguments(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, bf16=False, learning_rate=5e-5,
                 num_train_epochs=3, logging_steps=500):
        self.output_dir = output_dir
        self.per_device_train_batch_size = per_device_train_batch_size
        self.bf16, self.learning_rate = bf16, learning_rate
        self.num_train_epochs, self.logging_steps = num_train_epochs, logging_steps


class Batch(object):
    def __init__(self, batch, seq_len):
        self.batch, self.seq_len = batch, seq_len
        self.t = torch.empty(batch * seq_len * 8, device="cuda")    # input_ids, int64


class Trainer(object):
    def __init__(self, model, args, train_dataset):
        self.model, self.args, self.train_dataset = model, args, train_dataset
        self.optimizer = None

    def compute_loss(self, model, inputs):
        outputs = model(inputs, labels=inputs)
        return outputs["loss"]

    def training_step(self, model, inputs):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.args.bf16):
            loss = self.compute_loss(model, inputs)
        loss.backward()
        return loss

    def train(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate)
        bs = self.args.per_device_train_batch_size
        for step in range(len(self.train_dataset) // bs):
            inputs = Batch(bs, 4096)
            self.training_step(self.model, inputs)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)


def main():
    model = MambaForCausalLM.from_pretrained("state-spaces/mamba-790m-hf")
    print("parameters: %.0fM" % (sum(p.nbytes for p in model.parameters()) / 4 / 1e6))
    windows_4096 = list(range(182_000))                          # tokenized log windows (host memory)
    args = TrainingArguments("out", per_device_train_batch_size=4, bf16=True, learning_rate=2e-4,
                             num_train_epochs=1, logging_steps=10)
    Trainer(model=model, args=args, train_dataset=windows_4096).train()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
