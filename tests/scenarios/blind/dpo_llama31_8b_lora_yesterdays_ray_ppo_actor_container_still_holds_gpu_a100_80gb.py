"""DPO with LoRA on Llama-3.1-8B on a single A100 80GB that should have 40 GB to spare -- but yesterday's
OpenRLHF PPO run on the same workstation left a Ray actor alive.  The Ray head ran in its own container
(docker compose); the driver was killed with Ctrl-C, the `ray::PolicyModelActor` worker process stayed up and
still holds 58 GiB of GPU 0.  From the DPO container, nvidia-smi shows 58 GB used and no process.  (The case
names that process "ray-PolicyModelActor" in SIMGPU_OTHER_PROCS, whose fields are separated by colons.)

The real code (trl 0.11 DPOTrainer pattern, written out by hand):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                 torch_dtype=torch.bfloat16).to("cuda")
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj",
                                                                                  "v_proj", "o_proj"]))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-6)
    for batch in loader:                                 # 2 pairs -> 4 sequences padded to 1024
        with torch.no_grad(), model.disable_adapter():   # reference = the base without the adapter
            ref_chosen, ref_rejected = concatenated_forward(model, batch)
        pol_chosen, pol_rejected = concatenated_forward(model, batch)
        loss = -F.logsigmoid(beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad()

What happens: the weights load (15 GiB), the reference pass (no_grad, ~3.6 GiB transient, kept cached) runs,
then the first policy forward dies in its 10th decoder layer, on a 32 MiB activation (4,096 tokens x 4,096 x
2 B) with 8 MiB free.  The user is about to switch to 4-bit QLoRA and halve the
batch.

The arithmetic:
  * card 80 GiB; the leftover Ray actor (another process, a pid this container cannot see) 58 GiB; this
    process's CUDA context 0.5 GiB -> 21.5 GiB for this job.
  * weights bf16 8.03 G parameters (untied lm_head) = 14.96 GiB, LoRA fp32 52 MiB.  -> 6.5 GiB left.
  * policy forward, 4 x 1,024 = 4,096 tokens, no gradient checkpointing: 92,160 bf16 values a token a layer
    kept for backward = 0.70 GiB a layer: 9 layers (+ the embedding output) fit, the 10th does not.
  * the job alone needs ~15 + 32 x 0.70 + ~3 (bf16 logits 1 GiB, fp32 log-softmax 2 GiB) = ~41 GiB: it fits
    the card twice over once the 58 GiB are back.

What an expert says: this process holds ~22 GiB of an 80 GiB card that has under 1 GiB free -- the other
58 GiB belong to another process.  Stop it (`docker exec <ray-head> ray stop --force`, or kill the
PolicyModelActor pid from the host's `nvidia-smi`) and rerun unchanged.  Wrong advice: quantization, a
smaller batch, gradient checkpointing (workarounds that shrink a job that fits), empty_cache /
expandable_segments (this process caches nothing), restarting this process (the memory is not its own).
"""
import contextlib
import random

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "meta-llama/Llama-3.1-8B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 4096, 14336, 1024, 32, 128256
per_device_train_batch_size = 2
MAX_LENGTH = 1024
BETA = 0.1
LORA_R = 16


def save_for_backward(out, *tensors):
    """What autograd keeps for this op's backward (nothing under no_grad); backward frees it."""
    if torch.is_grad_enabled():
        out._saved = tensors[0] if len(tensors) == 1 else tensors
    return out


# ---------------------------------------------------------------- modeling (transformers + peft)
class Linear(nn.Module):
    def __init__(self, n_in, n_out, lora_r=0):
        super().__init__()
        self.n_in, self.n_out = n_in, n_out
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16), requires_grad=False)
        self.lora_enabled = bool(lora_r)
        if lora_r:
            self.lora_A = nn.Parameter(torch.empty(n_in * lora_r, dtype=torch.float32))
            self.lora_B = nn.Parameter(torch.empty(lora_r * n_out, dtype=torch.float32))

    def forward(self, x):
        out = torch.empty(x.nbytes // (2 * self.n_in) * self.n_out, dtype=torch.bfloat16)
        return save_for_backward(out, x)


class LlamaRMSNorm(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, x):
        return save_for_backward(torch.empty_like(x), x)


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN, LORA_R)
        self.k_proj = Linear(HIDDEN, KV_DIM, LORA_R)
        self.v_proj = Linear(HIDDEN, KV_DIM, LORA_R)
        self.o_proj = Linear(HIDDEN, HIDDEN, LORA_R)

    def forward(self, hidden_states):
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        attn_output = save_for_backward(torch.empty_like(q), q, k, v)          # sdpa
        return self.o_proj(attn_output)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        act = save_for_backward(torch.empty_like(gate), gate)                  # silu
        return self.down_proj(save_for_backward(torch.empty_like(up), act, up))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()

    def forward(self, hidden_states):
        attn = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = save_for_backward(torch.empty_like(attn), hidden_states, attn)     # residual
        mlp = self.mlp(self.post_attention_layernorm(hidden_states))
        return save_for_backward(torch.empty_like(mlp), hidden_states, mlp)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = nn.Module()
        self.model.embed_tokens.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16),
                                                      requires_grad=False)
        for i in range(N_LAYERS):
            setattr(self.model, "layers_%d" % i, LlamaDecoderLayer())
        self.model.norm = LlamaRMSNorm(HIDDEN)
        self.lm_head = Linear(HIDDEN, VOCAB)
        self._adapter_disabled = False

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        hidden_states = save_for_backward(torch.empty(tokens * HIDDEN, dtype=torch.bfloat16), input_ids)
        for i in range(N_LAYERS):
            hidden_states = getattr(self.model, "layers_%d" % i)(hidden_states)
        logits = self.lm_head(self.model.norm(hidden_states))
        return {"logits": logits}

    @contextlib.contextmanager
    def disable_adapter(self):
        self._adapter_disabled = True
        try:
            yield
        finally:
            self._adapter_disabled = False


def load_policy():
    """from_pretrained(torch_dtype=bf16).to("cuda") + get_peft_model(LoRA r=16 on q/k/v/o)."""
    return LlamaForCausalLM()


def free_saved_tensors(root):
    """What autograd does at the end of backward (retain_graph=False): every tensor the graph saved is
    released.  (The stand-in torch keeps saved tensors in `_saved`; real PyTorch needs no such call.)"""
    todo = [root]
    while todo:
        t = todo.pop()
        if isinstance(t, (tuple, list)):
            todo.extend(t)
        elif t is not None and getattr(t, "_saved", None) is not None:
            todo.append(t._saved)
            t._saved = None


# ---------------------------------------------------------------- DPO
class SequenceLogProb(nn.Module):
    """torch.gather(logps, -1, labels).squeeze(-1), masked and summed per sequence."""

    def forward(self, logps, rows):
        return save_for_backward(torch.empty(rows, dtype=torch.float32), logps)


sequence_logps = SequenceLogProb()


class DPOLoss(nn.Module):
    """-logsigmoid(beta * ((pol_chosen - ref_chosen) - (pol_rejected - ref_rejected))).mean()"""

    def forward(self, pol_chosen, pol_rejected, ref_chosen, ref_rejected):
        return save_for_backward(torch.empty(1, dtype=torch.float32), pol_chosen)


dpo_loss = DPOLoss()


def concatenated_forward(model, batch):
    out = model(batch["concatenated_input_ids"], batch["concatenated_attention_mask"])
    logps = F.log_softmax(out["logits"], dim=-1, dtype=torch.float32)     # then gathered at the labels
    per_seq = sequence_logps(logps, batch["rows"])              # gather at the labels, sum over the completion
    return per_seq, per_seq


def preference_batches(n, seed=0):
    rng = random.Random(seed)
    for _ in range(n):
        rows = 2 * per_device_train_batch_size                                # chosen + rejected
        length = min(MAX_LENGTH, max(rng.randint(600, 1400) for _ in range(rows)))
        yield {"rows": rows, "concatenated_input_ids": torch.empty(rows * length * 8),
               "concatenated_attention_mask": torch.empty(rows * length * 8)}


def train_dpo():
    model = load_policy()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-6)
    for step, batch in enumerate(preference_batches(3000)):
        with torch.no_grad(), model.disable_adapter():
            ref_chosen, ref_rejected = concatenated_forward(model, batch)
        pol_chosen, pol_rejected = concatenated_forward(model, batch)
        loss = dpo_loss(pol_chosen, pol_rejected, ref_chosen, ref_rejected)
        loss.backward()
        free_saved_tensors(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step % 10 == 0:
            print("step", step)


if __name__ == "__main__":
    try:
        train_dpo()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
