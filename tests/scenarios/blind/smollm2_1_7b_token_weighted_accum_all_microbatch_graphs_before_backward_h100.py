"""pretrain.py -- a 1.7B Llama-architecture model (SmolLM2-1.7B's config: 24 layers, d=2048, MLP 8192, 49,152-
token vocabulary, tied embeddings) pretrained from scratch on one H100 80GB, unpacked documents padded per
micro-batch (the team keeps documents apart instead of packing them), micro-batch 4 x up to 2,048 tokens,
gradient accumulation 8, bf16 autocast over float32 weights, SDPA (flash) attention, no checkpointing
(padded to the longest document of each micro-batch: with long web documents that is 2,048 almost always).

Until last week the loop was the usual one -- (loss / ACCUM).backward() per micro-batch -- and ran at a 55 GiB
peak.  After reading about the gradient-accumulation loss bug (a mean per micro-batch weights the tokens of
short micro-batches more than those of long ones), the team made the loss a sum over all real tokens of the
accumulation window divided by their count, and since the count is only known after the last micro-batch,
they call backward once at the end:

    for step in range(max_steps):
        micro_batches = [next(train_iter) for _ in range(ACCUM)]
        losses, n_tokens = [], 0
        for mb in micro_batches:
            mb = {k: v.cuda(non_blocking=True) for k, v in mb.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            loss_sum = F.cross_entropy(logits.view(-1, V).float(), mb["labels"].view(-1),
                                       ignore_index=-100, reduction="sum")
            losses.append(loss_sum)
            n_tokens += (mb["labels"] != -100).sum()
        loss = torch.stack(losses).sum() / n_tokens
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Every loss_sum in the list keeps its micro-batch's whole autograd graph -- 24 layers of saved activations
(about 25 GiB at 8,192 tokens without checkpointing) plus the bf16 logits, their float32 copy and the
log-probabilities (3.75 GiB): 28.6 GiB a micro-batch -- until the single backward.  The first step dies in the
third micro-batch's forward pass: two graphs (57 GiB) and the 6.4 GiB of weights fill the card, before any
gradient or AdamW state exists.

Expert reading: the graphs of all micro-batches are alive at once; accumulation exists to keep just one.  The
count does not need the forward passes: the labels are in the batches already drawn -- count the real tokens of
all eight micro-batches first (on the CPU, before the loop), then call (loss_sum / n_tokens).backward() on each
micro-batch's loss right after its forward (what transformers' Trainer does since 4.46 with
num_items_in_batch).  Same gradient, one graph at a time, the old 55 GiB peak.
Wrong advice: a smaller micro-batch (eight graphs are still kept; the bug scales with ACCUM), gradient
checkpointing (shrinks each kept graph at +30% compute and leaves all eight alive), mixed precision / flash
attention (both on), an 8-bit optimizer, ZeRO or offload (no optimizer state exists yet), quantization or LoRA
(pretraining from scratch), expandable_segments / empty_cache (nothing is cached: live graphs fill the card),
inference_mode (training), shorter sequences, a bigger GPU (on 141 GB it dies at the fifth micro-batch).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code (C++ in PyTorch): int64, Tensor.float, comparison and sum,
# torch.stack, F.silu, F.scaled_dot_product_attention, Tensor.__add__ / __mul__ / __truediv__.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
    torch._ITEMSIZE["bool"] = 1      # (torch.bool: not set here, it would shadow the builtin in the stand-in)
_GAPS = """
def float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)

def __ne__(self, other):
    return torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype="bool", device=self.device)

def sum(self, dim=None):
    out = torch.empty(1, dtype=torch.int64 if self.dtype in ("bool", "int64") else torch.float32, device=self.device)
    out._saved = self if self._params else None
    return torch._derive(out, self)

def stack(tensors, dim=0):
    out = torch.empty(len(tensors), dtype=torch.float32, device=tensors[0].device)
    out._saved = tuple(tensors)
    return torch._derive(out, *tensors)

def _binary(self, other):
    t = other if isinstance(other, torch.Tensor) and other.nbytes > self.nbytes else self
    out = torch.empty(t.nbytes // torch._ITEMSIZE[t.dtype], dtype=t.dtype, device=t.device)
    out._saved = (self, other)
    return torch._derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))

def _radd(self, other):
    return self if other == 0 else _binary(self, other)

def silu(input, inplace=False):
    out = torch.empty(input.nbytes // 2, dtype=torch.bfloat16, device=input.device)
    out._saved = input
    return torch._derive(out, input)

def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    out = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(q.nbytes // 2 // 64, dtype=torch.float32, device=q.device)
    out._saved = (q, k, v, lse)
    return torch._derive(out, q, k, v)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["float"]
torch.Tensor.__ne__ = _ns["__ne__"]
torch.Tensor.sum = _ns["sum"]
torch.Tensor.__add__ = torch.Tensor.__mul__ = torch.Tensor.__truediv__ = _ns["_binary"]
torch.Tensor.__radd__ = _ns["_radd"]
torch.stack = _ns["stack"]
_nsf = {"torch": torch}
exec(compile(_GAPS, F.__file__, "exec"), _nsf)
F.silu, F.scaled_dot_product_attention = _nsf["silu"], _nsf["scaled_dot_product_attention"]
# ----

GiB = 1 << 30


class LlamaConfig(object):      # HuggingFaceTB/SmolLM2-1.7B's config.json
    vocab_size = 49152
    hidden_size = 2048
    intermediate_size = 8192
    num_hidden_layers = 24
    num_attention_heads = 32
    num_key_value_heads = 32
    tie_word_embeddings = True


def _p(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = _p(i * o)

    def forward(self, x):
        # autocast: a bf16 matmul; saves its input for the weight's gradient
        out = torch.empty(x.tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        out.tokens = x.tokens
        return out


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(d)
        self.d = d

    def forward(self, x):
        out = torch.empty(x.tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = x
        out.tokens = x.tokens
        return out


class LlamaAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(c.hidden_size, c.hidden_size)
        self.k_proj = Linear(c.hidden_size, c.hidden_size)
        self.v_proj = Linear(c.hidden_size, c.hidden_size)
        self.o_proj = Linear(c.hidden_size, c.hidden_size)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        # apply_rotary_pos_emb: new q and k
        q = q * 1.0
        k = k * 1.0
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        y.tokens = x.tokens
        return self.o_proj(y)


class LlamaMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        h = F.silu(self.gate_proj(x)) * self.up_proj(x)
        h.tokens = x.tokens
        return self.down_proj(h)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size)

    def forward(self, hidden_states):
        t = hidden_states.tokens
        residual = hidden_states
        hidden_states = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = residual + hidden_states.float()
        hidden_states.tokens = t
        residual = hidden_states
        hidden_states = self.mlp(self.post_attention_layernorm(hidden_states))
        hidden_states = residual + hidden_states.float()
        hidden_states.tokens = t
        return hidden_states


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(n * d)
        self.d = d

    def forward(self, ids):
        out = torch.empty(ids.tokens * self.d, dtype=torch.float32, device="cuda")
        out.tokens = ids.tokens
        return out


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = LlamaDecoderLayer(c)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = LlamaRMSNorm(c.hidden_size)
        self.lm_head = Linear(c.hidden_size, c.vocab_size)
        self.lm_head.weight = self.embed_tokens.weight          # tie_word_embeddings

    def forward(self, input_ids, attention_mask=None):
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        hidden_states = self.norm(hidden_states)
        return CausalLMOutput(self.lm_head(hidden_states))


class _HostBatch(object):
    """A collated micro-batch in pinned host memory; .cuda(non_blocking=True) copies it over."""

    def __init__(self, rows, seqlen, dtype):
        self.rows, self.seqlen, self.dtype = rows, seqlen, dtype

    def cuda(self, non_blocking=False):
        t = torch.empty(self.rows * self.seqlen, dtype=self.dtype, device="cuda")
        t.tokens = self.rows * self.seqlen
        return t


def train_iter_fn(micro_batch, seqlen):
    while True:   # DataCollatorForLanguageModeling(pad_to_multiple_of=64): the longest document of the batch
        yield {"input_ids": _HostBatch(micro_batch, seqlen, torch.int64),
               "attention_mask": _HostBatch(micro_batch, seqlen, torch.int64),
               "labels": _HostBatch(micro_batch, seqlen, torch.int64)}


MICRO_BATCH = 4
MAX_LEN = 2048
ACCUM = 8
max_steps = 100000


def main():
    model = LlamaForCausalLM(LlamaConfig())
    model.train()
    V = model.config.vocab_size
    print("%.2fB parameters" % (sum(p.nbytes for p in model.parameters()) / 4e9))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    train_iter = train_iter_fn(MICRO_BATCH, MAX_LEN)

    for step in range(max_steps):
        micro_batches = [next(train_iter) for _ in range(ACCUM)]
        losses, n_tokens = [], 0
        for mb in micro_batches:
            mb = {k: v.cuda(non_blocking=True) for k, v in mb.items()}
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(mb["input_ids"], attention_mask=mb["attention_mask"]).logits
            loss_sum = F.cross_entropy(logits.view(-1, V).float(), mb["labels"].view(-1),
                                       reduction="sum")     # ignore_index=-100
            losses.append(loss_sum)
            n_tokens += (mb["labels"] != -100).sum()
            print("micro-batch %d: %.1f GiB allocated" % (len(losses), torch.cuda.memory_allocated() / GiB))
        loss = torch.stack(losses).sum() / n_tokens
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
