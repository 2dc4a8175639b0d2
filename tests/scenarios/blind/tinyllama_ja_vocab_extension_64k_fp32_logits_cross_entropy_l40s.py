"""cpt_ja.py -- continued pretraining of TinyLlama-1.1B (intermediate-step-1431k-3T) on Japanese web text
after extending its vocabulary, on one NVIDIA L40S (48 GB, 46068 MiB).

The team merged 32,000 Japanese SentencePiece pieces (trained on CC-100 ja + Wikipedia ja) into the Llama
tokenizer's 32,000 and resized the model before training, as every "add a language to Llama" recipe does:

    tokenizer = LlamaTokenizer.from_pretrained("./tokenizer_ja_merged")           # 63,982 pieces
    model = LlamaForCausalLM.from_pretrained("TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
                                             torch_dtype=torch.float32, attn_implementation="sdpa").cuda()
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)          # 32000 -> 64000, embed + lm_head
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for step, batch in enumerate(loader):                 # packed rows of 2,048 tokens, micro-batch 24
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss / ACCUM
        loss.backward()
        if (step + 1) % ACCUM == 0:                       # ACCUM = 10: 491,520 tokens per optimizer step
            optimizer.step(); optimizer.zero_grad(set_to_none=True)

Micro-batch 24 came from last week's smoke test with the ORIGINAL tokenizer on English text: 200 steps at
about 39 GiB allocated (45 GB in nvidia-smi), the largest micro-batch that fit.  transformers 4.44.2's
LlamaForCausalLM.forward computes the logits of every position, upcasts them (logits.float()), shifts them
(logits[..., :-1, :].contiguous()) and calls CrossEntropyLoss, whose log_softmax makes a third float32 tensor
of the same size.  With the new vocabulary the very first forward pass dies in the loss: 49,152 tokens x 64,000
entries is 11.7 GiB per float32 copy (the bf16 logits 5.9 GiB, then three float32 copies: 35 GiB for the loss
head alone), where the 1.23B fp32 weights are 4.6 GiB and the 22 checkpointed layers keep 8.3 GiB.

Expert reading: the vocabulary doubled, and so did everything after the lm_head; the float32 logits of 49k
tokens x 64k entries, three of them, are now by far the biggest thing in the step.  First: never materialise
them -- a fused linear + cross-entropy (Liger Kernel's apply_liger_kernel_to_llama() / use_liger_kernel=True,
or a loss chunked over the tokens) takes the 35 GiB away; or lower the micro-batch (12, with ACCUM 20: the same
491k tokens per step, half the logits).
Wrong advice: gradient checkpointing (already on; the logits are outside the layers), flash attention (SDPA is
on; attention is not what fills the card), mixed precision (already bf16 autocast; the model upcasts the logits
to float32 itself), 8-bit AdamW / ZeRO / CPU offload (no optimizer state exists yet, and it did not change: the
vocabulary did), LoRA (the new embeddings and lm_head rows must be trained in full, LoRA would leave them
random), shorter sequences (2,048 is the context the model is trained for), expandable_segments / empty_cache
(one 11.7 GiB request against 4.5 GiB free; the 3 GiB cached in holes would not cover it), inference_mode
(this is training).
"""
import os
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code (PyTorch's C++ ops have no Python frame of the program):
# Tensor.float / Tensor.contiguous / slicing, torch.nn.CrossEntropyLoss, torch.utils.checkpoint.checkpoint.
_TENSOR_OPS = """
def float(self):
    # aten::_to_copy: a float32 copy; its backward saves nothing of its input, but the graph before it
    # (what the input's node keeps) stays reachable
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)

def contiguous(self, memory_format=None):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)

def __getitem__(self, idx):
    return self.view()
"""
_ns = {"torch": torch}
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["float"]
torch.Tensor.contiguous = _ns["contiguous"]
torch.Tensor.__getitem__ = _ns["__getitem__"]
if not hasattr(torch, "int64"):                   # token ids
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8

_LOSS = """
class CrossEntropyLoss(Module):
    def __init__(self, ignore_index=-100, reduction="mean"):
        Module.__init__(self)
        self.reduction = reduction

    def forward(self, input, target):
        return F.cross_entropy(input, target, reduction=self.reduction)
"""
_ns = {"Module": torch.nn.Module, "F": F}
exec(compile(_LOSS, os.path.join(os.path.dirname(torch.__file__), "nn", "modules", "loss.py"), "exec"), _ns)
torch.nn.CrossEntropyLoss = _ns["CrossEntropyLoss"]

_CKPT = """
def checkpoint(function, *args, use_reentrant=None, **kwargs):
    # non-reentrant checkpoint: the forward runs without keeping its activations; the inputs are saved
    with torch.no_grad():
        out = function(*args, **kwargs)
    out._saved = args[0]
    return torch._derive(out, *[a for a in args if isinstance(a, torch.Tensor)])
"""
import types
_ckpt_mod = types.ModuleType("torch.utils.checkpoint")
_ckpt_mod.__file__ = os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py")
_ckpt_mod.torch = torch
exec(compile(_CKPT, _ckpt_mod.__file__, "exec"), _ckpt_mod.__dict__)
_utils = sys.modules.get("torch.utils") or types.ModuleType("torch.utils")
_utils.checkpoint = _ckpt_mod
torch.utils = _utils
sys.modules["torch.utils"] = _utils
sys.modules["torch.utils.checkpoint"] = _ckpt_mod
# ----

GiB = 1 << 30


class LlamaConfig(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


TINYLLAMA = LlamaConfig(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                        num_attention_heads=32, num_key_value_heads=4, max_position_embeddings=2048,
                        tie_word_embeddings=False)


def _weight(*shape):
    n = 1
    for s in shape:
        n *= s
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Embedding(torch.nn.Module):
    def __init__(self, num, dim):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num, dim
        self.weight = _weight(num, dim)

    def forward(self, input_ids):
        b, s = input_ids.shape
        return torch.empty(b * s * self.embedding_dim, dtype=torch.float32, device="cuda")


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = i, o
        self.weight = _weight(o, i)

    def forward(self, x, tokens):
        # under autocast a Linear runs in bf16: a bf16 output; it saves its input for the weight's gradient
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        return out


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = _weight(d)
        self.d = d

    def forward(self, x, tokens):
        out = torch.empty(tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = x
        return out


class LlamaSdpaAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        kv = c.hidden_size // c.num_attention_heads * c.num_key_value_heads
        self.q_proj = Linear(c.hidden_size, c.hidden_size)
        self.k_proj = Linear(c.hidden_size, kv)
        self.v_proj = Linear(c.hidden_size, kv)
        self.o_proj = Linear(c.hidden_size, c.hidden_size)

    def forward(self, x, tokens):
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device="cuda")   # F.scaled_dot_product_attention
        del q, k, v
        return self.o_proj(attn, tokens)


class LlamaMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(c.hidden_size, c.intermediate_size)
        self.up_proj = Linear(c.hidden_size, c.intermediate_size)
        self.down_proj = Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x, tokens):
        g = self.gate_proj(x, tokens)
        u = self.up_proj(x, tokens)
        h = torch.empty(g.nbytes // 2, dtype=torch.bfloat16, device="cuda")     # act_fn(gate) * up
        del g, u
        return self.down_proj(h, tokens)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaSdpaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size)
        self.hidden = c.hidden_size

    def forward(self, hidden_states, tokens):
        h = self.input_layernorm(hidden_states, tokens)
        a = self.self_attn(h, tokens)
        del h
        hidden = torch.empty(tokens * self.hidden, dtype=torch.float32, device="cuda")   # residual add (fp32)
        h = self.post_attention_layernorm(hidden, tokens)
        m = self.mlp(h, tokens)
        del h, a
        out = torch.empty(tokens * self.hidden, dtype=torch.float32, device="cuda")      # residual add (fp32)
        del hidden, m
        return out


class LlamaModel(torch.nn.Module):
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
        self.gradient_checkpointing = False

    def forward(self, input_ids):
        b, s = input_ids.shape
        tokens = b * s
        hidden_states = self.embed_tokens(input_ids)
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = torch.utils.checkpoint.checkpoint(decoder_layer.__call__, hidden_states, tokens,
                                                                  use_reentrant=False)
            else:
                hidden_states = decoder_layer(hidden_states, tokens)
        return self.norm(hidden_states, tokens)


class CausalLMOutputWithPast(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(torch.nn.Module):
    """transformers 4.44.2 models/llama/modeling_llama.py, the parts that allocate."""

    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = Linear(c.hidden_size, c.vocab_size)

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.model.gradient_checkpointing = True

    def resize_token_embeddings(self, new_num_tokens, pad_to_multiple_of=None):
        if pad_to_multiple_of:
            new_num_tokens = (new_num_tokens + pad_to_multiple_of - 1) // pad_to_multiple_of * pad_to_multiple_of
        self.model.embed_tokens = Embedding(new_num_tokens, self.config.hidden_size)   # old rows copied in
        self.lm_head = Linear(self.config.hidden_size, new_num_tokens)                 # untied: resized too
        self.config.vocab_size = new_num_tokens
        return self.model.embed_tokens

    def forward(self, input_ids=None, labels=None):
        b, s = input_ids.shape
        hidden_states = self.model(input_ids)
        logits = self.lm_head(hidden_states, b * s)
        logits = logits.float()
        loss = None
        if labels is not None:
            # Shift so that tokens < n predict n
            shift_logits = logits[..., :-1, :].contiguous()
            shift_labels = labels[..., 1:].contiguous()
            # Flatten the tokens
            loss_fct = torch.nn.CrossEntropyLoss()
            shift_logits = shift_logits.view(-1, self.config.vocab_size)
            shift_labels = shift_labels.view(-1)
            loss = loss_fct(shift_logits, shift_labels)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


class LlamaTokenizer(object):
    def __init__(self, pieces):
        self.pieces = pieces

    def __len__(self):
        return self.pieces


def token_batch(b, s):
    """A packed batch from the DataLoader, moved to the GPU: int64 ids and labels."""
    ids = torch.empty(b * s, dtype=torch.int64, device="cuda")
    ids.shape = (b, s)
    labels = torch.empty(b * s, dtype=torch.int64, device="cuda")
    labels.shape = (b, s)
    return {"input_ids": ids, "labels": labels}


MICRO_BATCH = 24
SEQ_LEN = 2048
ACCUM = 10
MAX_STEPS = 20000


def main():
    tokenizer = LlamaTokenizer(63982)    # ./tokenizer_ja_merged
    model = LlamaForCausalLM(TINYLLAMA)                                      # from_pretrained(...).cuda()
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=64)
    model.gradient_checkpointing_enable()
    model.train()
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("vocab %d, %.3fB parameters, micro-batch %d x %d, accumulation %d"
          % (model.config.vocab_size, n_params / 1e9, MICRO_BATCH, SEQ_LEN, ACCUM))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)

    for step in range(MAX_STEPS * ACCUM):
        batch = token_batch(MICRO_BATCH, SEQ_LEN)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch["input_ids"], labels=batch["labels"]).loss / ACCUM
        scen_truth.backward(loss)                      # loss.backward()
        del loss, batch
        if (step + 1) % ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            print("step %d: reserved %.1f GiB, peak allocated %.1f GiB"
                  % ((step + 1) // ACCUM, torch.cuda.memory_reserved() / GiB, torch.cuda.max_memory_allocated() / GiB))


# stand-in gap: Tensor arithmetic (loss / ACCUM) keeps the graph
_DIV = """
def __truediv__(self, other):
    out = torch.empty(4, dtype=torch.float32, device=self.device)
    out._saved = self
    return torch._derive(out, self)
"""
_ns = {"torch": torch}
exec(compile(_DIV, torch.__file__, "exec"), _ns)
torch.Tensor.__truediv__ = _ns["__truediv__"]

try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
