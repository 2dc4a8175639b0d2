"""train.py (nanoGPT) -- pretraining a GPT-2 medium-sized model (24 layers, d=1024, 355M parameters) from
scratch on OpenWebText on one RTX 3090 (24 GB): float32 weights, bf16 autocast, AdamW, batch_size 8 x
block_size 1024, gradient_accumulation_steps 1.  The run went to NaN twice near iteration 30k after a few loss
spikes.  To hunt it, the engineer (1) turned on anomaly detection and (2) added a residual-stream monitor in the
spirit of the "massive activations" papers: a forward hook on every transformer block that accumulates the
mean square of its output, logged as per-layer RMS to W&B every log_interval (100) iterations, then reset.
torch.compile was switched off (the hooks broke its graphs).

    torch.autograd.set_detect_anomaly(True)

    class ResidualMonitor:
        def __init__(self, model):
            self.sums, self.count = {}, 0
            for i, block in enumerate(model.transformer.h):
                block.register_forward_hook(self._hook(f"h.{i}"))

        def _hook(self, name):
            def hook(module, inputs, output):
                sq = output.float().pow(2).mean(dim=(0, 1))          # per-channel mean square, [1024]
                self.sums[name] = self.sums[name] + sq if name in self.sums else sq
            return hook

        def log_and_reset(self, it):
            wandb.log({f"rms/{k}": (v / self.count).sqrt().max().item() for k, v in self.sums.items()}, step=it)
            self.sums, self.count = {}, 0

Without the monitor every iteration peaks at 17.5 GiB allocated and comes back to 3.96 GiB (weights and AdamW
state).  With it, what stays allocated between iterations climbs by 768 MiB every iteration (4.71, 5.46, ...
9.96 GiB), and iteration 8 dies in its backward pass ("Tried to allocate 16.00 MiB ... 2.00 MiB is free"), long
before the first log at iteration 100.  `sq` is computed from `output`, which requires grad, so it carries an
autograd graph: pow() saves its input, the block's whole output ([8, 1024, 1024] float32, 32 MiB), and each
running sum chains the graphs of every iteration since the last reset.  loss.backward() frees only the graph
it runs through; the monitor's graph is never backpropagated, so each of the 24 hooks keeps one block output
alive per iteration: 24 x 32 MiB = 768 MiB a step.

An expert: the monitor keeps tensors alive across iterations: compute the statistic outside autograd
(`output.detach()`, or the hook body under torch.no_grad()), or keep a plain float (`.item()` once per log);
then the run is back to its flat 17.5 GiB peak.  Anomaly detection is not the memory (it records forward
tracebacks in host memory and makes every step slower: switch it off once the NaN is found, but it is not the
fix).
Wrong advice: a smaller batch or gradient accumulation (would only delay the failure by a few iterations),
gradient checkpointing (the monitor's graphs are not activations it recomputes), expandable_segments /
empty_cache (live tensors, not cache), 8-bit AdamW, mixed precision changes, a bigger GPU (80 GB dies near
iteration 80 instead of 8).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: Module.register_forward_hook, nn.Linear / nn.Embedding / nn.LayerNorm, Tensor.float /
# pow / mean / sqrt / __add__, and torch.autograd.set_detect_anomaly (torch.nn and C++ in PyTorch).  Compiled as
# part of torch's files so that the failing line stays the program's own.
_MODULE_GAPS = """
class RemovableHandle(object):
    def __init__(self, hooks, key):
        self.hooks_dict_ref, self.id = hooks, key

    def remove(self):
        self.hooks_dict_ref.pop(self.id, None)


def register_forward_hook(self, hook):
    hooks = self.__dict__.get("_forward_hooks")
    if hooks is None:
        hooks = collections.OrderedDict()
        object.__setattr__(self, "_forward_hooks", hooks)
    key = len(hooks) + 1
    hooks[key] = hook
    return RemovableHandle(hooks, key)


def _call_impl(self, *args, **kwargs):
    _graph.begin_forward()
    result = None
    try:
        result = self.forward(*args, **kwargs)
    finally:
        _graph.end_forward(self, args, kwargs, result)
    for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
        hook_result = hook(self, args, result)
        if hook_result is not None:
            result = hook_result
    return result


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


class LayerNorm(Module):
    def __init__(self, normalized_shape, bias=True, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(normalized_shape, dtype=torch.float32, device=device))
        self.bias = Parameter(torch.empty(normalized_shape, dtype=torch.float32, device=device)) if bias else None

    def forward(self, input):
        out = torch.empty(input.nbytes // torch._ITEMSIZE[input.dtype], dtype=torch.float32, device=input.device)
        out._saved = input
        return torch._derive(out, input, self.weight)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device=None):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32, device=device))

    def forward(self, idx, ntokens):
        out = torch.empty(ntokens * self.embedding_dim, dtype=torch.float32, device=self.weight.device)
        return torch._derive(out, self.weight)
"""
import collections  # noqa: E402

import torch.nn.modules.module as _mm  # noqa: E402
from torch.autograd import _graph as _autograd_graph  # noqa: E402

_ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter, "collections": collections,
       "_graph": _autograd_graph}
exec(compile(_MODULE_GAPS, _mm.__file__, "exec"), _ns)
if not hasattr(torch.nn.Module, "register_forward_hook"):
    torch.nn.Module.register_forward_hook = _ns["register_forward_hook"]
    torch.nn.Module._call_impl = _ns["_call_impl"]
for _name in ("Linear", "LayerNorm", "Embedding"):
    if not hasattr(torch.nn, _name):
        setattr(torch.nn, _name, _ns[_name])

_TENSOR_GAPS = """
def float(self):
    if self.dtype == "float32":
        return self
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=float32, device=self.device)
    out._saved = self                                  # (the stand-in's link to the input's node)
    return _derive(out, self)

def pow(self, exponent):
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = self                                  # PowBackward0 saves self
    return _derive(out, self)

def mean(self, dim=None, keepdim=False, width=1):
    out = empty(width, dtype=self.dtype, device=self.device)
    # MeanBackward1 saves only the shape; its next function is the input's node, which keeps what *it* saved
    out._saved = self._saved
    return _derive(out, self)

def sqrt(self):
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = self
    return _derive(out, self)

def __add__(self, other):
    out = empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device=self.device)
    out._saved = (self, other)                         # AddBackward0 saves nothing, but links both graphs
    return _derive(out, self, other)

def item(self):
    return 0.0

def _free_graph(root):
    # what the autograd engine does after loss.backward() (retain_graph=False): every node it ran through
    # frees the tensors it saved; nodes outside that graph (never backpropagated) keep theirs
    todo, seen = [root], set()
    while todo:
        t = todo.pop()
        if id(t) in seen or not isinstance(t, Tensor):
            continue
        seen.add(id(t))
        v = t.__dict__.get("_saved")
        t._saved = None
        if isinstance(v, (tuple, list)):
            todo.extend(v)
        elif v is not None:
            todo.append(v)

def set_detect_anomaly(mode, check_nan=True):
    # torch.autograd.set_detect_anomaly: every autograd node records the Python traceback of the forward
    # that made it (host memory), and backward checks each gradient for NaN
    _anomaly[0] = bool(mode)
"""
_ns = dict(vars(torch))
_ns["_anomaly"] = [False]
exec(compile(_TENSOR_GAPS, torch.__file__, "exec"), _ns)
for _name in ("float", "pow", "mean", "sqrt", "__add__", "item"):
    if not hasattr(torch.Tensor, _name):
        setattr(torch.Tensor, _name, _ns[_name])
_free_graph = _ns["_free_graph"]
if not hasattr(torch.autograd, "set_detect_anomaly"):
    torch.autograd.set_detect_anomaly = _ns["set_detect_anomaly"]


class wandb(object):
    """Weights & Biases, as far as this script uses it (host side only)."""
    @staticmethod
    def init(project=None, config=None):
        print("wandb: run initialised, project %s" % project)

    @staticmethod
    def log(d, step=None):
        print("wandb: step %d, %d keys" % (step, len(d)))
# ----

GiB = 1 << 30


# ---------------------------------------------------------------- model.py (nanoGPT, as far as memory goes)
class GPTConfig(object):
    block_size = 1024
    vocab_size = 50304
    n_layer = 24
    n_head = 16
    n_embd = 1024
    dropout = 0.0
    bias = False


class CausalSelfAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.c_attn = torch.nn.Linear(c.n_embd, 3 * c.n_embd, bias=c.bias, device="cuda")
        self.c_proj = torch.nn.Linear(c.n_embd, c.n_embd, bias=c.bias, device="cuda")

    def forward(self, x):
        qkv = self.c_attn(x)
        # torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True): flash, O(T) memory
        y = torch.empty(qkv.nbytes // 2 // 3, dtype=torch.bfloat16, device="cuda")
        y._saved = qkv
        y = torch._derive(y, qkv)
        return self.c_proj(y)


class MLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.c_fc = torch.nn.Linear(c.n_embd, 4 * c.n_embd, bias=c.bias, device="cuda")
        self.c_proj = torch.nn.Linear(4 * c.n_embd, c.n_embd, bias=c.bias, device="cuda")

    def forward(self, x):
        h = self.c_fc(x)
        g = torch.empty(h.nbytes // 2, dtype=torch.bfloat16, device="cuda")      # self.gelu(h)
        g._saved = h
        return self.c_proj(torch._derive(g, h))


class Block(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.ln_1 = torch.nn.LayerNorm(c.n_embd, bias=c.bias, device="cuda")
        self.attn = CausalSelfAttention(c)
        self.ln_2 = torch.nn.LayerNorm(c.n_embd, bias=c.bias, device="cuda")
        self.mlp = MLP(c)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))            # float32 residual stream (autocast leaves the add alone)
        x = x + self.mlp(self.ln_2(x))
        return x


class GPT(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.wte = torch.nn.Embedding(c.vocab_size, c.n_embd, device="cuda")
        self.wpe = torch.nn.Embedding(c.block_size, c.n_embd, device="cuda")
        self.h = [Block(c) for _ in range(c.n_layer)]
        for i, b in enumerate(self.h):
            setattr(self, "h_%d" % i, b)
        self.ln_f = torch.nn.LayerNorm(c.n_embd, bias=c.bias, device="cuda")
        self.lm_head = torch.nn.Linear(c.n_embd, 1, bias=False, device="cuda")
        self.lm_head.out_features = c.vocab_size
        self.lm_head.weight = self.wte.weight          # weight tying
        self.transformer = self

    def forward(self, idx, targets, ntokens):
        tok_emb = self.wte(idx, ntokens)
        x = tok_emb + self.wpe(idx, ntokens)
        for block in self.h:
            x = block(x)
        x = self.ln_f(x)
        logits = self.lm_head(x)
        loss = torch.nn.functional.cross_entropy(logits.float(), targets)
        return logits, loss


# ---------------------------------------------------------------- train.py (nanoGPT, with the NaN hunt)
batch_size = 8
block_size = 1024
gradient_accumulation_steps = 1
learning_rate = 3e-4
max_iters = 600000
log_interval = 100
compile = False          # the monitor's hooks graph-break under torch.compile


class ResidualMonitor(object):
    """Per-layer RMS of the residual stream, logged every log_interval iterations (NaN hunt)."""

    def __init__(self, model):
        self.sums, self.count = {}, 0
        for i, block in enumerate(model.transformer.h):
            block.register_forward_hook(self._hook("h.%d" % i))

    def _hook(self, name):
        def hook(module, inputs, output):
            sq = output.float().pow(2).mean(dim=(0, 1), width=1024)     # per-channel mean square, [1024]
            self.sums[name] = self.sums[name] + sq if name in self.sums else sq
        return hook

    def log_and_reset(self, it):
        wandb.log(dict(("rms/%s" % k, (v / self.count).sqrt().item()) for k, v in self.sums.items()), step=it)
        self.sums, self.count = {}, 0


def main():
    torch.autograd.set_detect_anomaly(True)
    wandb.init(project="owt-gpt2-medium", config={"batch_size": batch_size, "block_size": block_size})
    model = GPT(GPTConfig())
    model.train()
    nparams = sum(p.nbytes for p in model.parameters()) // 4
    print("number of parameters: %.2fM" % (nparams / 1e6))
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.1)
    monitor = ResidualMonitor(model)

    ntokens = batch_size * block_size
    for iter_num in range(max_iters):
        X = torch.empty(ntokens * 8, device="cuda")       # get_batch('train'): int64 [8, 1024]
        Y = torch.empty(ntokens * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits, loss = model(X, Y, ntokens)
        monitor.count += 1
        loss.backward()
        _free_graph(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        if iter_num % log_interval == 0 and iter_num > 0:
            monitor.log_and_reset(iter_num)
        print("iter %d: allocated %.2f GiB" % (iter_num, torch.cuda.memory_allocated() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
