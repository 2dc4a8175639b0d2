"""pretrain_slw.py -- a GPT-NeoX model with Pythia-160M's config (12 layers, d=768, 50,304-token vocabulary,
untied embeddings) pretrained from scratch on a lab workstation's NVIDIA RTX A4500 (20 GB, 20470 MiB), with
sequence-length warmup (Li et al., "The Stability-Efficiency Dilemma"; DeepSpeed's seqlen curriculum,
fixed_linear, difficulty_step 8) written into a plain PyTorch loop:

    def seqlen_at(step):                          # 64 -> 2048 over the first 248 steps, multiples of 8
        s = MIN_SEQLEN + (MAX_SEQLEN - MIN_SEQLEN) * min(1.0, step / TOTAL_CURRICULUM_STEP)
        return int(s) // DIFFICULTY_STEP * DIFFICULTY_STEP

    for step in range(TOTAL_STEPS):
        seqlen = seqlen_at(step)
        for micro in range(GRAD_ACCUM):                                   # micro-batch 8, GRAD_ACCUM 2
            ids, labels = next(loader)[:, :seqlen] ...                     # packed rows, truncated
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

bf16 autocast over float32 weights, SDPA (flash) attention, AdamW.  Every step has a new shape: 8 more tokens
per row.  The run dies at step 248, the first at the full 2,048 tokens, in the backward pass of its second
micro-batch: "Tried to allocate 3.07 GiB" (the gradient of the float32 log-probabilities, 16,384 tokens x
50,304) with 0.82 GiB free, and "3.24 GiB reserved by PyTorch but unallocated".  15.4 GiB is allocated.  The
student concludes that 2,048 tokens do not fit on a 20 GB card and wants to stop the curriculum at 1,792.

Expert reading: the numbers say it fits -- 15.4 GiB allocated + 3.07 GiB requested + the 0.5 GiB context is
19.0 GiB of a 20 GiB card; the memory is there but not in one piece.  The largest free block is 3.02 GiB: the
log-probabilities block that the first micro-batch's backward freed, now split by one 48 MiB activation of the
second micro-batch's forward (every block cached while the rows were 2,040 tokens long is a little too small
for the 2,048-token tensors, so they went to the only free blocks big enough).  The cache cannot give the rest
back: a live tensor sits in each of those segments.  First: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
(the allocator grows segments in place instead of needing a new contiguous 3 GiB); coarser curriculum steps
(multiples of 128 or 256 tokens) also make fewer distinct shapes to fragment the cache.
Wrong advice: capping the curriculum at a shorter length (changes the model's context for a memory layout
problem), a smaller micro-batch or gradient checkpointing (cost throughput; the peak fits), empty_cache
(the allocator already released every wholly free segment before raising; what is left is split by live
tensors), restarting (the same shapes come back in the same order), mixed precision / flash attention (both
on), 8-bit optimizers, ZeRO, offload, quantization, LoRA (the 160M model's state is 2.4 GiB), a bigger GPU.
"""
import math
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code (C++ in PyTorch): int64 ids, slicing a batch to the
# curriculum's length, Tensor.float, F.gelu, F.scaled_dot_product_attention, autocast's float32 cross_entropy,
# torch.nn.utils.clip_grad_norm_.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
_GAPS = """
def float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    out.tokens = getattr(self, "tokens", None)
    return torch._derive(out, self)

def gelu(input, approximate="none"):
    out = torch.empty(input.nbytes // 2, dtype=torch.bfloat16, device=input.device)
    out._saved = input
    out.tokens = input.tokens
    return torch._derive(out, input)

def scaled_dot_product_attention(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False):
    # flash attention: output plus a float32 logsumexp per head and token; no L x L matrix
    out = torch.empty(q.nbytes // 2, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(q.tokens * 12, dtype=torch.float32, device=q.device)
    out._saved = (q, k, v, lse)
    out.tokens = q.tokens
    return torch._derive(out, q, k, v)

def cross_entropy(input, target, reduction="mean"):
    if torch.is_autocast_enabled() and input.dtype in (torch.bfloat16, torch.float16):
        input = input.float()
    return _plain_cross_entropy(input, target, reduction)

def clip_grad_norm_(parameters, max_norm, norm_type=2.0):
    norms = [torch.empty(1, dtype=torch.float32, device=p.device) for p in parameters if p.grad is not None]
    total = torch.empty(1, dtype=torch.float32, device="cuda")
    del norms
    return total
"""
_ns = {"torch": torch, "_plain_cross_entropy": F.cross_entropy}
exec(compile(_GAPS, F.__file__, "exec"), _ns)
torch.Tensor.float = _ns["float"]
F.gelu, F.scaled_dot_product_attention, F.cross_entropy = (_ns["gelu"], _ns["scaled_dot_product_attention"],
                                                           _ns["cross_entropy"])
import types
torch.nn.utils = types.SimpleNamespace(clip_grad_norm_=_ns["clip_grad_norm_"])

# The autograd engine as PyTorch's runs it, as far as memory goes: it walks the graph from the loss back to the
# inputs on its own thread; each node makes the gradient of its input (a buffer the size of the activation it
# saved), frees what it saved, and a module's weights get their .grad when its node runs -- so the gradients
# are made one layer at a time, in the holes the freed activations leave, and live until zero_grad.
_ENGINE = """
def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for i, r in enumerate(roots):
        if not r.requires_grad and r.grad_fn is None:
            raise RuntimeError("element %d of tensors does not require grad and does not have a grad_fn" % i)
    params = []
    for r in roots:
        for p in r._params:
            if all(p is not q for q in params):
                params.append(p)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_run_graph, (roots, params, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]


def _accumulate(p):
    if p.requires_grad:
        if p.grad is None:
            p.grad = torch.empty_like(p)


def _run_graph(roots, params, box, done):
    _engine._tls.engine = True
    try:
        order, seen, todo = [], set(), list(roots)
        while todo:
            t = todo.pop()
            if not isinstance(t, torch.Tensor) or id(t) in seen:
                continue
            seen.add(id(t))
            order.append(t)
            v = t.__dict__.get("_saved")
            todo.extend(v if isinstance(v, (tuple, list)) else [v])
        del todo, roots
        order.reverse()
        grad_out = None
        while order:
            t = order.pop()
            g = torch.empty(t.nbytes, device=t.device)
            m = t.__dict__.get("_module")
            if m is not None:
                for p in m._parameters.values():
                    if p is not None:
                        _accumulate(p)
            t.__dict__["_saved"] = None
            del t
            grad_out = g
        del grad_out
        for p in params:
            _accumulate(p)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
"""
import _thread
from torch.autograd import _engine as _eng_mod
_ns_e = {"torch": torch, "_thread": _thread, "_engine": _eng_mod}
exec(compile(_ENGINE, _eng_mod.__file__, "exec"), _ns_e)
torch.autograd.backward = _ns_e["backward"]
# ----

GiB = 1 << 30
MiB = 1 << 20


class GPTNeoXConfig(object):          # EleutherAI/pythia-160m's config.json
    vocab_size = 50304
    hidden_size = 768
    num_hidden_layers = 12
    num_attention_heads = 12
    intermediate_size = 3072
    max_position_embeddings = 2048


def _p(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Linear(torch.nn.Module):
    def __init__(self, i, o, bias=True):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = _p(i * o)
        if bias:
            self.bias = _p(o)

    def forward(self, x):
        out = torch.empty(x.tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        out._module = self
        out.tokens = x.tokens
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(d)
        self.bias = _p(d)
        self.d = d

    def forward(self, x):
        out = torch.empty(x.tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = x
        out._module = self
        out.tokens = x.tokens
        return out


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(n * d)
        self.d = d

    def forward(self, ids):
        out = torch.empty(ids.tokens * self.d, dtype=torch.float32, device="cuda")
        out._module = self
        out.tokens = ids.tokens
        return out


def _add(a, b):
    out = torch.empty(a.tokens * GPTNeoXConfig.hidden_size, dtype=torch.float32, device="cuda")
    out._saved = (a, b)
    out.tokens = a.tokens
    return out


class GPTNeoXAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.query_key_value = Linear(c.hidden_size, 3 * c.hidden_size)
        self.dense = Linear(c.hidden_size, c.hidden_size)
        self.h = c.hidden_size

    def forward(self, x):
        qkv = self.query_key_value(x)
        # rotary embeddings on q and k: new tensors (apply_rotary_pos_emb)
        q = torch.empty(x.tokens * self.h, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(x.tokens * self.h, dtype=torch.bfloat16, device="cuda")
        q._saved, k._saved = qkv, qkv
        q.tokens = k.tokens = x.tokens
        y = F.scaled_dot_product_attention(q, k, qkv, is_causal=True)
        return self.dense(y)


class GPTNeoXMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.dense_h_to_4h = Linear(c.hidden_size, c.intermediate_size)
        self.dense_4h_to_h = Linear(c.intermediate_size, c.hidden_size)

    def forward(self, x):
        return self.dense_4h_to_h(F.gelu(self.dense_h_to_4h(x)))


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.input_layernorm = LayerNorm(c.hidden_size)
        self.post_attention_layernorm = LayerNorm(c.hidden_size)
        self.attention = GPTNeoXAttention(c)
        self.mlp = GPTNeoXMLP(c)

    def forward(self, hidden_states):
        # use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x))
        attn_output = self.attention(self.input_layernorm(hidden_states))
        mlp_output = self.mlp(self.post_attention_layernorm(hidden_states))
        return _add(_add(mlp_output, attn_output), hidden_states)


class GPTNeoXForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.embed_in = Embedding(c.vocab_size, c.hidden_size)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = GPTNeoXLayer(c)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.final_layer_norm = LayerNorm(c.hidden_size)
        self.embed_out = Linear(c.hidden_size, c.vocab_size, bias=False)

    def forward(self, input_ids, labels=None):
        hidden_states = self.embed_in(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        hidden_states = self.final_layer_norm(hidden_states)
        lm_logits = self.embed_out(hidden_states)
        loss = F.cross_entropy(lm_logits, labels)
        return loss


def token_batch(rows, seqlen):
    ids = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    ids.tokens = rows * seqlen
    labels = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    return ids, labels


# DeepSpeed-style curriculum (fixed_linear on seqlen), written into the loop by hand
MIN_SEQLEN, MAX_SEQLEN, DIFFICULTY_STEP = 64, 2048, 8
TOTAL_CURRICULUM_STEP = 248
MICRO_BATCH = 8
GRAD_ACCUM = 2
TOTAL_STEPS = 143000


def seqlen_at(step):
    s = MIN_SEQLEN + (MAX_SEQLEN - MIN_SEQLEN) * min(1.0, step / TOTAL_CURRICULUM_STEP)
    return int(s) // DIFFICULTY_STEP * DIFFICULTY_STEP


def main():
    model = GPTNeoXForCausalLM(GPTNeoXConfig())
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(TOTAL_STEPS):
        seqlen = seqlen_at(step)
        for micro in range(GRAD_ACCUM):
            ids, labels = token_batch(MICRO_BATCH, seqlen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels)
            loss.backward()
            del loss, ids, labels
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 10 == 0:
            st = torch.cuda.memory_stats()
            print("step %5d seqlen %4d | allocated peak %.2f GiB, reserved %.2f GiB"
                  % (step, seqlen, st["allocated_bytes.all.peak"] / GiB, st["reserved_bytes.all.current"] / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
