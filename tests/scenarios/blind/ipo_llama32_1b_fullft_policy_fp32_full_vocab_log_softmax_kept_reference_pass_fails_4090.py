"""train_ipo.py -- preference tuning of meta-llama/Llama-3.2-1B-Instruct (1.24B parameters, bf16: 2.30 GiB) with
the IPO loss, full fine-tuning, on one RTX 4090 (24 GB).  The loop is the team's own; its log-prob code was
copied from TRL's DPOTrainer of early 2024 (concatenated_forward / get_batch_logps):

    def get_batch_logps(logits, labels):                 # logits [2B, L, V] float32
        labels = labels[:, 1:].clone(); logits = logits[:, :-1, :]
        loss_mask = labels != -100; labels[labels == -100] = 0
        per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=labels.unsqueeze(2)).squeeze(2)
        return (per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1)      # IPO: length-averaged

    def concatenated_forward(model, batch):
        all_logits = model(batch["concatenated_input_ids"], attention_mask=...).logits.to(torch.float32)
        all_logps = get_batch_logps(all_logits, batch["concatenated_labels"])
        return all_logps[:n], all_logps[n:], all_logits[:n], all_logits[n:]   # logits kept for logging

    policy.gradient_checkpointing_enable()
    for batch in loader:                                 # 8 pairs, max_length 1024
        pc, pr, pc_logits, pr_logits = concatenated_forward(policy, batch)
        with torch.no_grad():
            rc, rr, _, _ = concatenated_forward(ref_model, batch)
        losses = ((pc - pr) - (rc - rr) - 1 / (2 * beta)) ** 2
        ...
        metrics["logits/chosen"] = pc_logits.detach().mean()

It fails on the first batch, in the reference model's forward (under torch.no_grad), asking for 3.91 GiB:
the reference model's bf16 logits, [16, 1024, 128256].

What holds the card: not the models (two copies, 4.6 GiB) and not the decoder activations (gradient
checkpointing: 1 GiB), but the policy pass's vocabulary-sized tensors: .to(torch.float32) made a float32
copy of the logits, 16 x 1024 x 128,256 x 4 bytes = 7.83 GiB, which stays alive because all_logits[:n]
and all_logits[n:] are returned for the "logits/chosen" metric; log_softmax(-1) made another 7.83 GiB,
which autograd keeps for backward.  The policy pass alone holds 15.7 GiB of per-vocabulary floats to
extract 16 x 1023 log-probabilities; the reference pass then needs the same again.

An expert: never materialize the float32 log-softmax over the vocabulary for a gather -- compute each
token's log-prob as its logit minus the row's logsumexp (TRL's selective_log_softmax, row by row or in
chunks, on the bf16 logits), or use a fused linear + log-prob kernel (Liger's DPO/IPO loss) that never
builds the [B, L, V] logits at all; log the mean of the chosen logits as a number, not by keeping the
tensor.  A smaller per-step batch with gradient accumulation gets through only at 2 pairs (at 4 pairs the
second step fails once AdamW's 4.6 GiB exist), with the same waste per token.
Wrong first advice: inference_mode / no_grad for the reference pass (it already runs under no_grad; the
memory is the policy pass's), gradient checkpointing (on; the tensors are after the last layer), an 8-bit
optimizer or LoRA (no optimizer state exists yet at the first step; the models are 4.6 GiB together),
quantization, empty_cache / expandable_segments (live tensors), flash-attention (not attention),
precompute_ref_log_probs alone (the policy pass then holds 15.7 GiB and its backward needs another 7.8 for
the gradient of the log-softmax: still over 24 GB), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16, FP32 = torch.bfloat16, torch.float32
GiB = 1 << 30

# ---- stand-in gap: transformers' LlamaForCausalLM (compiled under transformers' path, so its frames are the
# library's, as in the real stack), and Tensor.to(dtype), log_softmax's float32 path
_TRANSFORMERS = '''
import torch


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = p(h * h), p(h * kv), p(h * kv), p(h * h)
        self.gate_proj, self.up_proj, self.down_proj = p(h * ff), p(h * ff), p(ff * h)
        self.input_layernorm, self.post_attention_layernorm = p(h), p(h)
        object.__setattr__(self, "cfg", cfg)

    def forward(self, hidden_states, tokens, checkpointing):
        cfg = self.cfg
        out = torch.empty(tokens * cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        if checkpointing and torch.is_grad_enabled():
            out._saved = hidden_states       # torch.utils.checkpoint: only the layer's input is kept
            return out
        # without autograd (the reference model): the MLP's intermediates, freed at once
        gate_up = torch.empty(tokens * 2 * cfg["intermediate_size"], dtype=torch.bfloat16, device="cuda")
        del gate_up
        return out


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(torch.nn.Module):
    """Llama 3.2 1B: tie_word_embeddings, the LM head is the embedding matrix."""

    def __init__(self, cfg, dtype, trainable=True):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "cfg", cfg)
        p = lambda n: torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)
        self.embed_tokens = p(cfg["vocab_size"] * cfg["hidden_size"])
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            layer = LlamaDecoderLayer(cfg, dtype, trainable)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.norm = p(cfg["hidden_size"])
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls(CONFIGS[name], torch_dtype or torch.float32)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.gradient_checkpointing = True

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def forward(self, input_ids, attention_mask=None):
        batch, seq = input_ids
        tokens = batch * seq
        hidden = torch.empty(tokens * self.cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens, self.gradient_checkpointing)
        last = hidden
        hidden = torch.empty(tokens * self.cfg["hidden_size"], dtype=torch.bfloat16, device="cuda")   # norm
        hidden._saved = last if torch.is_grad_enabled() else None
        logits = torch.empty(tokens * self.cfg["vocab_size"], dtype=torch.bfloat16, device="cuda")    # lm_head
        logits._saved = hidden
        return CausalLMOutputWithPast(logits)


CONFIGS = {"meta-llama/Llama-3.2-1B-Instruct": {"hidden_size": 2048, "intermediate_size": 8192,
                                                "num_hidden_layers": 16, "num_key_value_heads": 8, "head_dim": 64,
                                                "vocab_size": 128256}}
AutoModelForCausalLM = LlamaForCausalLM
'''
_tf = {"torch": torch, "__name__": "transformers.models.llama.modeling_llama"}
exec(compile(_TRANSFORMERS, "/opt/conda/lib/python3.11/site-packages/transformers/models/llama/modeling_llama.py",
             "exec"), _tf)
AutoModelForCausalLM = _tf["AutoModelForCausalLM"]

# Tensor.to(dtype), Tensor.log_softmax and torch.gather: C functions in PyTorch (no Python frame of their own), compiled as part
# of torch's file so that the failing line stays the caller's
_TENSOR_OPS = '''
def to(self, dtype):
    """A copy in dtype; ToCopyBackward keeps nothing of its input, but the graph behind it lives on."""
    if dtype == self.dtype:
        return self
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=dtype, device=self.device)
    out._saved = getattr(self, "_saved", None) if torch.is_grad_enabled() else None
    return torch._derive(out, self)


def log_softmax(self, dim=-1):
    """LogSoftmaxBackward keeps its result (the gather below keeps it), not its input; the graph behind lives on."""
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = getattr(self, "_saved", None) if torch.is_grad_enabled() else None
    return torch._derive(out, self)


def gather(input, dim, index):
    """index: the (rows, positions) of the labels; one value per label; the graph keeps the input (the next
    node, LogSoftmaxBackward, keeps its result) for backward."""
    out = torch.empty(index[0] * index[1], dtype=input.dtype, device=input.device)
    out._saved = input if torch.is_grad_enabled() else None
    return torch._derive(out, input)
'''
if not hasattr(torch.Tensor, "to"):
    _ns = {"torch": torch}
    exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
    torch.Tensor.to, torch.Tensor.log_softmax, torch.gather = _ns["to"], _ns["log_softmax"], _ns["gather"]
# ----

MODEL = "meta-llama/Llama-3.2-1B-Instruct"
BATCH_PAIRS, MAX_LENGTH = 8, 1024
BETA = 0.1


def get_batch_logps(logits, labels):
    # labels = labels[:, 1:].clone(); logits = logits[:, :-1, :]
    # loss_mask = labels != -100; labels[labels == -100] = 0
    per_token_logps = torch.gather(logits.log_softmax(-1), dim=2, index=(labels[0], labels[1] - 1))
    return per_token_logps      # (per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1)


def concatenated_forward(model, batch):
    n = batch["n"]
    all_logits = model(batch["concatenated_input_ids"], attention_mask=None).logits.to(torch.float32)
    all_logps = get_batch_logps(all_logits, batch["concatenated_labels"])
    # all_logps[:n], all_logps[n:], all_logits[:n], all_logits[n:]
    return all_logps, all_logps, all_logits.view(), all_logits.view()


def main():
    policy = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16).cuda()
    ref_model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16).cuda()
    ref_model.eval()
    ref_model.requires_grad_(False)
    policy.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-7)
    print("policy and reference loaded: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))

    for step in range(4000):
        seqs = 2 * BATCH_PAIRS
        batch = {"n": BATCH_PAIRS, "concatenated_input_ids": (seqs, MAX_LENGTH),
                 "concatenated_labels": (seqs, MAX_LENGTH)}
        policy_chosen_logps, policy_rejected_logps, policy_chosen_logits, policy_rejected_logits = \
            concatenated_forward(policy, batch)
        print("step %d: policy pass done, %.2f GiB allocated" % (step, torch.cuda.memory_allocated() / GiB))
        with torch.no_grad():
            reference_chosen_logps, reference_rejected_logps, _, _ = concatenated_forward(ref_model, batch)
        # IPO: ((pi_logratios - ref_logratios) - 1 / (2 * beta)) ** 2
        losses = torch.nn.functional.nll_loss(policy_chosen_logps, None)
        scen_truth.backward(losses)
        optimizer.step()
        optimizer.zero_grad()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
