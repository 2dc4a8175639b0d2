"""sft.py -- full supervised fine-tuning of Qwen2.5-1.5B (1.54B parameters, float32 master weights, bf16
autocast, AdamW, gradient checkpointing, 8 x 2048-token packed sequences) on one H100 80GB HBM3.  The same
script and config ran last week on this box: torch.cuda.max_memory_allocated() said 46.3 GiB.

Yesterday a customer reported an OOM on their 24 GB RTX 4090s.  To reproduce it on the H100, the engineer
used the team's memory-debugging helper, imported at the top of every training script:

    # memdebug.py
    if os.environ.get("MEMDEBUG_EMULATE_GIB"):                 # pretend to be a smaller card
        gib = float(os.environ["MEMDEBUG_EMULATE_GIB"])
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(gib * 2**30 / total)
    if os.environ.get("MEMDEBUG_HISTORY"):                      # for torch.cuda.memory._dump_snapshot()
        torch.cuda.memory._record_memory_history(max_entries=100_000)

and ran `export MEMDEBUG_EMULATE_GIB=24 MEMDEBUG_HISTORY=1` in the tmux pane.  The reproduction worked, the
snapshot went to the customer ticket.  This morning, in the same pane, they started the real run:

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B", torch_dtype=torch.float32).cuda()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=batch["input_ids"], labels=batch["labels"])
        out.loss.backward()
        ...

It dies in the first forward, in Qwen2ForCausalLM's loss (transformers 4.44: `logits = logits.float()`, then
`shift_logits = logits[..., :-1, :].contiguous()`): "Tried to allocate 9.27 GiB.  GPU 0 has a total capacity of
79.65 GiB of which 62.03 GiB is free.  24.00 GiB allowed; Of the allocated memory 16.48 GiB is allocated by
PyTorch ...".  The process has 17.1 GiB reserved; 62 GiB of the card are free.

An expert: the card is three-quarters empty; PyTorch's allocator refused the request itself because a per-process
memory fraction caps it at 24 GiB -- the debugging emulation of a 4090 is still exported in that shell.
`unset MEMDEBUG_EMULATE_GIB MEMDEBUG_HISTORY` (or start from a fresh shell; better, make the helper print a
loud warning when it caps) and the run fits as it did last week.  The memory-history recording is harmless
for memory (host-side stack traces; it only slows the run) but should go too.
Wrong advice: a smaller batch, gradient accumulation, a fused / chunked cross-entropy, 8-bit AdamW, LoRA,
quantization or CPU offload (they shrink a job that already fits this card, and change the training to fit a
limit nobody wants); expandable_segments or empty_cache (0.6 GiB is cached; the cap refuses any new
segment past 24 GiB); a bigger GPU (80 GB are there, 62 GiB free); looking for other processes (there are none).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: Tensor.float / Tensor.contiguous and nn.Linear / nn.Embedding (C++ and torch.nn in
# PyTorch).  Compiled as part of torch's files so that the failing line of the program stays the user's own.
_TENSOR_GAPS = """
def float(self):
    if self.dtype == "float32":
        return self
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=float32, device=self.device)
    out._saved = None
    return _derive(out, self)

def contiguous(self):
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = None
    return _derive(out, self)
"""
_ns = dict(vars(torch))
exec(compile(_TENSOR_GAPS, torch.__file__, "exec"), _ns)
for _name in ("float", "contiguous"):
    if not hasattr(torch.Tensor, _name):
        setattr(torch.Tensor, _name, _ns[_name])

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
"""
import torch.nn.modules.module as _mm  # noqa: E402

if not hasattr(torch.nn, "Linear"):
    _ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
    exec(compile(_NN_GAPS, _mm.__file__, "exec"), _ns)
    torch.nn.Linear, torch.nn.Embedding = _ns["Linear"], _ns["Embedding"]
# ----

GiB = 1 << 30


# ---------------------------------------------------------------- memdebug.py (the team's helper)
def memdebug_setup():
    """Imported by every training script: emulate a smaller card, record allocation history."""
    if os.environ.get("MEMDEBUG_EMULATE_GIB"):
        gib = float(os.environ["MEMDEBUG_EMULATE_GIB"])
        total = torch.cuda.get_device_properties(0).total_memory
        torch.cuda.set_per_process_memory_fraction(gib * GiB / total)
        print("memdebug: emulating a %.0f GiB card" % gib)
    if os.environ.get("MEMDEBUG_HISTORY"):
        torch.cuda.memory._record_memory_history(max_entries=100000)


# ---------------------------------------------------------------- transformers' Qwen2 (as far as memory goes)
class Qwen2Config(object):
    vocab_size = 151936
    hidden_size = 1536
    intermediate_size = 8960
    num_hidden_layers = 28
    num_attention_heads = 12
    num_key_value_heads = 2
    head_dim = 128


class Qwen2RMSNorm(torch.nn.Module):
    def __init__(self, h):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(h, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes // torch._ITEMSIZE[x.dtype], dtype=x.dtype, device="cuda")
        out._saved = x
        return torch._derive(out, x, self.weight)


class Qwen2Attention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        kv = c.num_key_value_heads * c.head_dim
        self.q_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, device="cuda")
        self.k_proj = torch.nn.Linear(c.hidden_size, kv, device="cuda")
        self.v_proj = torch.nn.Linear(c.hidden_size, kv, device="cuda")
        self.o_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False, device="cuda")

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device="cuda")   # SDPA (flash) output
        attn._saved = (q, k, v)
        return self.o_proj(torch._derive(attn, q, k, v))


class Qwen2MLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device="cuda")
        self.up_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, device="cuda")
        self.down_proj = torch.nn.Linear(c.intermediate_size, c.hidden_size, bias=False, device="cuda")

    def forward(self, x):
        return self.down_proj(self.gate_proj(x))


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention(c)
        self.mlp = Qwen2MLP(c)
        self.input_layernorm = Qwen2RMSNorm(c.hidden_size)
        self.post_attention_layernorm = Qwen2RMSNorm(c.hidden_size)

    def forward(self, x):
        h = self.self_attn(self.input_layernorm(x))
        return self.mlp(self.post_attention_layernorm(h))


def checkpoint(layer, x):
    """torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=False): the layer runs without keeping its
    activations (recomputed in backward); only its input and its output stay."""
    with torch.no_grad():
        y = layer(x)
    out = torch.empty(y.nbytes // 2, dtype=torch.bfloat16, device="cuda")
    del y
    out._saved = x
    return torch._derive(out, x, *layer.parameters())


class Qwen2Model(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size, device="cuda")
        self.layers = [Qwen2DecoderLayer(c) for _ in range(c.num_hidden_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)
        self.norm = Qwen2RMSNorm(c.hidden_size)
        self.gradient_checkpointing = False

    def forward(self, input_ids, ntokens):
        x = self.embed_tokens(input_ids, ntokens)
        for layer in self.layers:
            x = checkpoint(layer, x) if self.gradient_checkpointing else layer(x)
        return self.norm(x)


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.model = Qwen2Model(c)
        self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False, device="cuda")
        self.lm_head.weight = self.model.embed_tokens.weight            # tie_word_embeddings

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels, ntokens):
        hidden_states = self.model(input_ids, ntokens)
        logits = self.lm_head(hidden_states)
        logits = logits.float()
        loss = None
        if labels is not None:
            # Shift so that tokens < n predict n
            shift_logits = logits.contiguous()           # logits[..., :-1, :].contiguous()
            loss = torch.nn.functional.cross_entropy(shift_logits, labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


# ---------------------------------------------------------------- sft.py
def main():
    memdebug_setup()
    cfg = {"model": "Qwen/Qwen2.5-1.5B", "per_device_train_batch_size": 8, "max_seq_length": 2048,
           "learning_rate": 1e-5, "gradient_checkpointing": True, "bf16": True}
    print("config: %s" % cfg)
    model = Qwen2ForCausalLM(Qwen2Config())                 # from_pretrained(..., torch_dtype=torch.float32).cuda()
    model.gradient_checkpointing_enable()
    model.train()
    nparams = sum(p.nbytes for p in model.parameters()) // 4
    print("loaded %s: %.2fB parameters, %.2f GiB" % (cfg["model"], nparams / 1e9, nparams * 4 / GiB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=0.1)

    batch_size = cfg["per_device_train_batch_size"]
    ntokens = batch_size * cfg["max_seq_length"]
    for step in range(3):
        input_ids = torch.empty(ntokens * 8, device="cuda")       # int64 ids
        labels = torch.empty(ntokens * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=input_ids, labels=labels, ntokens=ntokens)
        scen_truth.backward(out.loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del out
        print("step %d done" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
