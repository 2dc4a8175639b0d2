"""train.py -- full fine-tuning of Llama-3.2-3B (3.21B parameters) in pure bf16 (weights, gradients and AdamW's
moments all bfloat16) on one NVIDIA L40S (48 GB), batch 4 x 2048 with gradient checkpointing.  The run had loss
spikes around step 1,800, so the engineer added gradient monitoring to the W&B logging, every 10 steps, before
clipping:

    for step, batch in enumerate(loader):
        out = model(**batch)
        out.loss.backward()
        if step % args.log_every == 0:                     # log_every = 10
            grads = [p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None]
            flat = torch.cat(grads)
            wandb.log({"grad/global_norm": flat.norm().item(),
                       "grad/hist": wandb.Histogram(flat.cpu().numpy(), num_bins=512)}, step=step)
            del grads, flat
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

Step 0 logs fine (the grad panel shows up in W&B) and steps 1-9 run as before.  Step 10 dies at
`flat = torch.cat(grads)`: "Tried to allocate 11.97 GiB".  The list comprehension has already made a float32
copy of every gradient (12 GiB, twice the bf16 gradients), and torch.cat asks for a second 12 GiB float32 vector
of all 3.2B gradient values.  At step 0 that fitted because AdamW's state did not exist yet; from the first
optimizer.step() on, its two bf16 moments (12 GiB) sit beside the weights (6 GiB) and the gradients (6 GiB).
Training itself peaks at 35.7 GiB (in the loss, with the float32 logits); the monitoring needs 24 GiB on top of
weights, gradients and moments: 47.9 GiB on a 44.4 GiB card.

An expert: the memory is the monitoring, not the model or the batch.  Get the global norm without any copy
(clip_grad_norm_ already returns it: `gn = torch.nn.utils.clip_grad_norm_(params, 1.0)`, or
`torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))`, foreach norms in the
grads' own storage), and build the histogram one parameter at a time (per-layer histograms with torch.histc, or a
strided sample of each gradient moved to the CPU), never a float32 concatenation of every gradient.
Wrong advice: a smaller batch, gradient checkpointing, shorter sequences or a fused cross-entropy (the
activations are gone after backward; the failing request is the gradients' copy), mixed precision (already
bf16 everywhere; the .float() is the monitor's), 8-bit AdamW or CPU offload (they would make room by changing
the training for a logging line), expandable_segments / empty_cache (one 12 GiB request with the card full of
live tensors), a bigger GPU, ZeRO or more GPUs.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: Tensor.float / flatten / contiguous, torch.cat and nn.Linear / nn.Embedding (C++ and
# torch.nn in PyTorch).  Compiled as part of torch's files so that the failing line stays the program's own.
_TORCH_GAPS = """
def float(self):
    if self.dtype == "float32":
        return self
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=float32, device=self.device)
    out._saved = None
    return _derive(out, self)

def flatten(self, start_dim=0, end_dim=-1):
    return self.view(-1)

def contiguous(self):
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = None
    return _derive(out, self)

def cat(tensors, dim=0):
    tensors = list(tensors)
    dt = tensors[0].dtype
    out = empty(sum(t.nbytes for t in tensors) // _ITEMSIZE[dt], dtype=dt, device=tensors[0].device)
    return _derive(out, *tensors)

def norm(self):
    out = empty(1, dtype=self.dtype, device=self.device)
    return _derive(out, self)

def item(self):
    return 0.0
"""
_ns = dict(vars(torch))
exec(compile(_TORCH_GAPS, torch.__file__, "exec"), _ns)
for _name in ("float", "flatten", "contiguous", "norm", "item"):
    if not hasattr(torch.Tensor, _name):
        setattr(torch.Tensor, _name, _ns[_name])
if not hasattr(torch, "cat"):
    torch.cat = _ns["cat"]

_NN_GAPS = """
class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features, dtype=dtype or torch.float32, device=device))
        self.bias = Parameter(torch.empty(out_features, dtype=dtype or torch.float32, device=device)) if bias else None

    def forward(self, input):
        dt = torch.bfloat16 if torch.is_autocast_enabled() else input.dtype
        n = input.nbytes // torch._ITEMSIZE[input.dtype] // self.in_features * self.out_features
        out = torch.empty(n, dtype=dt, device=input.device)
        out._saved = input
        return torch._derive(out, input, self.weight)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = Parameter(torch.empty(num_embeddings * embedding_dim, dtype=dtype or torch.float32, device=device))

    def forward(self, input_ids, ntokens):
        out = torch.empty(ntokens * self.embedding_dim, dtype=self.weight.dtype, device=self.weight.device)
        return torch._derive(out, self.weight)


def clip_grad_norm_(parameters, max_norm, norm_type=2.0, foreach=None):
    # per-tensor norms (torch._foreach_norm) stacked, then scaled in place: no copy of the gradients
    total = torch.empty(1, dtype=torch.float32, device="cuda")
    return total
"""
import torch.nn.modules.module as _mm  # noqa: E402

_ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
exec(compile(_NN_GAPS, _mm.__file__, "exec"), _ns)
if not hasattr(torch.nn, "Linear"):
    torch.nn.Linear, torch.nn.Embedding = _ns["Linear"], _ns["Embedding"]


class _NNUtils(object):
    clip_grad_norm_ = staticmethod(_ns["clip_grad_norm_"])


if not hasattr(torch.nn, "utils"):
    torch.nn.utils = _NNUtils()


class wandb(object):
    """Weights & Biases, as far as this script uses it (host side only)."""
    @staticmethod
    def init(project=None, config=None):
        print("wandb: run initialised, project %s" % project)

    class Histogram(object):
        def __init__(self, values, num_bins=64):
            self.values = values

    @staticmethod
    def log(d, step=None):
        print("wandb: step %d %s" % (step, sorted(d)))
# ----

GiB = 1 << 30
BF16 = torch.bfloat16


# ---------------------------------------------------------------- transformers' Llama (as far as memory goes)
class LlamaConfig(object):
    vocab_size = 128256
    hidden_size = 3072
    intermediate_size = 8192
    num_hidden_layers = 28
    num_attention_heads = 24
    num_key_value_heads = 8
    head_dim = 128


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, h):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(h, dtype=BF16, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes // 2, dtype=BF16, device="cuda")
        out._saved = x
        return torch._derive(out, x, self.weight)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        kv = c.num_key_value_heads * c.head_dim
        self.q_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False, device="cuda", dtype=BF16)
        self.k_proj = torch.nn.Linear(c.hidden_size, kv, bias=False, device="cuda", dtype=BF16)
        self.v_proj = torch.nn.Linear(c.hidden_size, kv, bias=False, device="cuda", dtype=BF16)
        self.o_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False, device="cuda", dtype=BF16)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = torch.empty(q.nbytes // 2, dtype=BF16, device="cuda")       # SDPA (flash) output
        attn._saved = (q, k, v)
        return self.o_proj(torch._derive(attn, q, k, v))


class LlamaMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device="cuda", dtype=BF16)
        self.up_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device="cuda", dtype=BF16)
        self.down_proj = torch.nn.Linear(c.intermediate_size, c.hidden_size, bias=False, device="cuda", dtype=BF16)

    def forward(self, x):
        return self.down_proj(self.gate_proj(x))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size)

    def forward(self, x):
        h = self.self_attn(self.input_layernorm(x))
        return self.mlp(self.post_attention_layernorm(h))


def checkpoint(layer, x):
    """torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False): only the layer's input and output stay."""
    with torch.no_grad():
        y = layer(x)
    out = torch.empty(y.nbytes // 2, dtype=BF16, device="cuda")
    del y
    out._saved = x
    return torch._derive(out, x, *layer.parameters())


class LlamaModel(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size, device="cuda", dtype=BF16)
        self.layers = [LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)
        self.norm = LlamaRMSNorm(c.hidden_size)
        self.gradient_checkpointing = False

    def forward(self, input_ids, ntokens):
        x = self.embed_tokens(input_ids, ntokens)
        for layer in self.layers:
            x = checkpoint(layer, x) if self.gradient_checkpointing else layer(x)
        return self.norm(x)


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel(c)
        self.lm_head = torch.nn.Linear(c.hidden_size, 1, bias=False, device="cuda", dtype=BF16)
        self.lm_head.out_features = c.vocab_size
        self.lm_head.weight = self.model.embed_tokens.weight            # tie_word_embeddings (Llama 3.2)

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels, ntokens):
        hidden_states = self.model(input_ids, ntokens)
        logits = self.lm_head(hidden_states)
        logits = logits.float()
        loss = None
        if labels is not None:
            shift_logits = logits.contiguous()           # logits[..., :-1, :].contiguous()
            loss = torch.nn.functional.cross_entropy(shift_logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


# ---------------------------------------------------------------- train.py
class Args(object):
    model_name = "meta-llama/Llama-3.2-3B"
    per_device_train_batch_size = 4
    max_seq_length = 2048
    learning_rate = 1e-5
    max_grad_norm = 1.0
    log_every = 10
    max_steps = 2000


def main():
    args = Args()
    wandb.init(project="llama32-3b-sft", config=vars(Args))
    model = LlamaForCausalLM(LlamaConfig())         # from_pretrained(args.model_name, torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.train()
    nparams = sum(p.nbytes for p in model.parameters()) // 2
    print("loaded %s: %.2fB parameters (bf16, %.2f GiB)" % (args.model_name, nparams / 1e9, nparams * 2 / GiB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)

    ntokens = args.per_device_train_batch_size * args.max_seq_length
    for step in range(args.max_steps):
        input_ids = torch.empty(ntokens * 8, device="cuda")       # int64 ids
        labels = torch.empty(ntokens * 8, device="cuda")
        out = model(input_ids=input_ids, labels=labels, ntokens=ntokens)
        scen_truth.backward(out.loss)
        loss = out.loss.item()
        del out
        if step % args.log_every == 0:
            grads = [p.grad.detach().float().flatten() for p in model.parameters() if p.grad is not None]
            flat = torch.cat(grads)
            wandb.log({"train/loss": loss,
                       "grad/global_norm": flat.norm().item(),
                       "grad/hist": wandb.Histogram(flat, num_bins=512)}, step=step)   # flat.cpu().numpy()
            del grads, flat
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print("step %d  allocated %.2f GiB  peak %.2f GiB" % (step, torch.cuda.memory_allocated() / GiB,
                                                            torch.cuda.max_memory_allocated() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
