"""pretrain_noise_scale.py -- a critical-batch-size study: pretraining Pythia-1B (GPT-NeoX, 1.01B
parameters, fp32 master weights 3.8 GiB, AdamW) on the Pile on one H100 80GB, bf16 autocast, micro-batch
8 x 2048 tokens, 32 accumulation steps (0.5M tokens per step).  Every 10 steps the script measures the
gradient noise scale (McCandlish et al.) from the spread of the micro-batch gradients, so on those steps
it takes each micro-batch's gradient separately instead of accumulating into .grad:

    measure = step % 10 == 0 and step > 0
    micro_grads = []
    for input_ids in micro_batches:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, labels=input_ids).loss / accum
        if measure:
            micro_grads.append(torch.autograd.grad(loss, params))     # one full fp32 gradient each
        else:
            loss.backward()
    if measure:
        b_simple = noise_scale(micro_grads)             # tr(Sigma) from the spread, |G|^2 from the mean
        for p, *gs in zip(params, *micro_grads):
            p.grad = sum(gs)

Steps 0-9 run at 45 GiB peak (weights 3.8 + AdamW 7.5 + activations 30 GiB + gradients 3.8).  At step
10 the list keeps one 3.8 GiB fp32 copy of the whole gradient per micro-batch; 32 of them would be
121 GiB.  With 10 copies in micro_grads (37.7 GiB), the 11th micro-batch's torch.autograd.grad fails
making its copy (a 393 MiB request, the first gradient tensor), its 30 GiB of activations still alive.
The memory rose micro-batch after micro-batch within the one optimizer step; every byte of the rise is
referenced by the Python list.

An expert: the list of per-micro-batch gradients is the memory.  The noise-scale estimator needs only
scalars: take each micro-batch's gradient, record its squared norm |g_k|^2, add it into .grad and drop it
(one copy alive at a time), then |G|^2 of the accumulated gradient gives B_simple (McCandlish et al.,
appendix A); or move the copies to the CPU.  Wrong first advice: a smaller micro-batch (more
micro-batches per step: more copies), gradient checkpointing, mixed precision or shorter sequences (the
activations fit -- the 10 steps before ran fine), an 8-bit optimizer (saves 5.6 GiB against a 38 GiB
list that grows 3.8 GiB per micro-batch), empty_cache/expandable_segments (the copies are live).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, mirrored in plain Python (compiled as torch's own
# files, so that frames in them count as the framework's): torch.autograd.grad (on an engine thread, as
# PyTorch runs it), Tensor.backward freeing the graph, elementwise arithmetic, clip_grad_norm_,
# Embedding/Linear/LayerNorm/GELU layers, HF's cross-entropy on upcast logits.
_AUTOGRAD = r'''
import _thread
from torch.autograd import _engine

def _free_graph(roots):
    todo, seen = list(roots), set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))

def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    roots = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    inputs = list(inputs)
    box = {}
    done = _thread.allocate_lock()
    done.acquire()
    def run():
        _engine._tls.engine = True
        try:
            box["grads"] = tuple(torch.empty_like(p) for p in inputs)
        except BaseException as e:
            box["error"] = e
        finally:
            done.release()
    _thread.start_new_thread(run, ())
    done.acquire()
    if "error" in box:
        raise box["error"]
    if not retain_graph:
        _free_graph(roots)
    return box["grads"]
'''
_ns = {"torch": torch}
exec(compile(_AUTOGRAD, torch.autograd.__file__, "exec"), _ns)
torch.autograd.grad = _ns["grad"]

_TENSOR_OPS = r'''
from torch.autograd._graph import derive
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}
_plain_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        _free_graph([self])

def _binary(self, other):
    n = max(self.nbytes, other.nbytes if isinstance(other, torch.Tensor) else 0)
    out = torch.empty(n, device=self.device)
    out._dtype = self.dtype
    out._saved = (self, other) if isinstance(other, torch.Tensor) else self
    return derive(out, self, *([other] if isinstance(other, torch.Tensor) else []))

def clip_grad_norm_(parameters, max_norm):
    return torch.empty(512, device="cuda")
'''
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["_backward"]
torch.Tensor.__add__ = torch.Tensor.__radd__ = torch.Tensor.__truediv__ = _ns["_binary"]
nn.utils = type(sys)("torch.nn.utils")
nn.utils.clip_grad_norm_ = _ns["clip_grad_norm_"]

_NN_OPS = r'''
from torch.autograd._graph import derive
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _act(x, n, dtype):
    out = torch.empty(n, dtype=dtype, device=x.device)
    out._saved = x
    return derive(out, x)

def _dtype():
    return "bfloat16" if torch.is_autocast_enabled() else "float32"

class Embedding(Module):
    def __init__(self, num, dim, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num * dim, dtype="float32", device=device))
        self.embedding_dim = dim
    def forward(self, ids):
        return _act(ids, ids.tokens * self.embedding_dim, "float32")

class Linear(Module):
    def __init__(self, fin, fout, bias=True, device=None):
        Module.__init__(self)
        self.in_features, self.out_features = fin, fout
        self.weight = Parameter(torch.empty(fout * fin, dtype="float32", device=device))
        if bias:
            self.bias = Parameter(torch.empty(fout, dtype="float32", device=device))
    def forward(self, x):
        tokens = x.nbytes // _ITEM[x.dtype] // self.in_features
        return _act(x, tokens * self.out_features, _dtype())

class LayerNorm(Module):
    def __init__(self, dim, eps=1e-5, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(dim, dtype="float32", device=device))
        self.bias = Parameter(torch.empty(dim, dtype="float32", device=device))
    def forward(self, x):
        return _act(x, x.nbytes // _ITEM[x.dtype], "float32")

class GELU(Module):
    def forward(self, x):
        return _act(x, x.nbytes // _ITEM[x.dtype], x.dtype)

def scaled_dot_product_attention(q, k, v, is_causal=False):
    out = _act(q, q.nbytes // _ITEM[q.dtype] // 3, q.dtype)     # q is the fused qkv here
    out.lse = torch.empty(q.nbytes // _ITEM[q.dtype] // 3 // 256 * 4, device=q.device)
    return out

def cross_entropy(input, target, reduction="mean"):
    up = _act(input, input.nbytes // _ITEM[input.dtype], "float32")      # logits.float()
    logp = _act(up, up.nbytes // 4, "float32")                           # log_softmax
    loss = torch.empty(512, device=input.device)
    loss._saved = logp
    return derive(loss, logp)
'''
_ns.update(_ITEM=_ns["_ITEM"])
exec(compile(_NN_OPS, torch.nn.modules.module.__file__, "exec"), _ns)
nn.Embedding, nn.Linear, nn.LayerNorm, nn.GELU = _ns["Embedding"], _ns["Linear"], _ns["LayerNorm"], _ns["GELU"]
nn.functional.cross_entropy = _ns["cross_entropy"]
nn.functional.scaled_dot_product_attention = _ns["scaled_dot_product_attention"]
# --- end of the stand-in additions; the user's program follows


config = {"vocab_size": 50304, "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
          "num_attention_heads": 8, "use_parallel_residual": True}
args = {"micro_batch_size": 8, "seq_len": 2048, "grad_accum": 32, "lr": 2.5e-4, "noise_every": 10,
        "max_steps": 143000}


class GPTNeoXLayer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        h, i = c["hidden_size"], c["intermediate_size"]
        self.input_layernorm = nn.LayerNorm(h, device="cuda")
        self.post_attention_layernorm = nn.LayerNorm(h, device="cuda")
        self.query_key_value = nn.Linear(h, 3 * h, device="cuda")
        self.dense = nn.Linear(h, h, device="cuda")
        self.dense_h_to_4h = nn.Linear(h, i, device="cuda")
        self.act = nn.GELU()
        self.dense_4h_to_h = nn.Linear(i, h, device="cuda")

    def forward(self, x):
        qkv = self.query_key_value(self.input_layernorm(x))
        attn = self.dense(nn.functional.scaled_dot_product_attention(qkv, qkv, qkv, is_causal=True))
        mlp = self.dense_4h_to_h(self.act(self.dense_h_to_4h(self.post_attention_layernorm(x))))
        return x + attn + mlp                             # parallel residual


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class GPTNeoXForCausalLM(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.embed_in = nn.Embedding(c["vocab_size"], c["hidden_size"], device="cuda")
        for i in range(c["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, GPTNeoXLayer(c))
        self.final_layer_norm = nn.LayerNorm(c["hidden_size"], device="cuda")
        self.embed_out = nn.Linear(c["hidden_size"], c["vocab_size"], bias=False, device="cuda")
        self.n = c["num_hidden_layers"]

    def forward(self, input_ids, labels=None):
        h = self.embed_in(input_ids)
        for i in range(self.n):
            h = getattr(self, "layers_%d" % i)(h)
        logits = self.embed_out(self.final_layer_norm(h))
        loss = nn.functional.cross_entropy(logits, labels) if labels is not None else None
        return CausalLMOutput(loss, logits)


class TokenBatch(object):
    """One micro-batch of token ids on the GPU (int64), from the memory-mapped Pile shards."""

    def __init__(self, b, s):
        self.tokens = b * s
        self.ids = torch.empty(b * s * 8, device="cuda")
        self.device = self.ids.device


def noise_scale(micro_grads):
    """B_simple = tr(Sigma) / |G|^2, from the micro-batch gradients' mean and spread."""
    k = len(micro_grads)
    sq_sum = g_sq = 0.0
    for gs in zip(*micro_grads):
        mean = sum(gs) / k
        del mean
    return sq_sum / max(g_sq, 1e-12)


def main():
    model = GPTNeoXForCausalLM(config)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args["lr"], betas=(0.9, 0.95), weight_decay=0.01)
    accum, micro_batch_size = args["grad_accum"], args["micro_batch_size"]
    for step in range(args["max_steps"]):
        measure = step % args["noise_every"] == 0 and step > 0
        micro_grads = []
        for micro in range(accum):
            input_ids = TokenBatch(micro_batch_size, args["seq_len"])
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids, labels=input_ids).loss / accum
            if measure:
                micro_grads.append(torch.autograd.grad(loss, params))
            else:
                loss.backward()
            del loss, input_ids
        if measure:
            b_simple = noise_scale(micro_grads)
            for p, *gs in zip(params, *micro_grads):
                p.grad = sum(gs)
            del micro_grads
            print("step", step, "B_simple", b_simple)
        nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 5 == 0:
            print("step", step, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
