r"""TTS fine-tuning: Parler-TTS Large v1 fully fine-tuned on one RTX 4090 (24 GB) with bf16 autocast and gradient
checkpointing on, but float32 weights and AdamW: eight micro-batches run, the first optimizer step's AdamW state
(12.8 GiB) does not fit.

The real code: parler-tts, `accelerate launch ./training/run_parler_tts_training.py
./helpers/training_configs/finetune_large_expresso.json` -- the repo's starting config with model_name_or_path
changed to parler-tts/parler-tts-large-v1: per_device_train_batch_size 2, gradient_accumulation_steps 8,
gradient_checkpointing true, freeze_text_encoder true, dtype bfloat16 (autocast; the weights stay float32 as
from_pretrained loads them), AdamW lr 8e-5, max_duration_in_seconds 30.  The loop:

    with accelerator.accumulate(model):
        with accelerator.autocast():
            outputs = model(**batch)
        accelerator.backward(outputs.loss)
        if accelerator.sync_gradients:
            accelerator.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()                # AcceleratedOptimizer: a real step on every 8th micro-batch
        optimizer.zero_grad()

What happens: the decoder (24 layers, d_model 2048, FFN 8192, nine codebook embeddings and heads), the prompt
embedding and the encoder projection are 1.72 B trainable parameters, 6.40 GiB in float32; the frozen
Flan-T5-large encoder (0.34 B) and DAC (0.08 B) 1.56 GiB: 7.96 GiB of weights.  With checkpointing the forward
keeps ~1.1 GiB (each layer's input, the nine heads' logits); backward adds 6.40 GiB of gradients: 14.7 GiB
allocated after each backward, 16 GiB at most, and the eight micro-batches pass.  Then the first real step: AdamW
makes exp_avg and exp_avg_sq for every trainable parameter, 2 x 6.40 = 12.8 GiB more, 27.5 GiB in all on a
23.99 GiB card with a 0.5 GiB context.  It fails part way through, after 8.5 GiB of state, asking 16 MiB (the
state of a 2048 x 2048 projection) with 12 MiB free.

What an expert says first: the optimizer state is what does not fit: an 8-bit AdamW (bitsandbytes AdamW8bit:
12.8 -> 3.2 GiB, ~18 GiB in all) or LoRA on the decoder (or Adafactor, or DeepSpeed ZeRO-Offload of the
optimizer to host memory).  Wrong advice: a smaller batch, shorter clips, gradient checkpointing, mixed precision
(applied already, or irrelevant: the activations are ~1 GiB and freed before the step), empty_cache /
expandable_segments (0.3 GiB cached), inference_mode (it trains).
"""
import contextlib
import functools
import random
import sys

import torch
import scen_truth

# ---------------------------------------------------------------------------------------------------
# Stand-in section (not the user's code): the stand-in torch (tests/adapter/fake_torch) keeps only
# memory -- a tensor is so many bytes of device memory.  This adds shapes and the operators and layers
# this program calls (nn.Linear, matmul, softmax, ...), each making the tensors PyTorch's would and
# keeping for backward what PyTorch's autograd keeps.  It is compiled as torch's own code, as PyTorch's
# operators are not the program's: a failing allocation's Python line stays the program's.
# ---------------------------------------------------------------------------------------------------
_TORCH_EXTRAS = r'''
import sys, threading, types
import torch
from torch.autograd import _graph
from torch.nn.parameter import Parameter
from torch.nn.modules.module import Module

_IT = torch._ITEMSIZE
_fast = threading.local()


def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _shape_of(t):
    s = t.__dict__.get("_shape")
    if s is None and t._base is not None:
        return _shape_of(t._base)
    return s if s is not None else (t.nbytes // _IT[t.dtype],)


torch.Tensor.shape = property(_shape_of)
torch.Tensor.size = lambda self, d=None: self.shape if d is None else self.shape[d]
torch.Tensor.dim = lambda self: len(self.shape)
torch.Tensor.numel = lambda self: _numel(self.shape)
torch.Tensor.element_size = lambda self: _IT[self.dtype]


class _HostTensor(object):
    """A tensor in host memory (a DataLoader's batch, audio read from disk): no device memory."""
    is_cuda = False
    device = "cpu"

    def __init__(self, shape, dtype=None):
        self.shape, self.dtype = tuple(int(s) for s in shape), dtype or torch.get_default_dtype()
        self.nbytes = _numel(self.shape) * _IT[self.dtype]

    def size(self, d=None):
        return self.shape if d is None else self.shape[d]

    def dim(self):
        return len(self.shape)

    def numel(self):
        return _numel(self.shape)

    def float(self):
        return _HostTensor(self.shape, "float32")

    def pin_memory(self):
        return self

    def cuda(self, device=None, non_blocking=False):
        return self.to("cuda" if device is None else device)

    def to(self, *args, **kw):
        dev, dtype = _to_args(args, kw)
        if dev is None or dev == "cpu":
            return _HostTensor(self.shape, dtype or self.dtype)
        return _new(self.shape, dtype=dtype or self.dtype, device=dev)

    def view(self, *shape):
        return _HostTensor(_resolve(shape, self.shape), self.dtype)

    reshape = view


def _to_args(args, kw):
    dev, dtype = kw.get("device"), kw.get("dtype")
    for a in args:
        if isinstance(a, str) and a in _IT:
            dtype = a
        elif a is not None and not isinstance(a, bool):
            dev = a
    return dev, dtype


def _new(shape, like=None, dtype=None, device=None, saved=None, inputs=()):
    if dtype is None:
        dtype = like.dtype if like is not None else torch.get_default_dtype()
    if device is None and like is not None:
        device = like.device
    t = torch.empty(_numel(shape), dtype=dtype, device=device)
    t._shape = tuple(int(s) for s in shape)
    if saved is not None:
        t._saved = saved
    ins = [i for i in inputs if isinstance(i, torch.Tensor)]
    if ins:
        _graph.derive(t, *ins)
    return t


def _tracked(inputs):
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and (t._params or t.requires_grad)
                                           for t in inputs)


def _graph_of(t):
    """What t's node keeps for backward (its saved tensors), reached from the nodes made from t."""
    if not t._params:
        return None                      # no graph: a leaf, a detached tensor, one made without autograd
    while t.__dict__.get("_saved") is None and t._base is not None:
        t = t._base
    return t.__dict__.get("_saved")


def _save(inputs, saved=()):
    """What autograd keeps for an operation on `inputs`: the tensors it saves, and the graph behind
    the inputs it does not save; nothing when no input requires grad (no_grad, inference)."""
    if not _tracked(inputs):
        return None
    keep = [t for t in saved if isinstance(t, torch.Tensor)]
    for t in inputs:
        if isinstance(t, torch.Tensor) and all(t is not k for k in keep):
            g = _graph_of(t)
            if g is not None:
                keep.append(g)
    return tuple(keep)


def _out_dtype(x):
    fd = getattr(_fast, "dtype", None)
    if fd and torch.is_autocast_enabled():
        return fd
    return x.dtype


def zeros(*size, dtype=None, device=None, requires_grad=False):
    if len(size) == 1 and isinstance(size[0], (tuple, list)):
        size = tuple(size[0])
    if device == "cpu":
        return _HostTensor(size, dtype)
    t = _new(size, dtype=dtype, device=device)
    t.requires_grad = bool(requires_grad)
    return t


ones = randn = rand = zeros


def _resolve(shape, old):
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    if not shape:
        return tuple(old)
    shape = [int(s) for s in shape]
    if -1 in shape:
        i = shape.index(-1)
        rest = _numel([s for j, s in enumerate(shape) if j != i])
        shape[i] = _numel(old) // max(rest, 1)
    return tuple(shape)


_plain_view = torch.Tensor.view


def _as_view(t, shape, contiguous=True):
    v = _plain_view(t)
    v._shape = tuple(shape)
    v._noncontig = not contiguous or t.__dict__.get("_noncontig", False)
    if t.__dict__.get("_params"):
        v._params = t._params
    return v


def view(self, *shape):
    return _as_view(self, _resolve(shape, self.shape))


def reshape(self, *shape):
    new = _resolve(shape, self.shape)
    if self.__dict__.get("_noncontig"):
        return _new(new, like=self, saved=_save((self,)), inputs=(self,))
    return _as_view(self, new)


def _reshape_fn(input, shape):
    return input.reshape(*shape)


def contiguous(self, memory_format=None):
    if self.__dict__.get("_noncontig"):
        return _new(self.shape, like=self, saved=_save((self,)), inputs=(self,))
    return self


def transpose(self, d0, d1):
    s = list(self.shape)
    s[d0], s[d1] = s[d1], s[d0]
    return _as_view(self, s, contiguous=False)


def permute(self, *dims):
    if len(dims) == 1 and isinstance(dims[0], (tuple, list)):
        dims = tuple(dims[0])
    return _as_view(self, [self.shape[d] for d in dims], contiguous=False)


def unfold(self, dimension, size, step):
    s = list(self.shape)
    d = dimension % len(s)
    s[d] = (s[d] - size) // step + 1
    return _as_view(self, s + [size], contiguous=False)


def unsqueeze(self, d):
    s = list(self.shape)
    s.insert(d % (len(s) + 1), 1)
    return _as_view(self, s)


def expand(self, *sizes):
    if len(sizes) == 1 and isinstance(sizes[0], (tuple, list)):
        sizes = tuple(sizes[0])
    old = (1,) * (len(sizes) - len(self.shape)) + tuple(self.shape)
    return _as_view(self, [o if n == -1 else n for o, n in zip(old, sizes)], contiguous=False)


def flatten(self, start_dim=0, end_dim=-1):
    s = list(self.shape)
    e = end_dim % len(s)
    new = s[:start_dim] + [_numel(s[start_dim:e + 1])] + s[e + 1:]
    return reshape(self, *new)


def __getitem__(self, idx):
    if not isinstance(idx, tuple):
        idx = (idx,)
    s, out, d = list(self.shape), [], 0
    for i in idx:
        if i is Ellipsis:
            skip = len(s) - (len(idx) - 1)
            out.extend(s[d:d + skip])
            d += skip
        elif isinstance(i, slice):
            out.append(len(range(*i.indices(s[d]))))
            d += 1
        else:
            d += 1
    out.extend(s[d:])
    return _as_view(self, out, contiguous=False)


def to(self, *args, **kw):
    dev, dtype = _to_args(args, kw)
    if dev == "cpu":
        return _HostTensor(self.shape, dtype or self.dtype)
    if dtype is not None and dtype != self.dtype:
        return _new(self.shape, like=self, dtype=dtype, saved=_save((self,)), inputs=(self,))
    return self


def cpu(self):
    return _HostTensor(self.shape, self.dtype)


def clone(self, memory_format=None):
    return _new(self.shape, like=self, saved=_save((self,)), inputs=(self,))


def _deepcopy(self, memo):
    if id(self) in memo:
        return memo[id(self)]
    new = _new(self.shape, like=self)
    new.requires_grad = self.requires_grad
    memo[id(self)] = new
    return new


def item(self):
    return 0.0


def _unary(x, saves=True, dtype=None):
    return _new(x.shape, like=x, dtype=dtype, saved=_save((x,), (x,) if saves else ()), inputs=(x,))


def _bshape(a, b):
    sa = tuple(a.shape) if isinstance(a, torch.Tensor) else ()
    sb = tuple(b.shape) if isinstance(b, torch.Tensor) else ()
    return _broadcast(sa, sb)


def _broadcast(sa, sb):
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + sa, (1,) * (n - len(sb)) + sb
    return tuple(max(x, y) for x, y in zip(sa, sb))


def _binary(a, b, saves):
    like = a if isinstance(a, torch.Tensor) else b
    both = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    saved = (a, b) if (saves and both) else ()
    return _new(_bshape(a, b), like=like, saved=_save((a, b), saved), inputs=(a, b))


torch.Tensor.__add__ = torch.Tensor.__radd__ = lambda a, b: _binary(a, b, False)
torch.Tensor.__sub__ = torch.Tensor.__rsub__ = lambda a, b: _binary(a, b, False)
torch.Tensor.__mul__ = torch.Tensor.__rmul__ = lambda a, b: _binary(a, b, True)
torch.Tensor.__truediv__ = lambda a, b: _binary(a, b, True)
torch.Tensor.__neg__ = lambda a: _binary(a, -1, False)
torch.Tensor.__pow__ = lambda a, p: _unary(a)
torch.Tensor.pow = lambda a, p: _unary(a)
torch.Tensor.reciprocal = lambda a: _unary(a)
torch.Tensor.abs = lambda a: _unary(a)
torch.Tensor.sqrt = lambda a: _unary(a)
for _n, _f in dict(view=view, reshape=reshape, contiguous=contiguous, transpose=transpose, permute=permute,
                   unfold=unfold, unsqueeze=unsqueeze, flatten=flatten, to=to, cpu=cpu, item=item,
                   __getitem__=__getitem__, expand=expand, clone=clone, __deepcopy__=_deepcopy).items():
    setattr(torch.Tensor, _n, _f)
torch.Tensor.float = lambda self: to(self, "float32")
torch.Tensor.half = lambda self: to(self, "float16")
torch.Tensor.cuda = lambda self, device=None, non_blocking=False: self


def _reduce(x, dim=None, keepdim=False):
    if dim is None:
        shape = ()
    else:
        s = list(x.shape)
        dims = sorted(d % len(s) for d in (dim if isinstance(dim, (tuple, list)) else (dim,)))
        shape = [1 if i in dims else n for i, n in enumerate(s) if keepdim or i not in dims]
    return _new(shape, like=x, saved=_save((x,), (x,)), inputs=(x,))


torch.Tensor.mean = lambda self, dim=None, keepdim=False: _reduce(self, dim, keepdim)
torch.Tensor.sum = lambda self, dim=None, keepdim=False: _reduce(self, dim, keepdim)
torch.Tensor.std = lambda self, dim=None, keepdim=False, unbiased=True: _reduce(self, dim, keepdim)
torch.Tensor.var = torch.Tensor.std


def matmul(a, b):
    sa, sb = tuple(a.shape), tuple(b.shape)
    batch = _broadcast(sa[:-2], sb[:-2])
    out = batch + (sa[-2] if len(sa) > 1 else 1, sb[-1])
    dt = _out_dtype(a)
    return _new(out, like=a, dtype=dt, saved=_save((a, b), (a, b)), inputs=(a, b))


torch.Tensor.__matmul__ = matmul


def softmax(x, dim=-1, dtype=None):
    return _new(x.shape, like=x, dtype=dtype, saved=_save((x,)), inputs=(x,))


def log_softmax(x, dim=-1, dtype=None):
    return softmax(x, dim, dtype)


def sigmoid(x):
    return _unary(x)


tanh = sin = cos = exp = sigmoid


def relu(x, inplace=False):
    return _unary(x)


gelu = silu = relu


def glu(x, dim=-1):
    s = list(x.shape)
    s[dim] //= 2
    return _new(s, like=x, saved=_save((x,), (x,)), inputs=(x,))


def dropout(x, p=0.5, training=True, inplace=False):
    if not training or p == 0:
        return x
    mask = _new(x.shape, like=x, dtype="uint8") if _tracked((x,)) else None
    out = _new(x.shape, like=x, saved=_save((x,), (mask,) if mask is not None else ()), inputs=(x,))
    return out


def cat(tensors, dim=0):
    tensors = list(tensors)
    s = list(tensors[0].shape)
    d = dim % len(s)
    s[d] = sum(t.shape[d] for t in tensors)
    return _new(s, like=tensors[0], saved=_save(tuple(tensors)), inputs=tuple(tensors))


def stack(tensors, dim=0):
    tensors = list(tensors)
    s = list(tensors[0].shape)
    s.insert(dim % (len(s) + 1), len(tensors))
    return _new(s, like=tensors[0], saved=_save(tuple(tensors)), inputs=tuple(tensors))


def pad(x, pad, mode="constant", value=0.0):
    s = list(x.shape)
    s[-1] += sum(pad[:2])
    if len(pad) >= 4:
        s[-2] += sum(pad[2:4])
    return _new(s, like=x, saved=_save((x,)), inputs=(x,))


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    k = weight.shape[-1]
    n = (input.shape[-1] + 2 * padding - dilation * (k - 1) - 1) // stride + 1
    s = tuple(input.shape[:-2]) + (weight.shape[0], n)
    return _new(s, like=input, dtype=_out_dtype(input), saved=_save((input, weight), (input, weight)),
                inputs=(input, weight))


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    """The flash / memory-efficient kernel: no (L x S) score matrix; autograd keeps q, k, v, the output
    and the log-sum-exp."""
    s = tuple(query.shape[:-1]) + (value.shape[-1],)
    return _new(s, like=query, dtype=_out_dtype(query), saved=_save((query, key, value), (query, key, value)),
                inputs=(query, key, value))


def mse_loss(input, target, reduction="mean"):
    diff = _new(input.shape, like=input, saved=_save((input, target)), inputs=(input, target))
    return _new((), like=input, saved=_save((diff,), (diff,)), inputs=(diff,))


def cross_entropy(input, target, ignore_index=-100, reduction="mean"):
    lsm = _new(input.shape, like=input, dtype="float32", saved=_save((input,)), inputs=(input,))
    return _new((), like=input, dtype="float32", saved=_save((lsm,), (lsm,)), inputs=(lsm,))


def argmax(x, dim=-1):
    s = list(x.shape)
    del s[dim % len(s)]
    return _new(s, like=x, dtype="float64")     # int64 indices: 8 bytes each


def multinomial(probs, num_samples=1):
    return _new(tuple(probs.shape[:-1]) + (num_samples,), like=probs, dtype="float64")


# -- nn layers (weights made on the current GPU, as model.to("cuda") leaves them) ----------------------
def _param(shape, dtype=None, requires_grad=True):
    return Parameter(_new(shape, dtype=dtype), requires_grad)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = _param((out_features, in_features), dtype)
        self.bias = _param((out_features,), dtype) if bias else None

    def forward(self, input):
        s = tuple(input.shape[:-1]) + (self.out_features,)
        return _new(s, like=input, dtype=_out_dtype(input), saved=_save((input, self.weight), (input,)),
                    inputs=(input,))


class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, dtype=None):
        Module.__init__(self)
        self.weight = _param((normalized_shape,), dtype)
        self.bias = _param((normalized_shape,), dtype)

    def forward(self, input):
        return _new(input.shape, like=input, saved=_save((input, self.weight), (input,)), inputs=(input,))


class BatchNorm1d(LayerNorm):
    pass


class Dropout(Module):
    def __init__(self, p=0.5, inplace=False):
        Module.__init__(self)
        self.p = p

    def forward(self, input):
        return dropout(input, self.p, self.training)


class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)

    def forward(self, input):
        return relu(input)


class GELU(ReLU):
    def forward(self, input):
        return gelu(input)


class GLU(Module):
    def __init__(self, dim=-1):
        Module.__init__(self)
        self.dim = dim

    def forward(self, input):
        return glu(input, self.dim)


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, padding_idx=None, dtype=None):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = _param((num_embeddings, embedding_dim), dtype)

    def forward(self, input):
        return _new(tuple(input.shape) + (self.embedding_dim,), like=self.weight,
                    saved=_save((self.weight,), (input,)), inputs=(self.weight,))


class Conv1d(Module):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, dtype=None):
        Module.__init__(self)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding, self.dilation = kernel_size, stride, padding, dilation
        self.weight = _param((out_channels, in_channels // groups, kernel_size), dtype)
        self.bias = _param((out_channels,), dtype) if bias else None

    def _length(self, n):
        return (n + 2 * self.padding - self.dilation * (self.kernel_size - 1) - 1) // self.stride + 1

    def forward(self, input):
        s = tuple(input.shape[:-2]) + (self.out_channels, self._length(input.shape[-1]))
        return _new(s, like=input, dtype=_out_dtype(input), saved=_save((input, self.weight), (input,)),
                    inputs=(input,))


class ConvTranspose1d(Conv1d):
    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, dtype=None):
        Conv1d.__init__(self, out_channels, in_channels, kernel_size, stride, padding, dilation, groups, bias, dtype)
        self.in_channels, self.out_channels = in_channels, out_channels

    def _length(self, n):
        return (n - 1) * self.stride - 2 * self.padding + self.dilation * (self.kernel_size - 1) + 1


class LSTM(Module):
    """cuDNN's LSTM: per layer the output sequence; with autograd its reserve space (the gates of every
    step, 4 x hidden per step and direction) is kept for backward, without it a workspace of that size
    lives while the layer runs."""

    def __init__(self, input_size, hidden_size, num_layers=1, bias=True, batch_first=False, dropout=0.0,
                 bidirectional=False, dtype=None):
        Module.__init__(self)
        self.hidden_size, self.num_layers, self.batch_first = hidden_size, num_layers, batch_first
        self.dirs = 2 if bidirectional else 1
        for layer in range(num_layers):
            n_in = input_size if layer == 0 else hidden_size * self.dirs
            for suffix in ([""] if self.dirs == 1 else ["", "_reverse"]):
                setattr(self, "weight_ih_l%d%s" % (layer, suffix), _param((4 * hidden_size, n_in), dtype))
                setattr(self, "weight_hh_l%d%s" % (layer, suffix), _param((4 * hidden_size, hidden_size), dtype))
                setattr(self, "bias_ih_l%d%s" % (layer, suffix), _param((4 * hidden_size,), dtype))
                setattr(self, "bias_hh_l%d%s" % (layer, suffix), _param((4 * hidden_size,), dtype))

    def forward(self, input, hx=None):
        b, t = (input.shape[0], input.shape[1]) if self.batch_first else (input.shape[1], input.shape[0])
        x = input
        weights = [p for p in self._parameters.values()]
        for layer in range(self.num_layers):
            gates = _new((b, t, 4 * self.hidden_size * self.dirs), like=x, dtype=_out_dtype(x))
            s = (b, t, self.hidden_size * self.dirs) if self.batch_first else (t, b, self.hidden_size * self.dirs)
            keep = _save((x,) + tuple(weights), (x, gates))
            x = _new(s, like=x, dtype=_out_dtype(x), saved=keep, inputs=(x,))
            del gates
        h = _new((self.num_layers * self.dirs, b, self.hidden_size), like=x)
        c = _new((self.num_layers * self.dirs, b, self.hidden_size), like=x)
        return x, (h, c)


class Sequential(Module):
    def __init__(self, *mods):
        Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class ModuleList(Module):
    def __init__(self, mods=()):
        Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def append(self, m):
        self._modules[str(len(self._modules))] = m

    def insert(self, index, m):
        mods = list(self._modules.values())
        mods.insert(index, m)
        self._modules.clear()
        for i, x in enumerate(mods):
            self._modules[str(i)] = x

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return list(self._modules.values())[i]


class ReplicationPad1d(Module):
    def __init__(self, padding):
        Module.__init__(self)
        self.padding = tuple(padding) if isinstance(padding, (tuple, list)) else (padding, padding)

    def forward(self, input):
        return pad(input, self.padding, mode="replicate")


class Identity(Module):
    def forward(self, input):
        return input


Module.float = lambda self: self


def _module_requires_grad_(self, requires_grad=True):
    for p in self.parameters():
        p.requires_grad = bool(requires_grad)
    return self


Module.requires_grad_ = _module_requires_grad_


class MSELoss(Module):
    def forward(self, input, target):
        return mse_loss(input, target)


class CrossEntropyLoss(Module):
    def forward(self, input, target):
        return cross_entropy(input, target)


class Adam(torch.optim.AdamW):
    """torch.optim.Adam: exp_avg and exp_avg_sq per parameter, made at the first step, as AdamW's."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0, amsgrad=False):
        torch.optim.AdamW.__init__(self, params, lr, betas, eps, weight_decay, amsgrad)


def _free_graph(root):
    """What PyTorch does after backward (retain_graph=False): the tensors the graph saved are freed."""
    todo, seen = [root], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        if isinstance(t, (tuple, list)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor):
            s = t.__dict__.get("_saved")
            if s is not None:
                t._saved = None
                todo.append(s)


_plain_backward = torch.Tensor.backward


def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        _free_graph(self)


torch.Tensor.backward = backward


def checkpoint(function, *args, use_reentrant=None, **kwargs):
    """torch.utils.checkpoint.checkpoint: the function runs without keeping its activations; only its
    inputs are kept, the function runs again in backward."""
    with torch.no_grad():
        out = function(*args, **kwargs)
    if torch.is_grad_enabled():
        mod = getattr(function, "__self__", None)
        own = [p for p in mod.parameters() if p.requires_grad] if isinstance(mod, Module) else []
        ins = tuple(a for a in args if isinstance(a, torch.Tensor))
        for o in _graph.tensors_in(out):
            o._saved = ins
            o._params = _graph.merge(o._params, own, *(_graph.leaves(a) for a in ins))
    return out


def script(fn):
    """torch.jit.script of an elementwise function: one fused kernel; autograd keeps its inputs only."""
    def scripted(*args):
        with torch.no_grad():
            out = fn(*args)
        ins = tuple(a for a in args if isinstance(a, torch.Tensor))
        if _tracked(ins):
            out._saved = ins
            _graph.derive(out, *ins)
        return out
    scripted.__name__ = fn.__name__
    return scripted


_plain_enter, _plain_exit = torch.autocast.__enter__, torch.autocast.__exit__


def _ac_enter(self):
    self._prev_fast = getattr(_fast, "dtype", None)
    _fast.dtype = self.fast_dtype if self._enabled else None
    return _plain_enter(self)


def _ac_exit(self, *exc):
    _fast.dtype = self._prev_fast
    return _plain_exit(self, *exc)


torch.autocast.__enter__, torch.autocast.__exit__ = _ac_enter, _ac_exit
'''


def _install_torch_extras(torch):
    import sys
    import types
    ns = {"__name__": "torch.nn.modules"}
    exec(compile(_TORCH_EXTRAS, torch.__file__, "exec"), ns)
    for name in ("zeros", "ones", "randn", "rand", "matmul", "softmax", "log_softmax", "sigmoid", "tanh", "sin",
                 "cos", "exp", "relu", "cat", "stack", "argmax", "multinomial"):
        setattr(torch, name, ns[name])
    torch.reshape = ns["_reshape_fn"]
    torch.long = torch.int64 = "float64"        # the stand-in has no integer dtypes of 8 bytes: same size
    ns["Adam"].__module__ = "torch.optim.adam"
    torch.optim.Adam = ns["Adam"]
    for name in ("Linear", "LayerNorm", "BatchNorm1d", "Dropout", "ReLU", "GELU", "GLU", "Embedding", "Conv1d",
                 "ConvTranspose1d", "LSTM", "Sequential", "ModuleList", "Identity", "ReplicationPad1d", "MSELoss",
                 "CrossEntropyLoss"):
        ns[name].__module__ = "torch.nn.modules"
        setattr(torch.nn, name, ns[name])
    for name in ("softmax", "log_softmax", "relu", "gelu", "silu", "glu", "dropout", "pad", "mse_loss", "conv1d",
                 "scaled_dot_product_attention",
                 "cross_entropy", "sigmoid", "tanh"):
        setattr(torch.nn.functional, name, ns[name])
    utils = sys.modules.get("torch.utils") or types.ModuleType("torch.utils")
    ck = types.ModuleType("torch.utils.checkpoint")
    ck.checkpoint = ns["checkpoint"]
    utils.checkpoint = ck
    sys.modules["torch.utils"], sys.modules["torch.utils.checkpoint"] = utils, ck
    torch.utils = utils
    jit = types.ModuleType("torch.jit")
    jit.script = ns["script"]
    sys.modules["torch.jit"] = torch.jit = jit
# ------------------------------------------ end of stand-in section ------------------------------------

_install_torch_extras(torch)
scen_truth.note_every_empty(torch)

import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402

# ------------------------------------------------------------------------------------------------
# parler_tts/modeling_parler_tts.py (parler-tts 0.2) and the T5 encoder it runs, as pip-installed
# ------------------------------------------------------------------------------------------------
NUM_CODEBOOKS = 9
CODEBOOK_SIZE = 1088             # 1024 DAC codes + special tokens
D_MODEL = 2048
FFN_DIM = 8192
DEC_LAYERS = 24
DEC_HEADS = 32
T5_D_MODEL = 1024
T5_FF = 2816
T5_LAYERS = 24
T5_VOCAB = 32128


class T5LayerNorm(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x):
        return x * self.weight


class T5Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.q = nn.Linear(T5_D_MODEL, T5_D_MODEL, bias=False)
        self.k = nn.Linear(T5_D_MODEL, T5_D_MODEL, bias=False)
        self.v = nn.Linear(T5_D_MODEL, T5_D_MODEL, bias=False)
        self.o = nn.Linear(T5_D_MODEL, T5_D_MODEL, bias=False)
        self.ln_attn = T5LayerNorm(T5_D_MODEL)
        self.wi_0 = nn.Linear(T5_D_MODEL, T5_FF, bias=False)
        self.wi_1 = nn.Linear(T5_D_MODEL, T5_FF, bias=False)
        self.wo = nn.Linear(T5_FF, T5_D_MODEL, bias=False)
        self.ln_ff = T5LayerNorm(T5_D_MODEL)

    def forward(self, h):
        b, t, _ = h.shape
        x = self.ln_attn(h)
        q = self.q(x).view(b, t, 16, 64).transpose(1, 2)
        k = self.k(x).view(b, t, 16, 64).transpose(1, 2)
        v = self.v(x).view(b, t, 16, 64).transpose(1, 2)
        a = torch.matmul(F.softmax(torch.matmul(q, k.transpose(2, 3)), dim=-1), v)
        h = h + self.o(a.transpose(1, 2).reshape(b, t, T5_D_MODEL))
        x = self.ln_ff(h)
        return h + self.wo(F.gelu(self.wi_0(x)) * self.wi_1(x))


class T5EncoderModel(nn.Module):
    """google/flan-t5-large's encoder (0.34 B parameters)."""

    def __init__(self):
        super().__init__()
        self.shared = nn.Embedding(T5_VOCAB, T5_D_MODEL)
        self.block = nn.ModuleList([T5Block() for _ in range(T5_LAYERS)])
        self.final_layer_norm = T5LayerNorm(T5_D_MODEL)

    def forward(self, input_ids, attention_mask=None):
        h = self.shared(input_ids)
        for layer in self.block:
            h = layer(h)
        return self.final_layer_norm(h)


class DACModel(nn.Module):
    """The descript 44 kHz codec the model carries as its audio_encoder (76 M parameters); the training
    reads codes the preprocessing step made with it, so it does not run here."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Conv1d(1024, 1024, 21)       # stands for the encoder's 22 M parameters (weights only)
        self.decoder = nn.Conv1d(1536, 1536, 23)       # and the decoder's 54 M


class ParlerTTSAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        super().__init__()
        self.embed_dim, self.num_heads, self.head_dim = embed_dim, num_heads, embed_dim // num_heads
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=False)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, hidden_states, key_value_states=None):
        bsz, tgt_len, _ = hidden_states.shape
        kv = hidden_states if key_value_states is None else key_value_states
        query_states = self.q_proj(hidden_states).view(bsz, tgt_len, self.num_heads, self.head_dim).transpose(1, 2)
        key_states = self.k_proj(kv).view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        value_states = self.v_proj(kv).view(bsz, -1, self.num_heads, self.head_dim).transpose(1, 2)
        attn_output = F.scaled_dot_product_attention(query_states, key_states, value_states,
                                                     is_causal=key_value_states is None)
        attn_output = attn_output.transpose(1, 2).reshape(bsz, tgt_len, self.embed_dim)
        return self.out_proj(attn_output)


class ParlerTTSDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = ParlerTTSAttention(D_MODEL, DEC_HEADS)
        self.self_attn_layer_norm = nn.LayerNorm(D_MODEL)
        self.encoder_attn = ParlerTTSAttention(D_MODEL, DEC_HEADS)
        self.encoder_attn_layer_norm = nn.LayerNorm(D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, FFN_DIM, bias=False)
        self.fc2 = nn.Linear(FFN_DIM, D_MODEL, bias=False)
        self.final_layer_norm = nn.LayerNorm(D_MODEL)

    def forward(self, hidden_states, encoder_hidden_states=None):
        residual = hidden_states
        hidden_states = self.self_attn_layer_norm(hidden_states)
        hidden_states = self.self_attn(hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.encoder_attn_layer_norm(hidden_states)
        hidden_states = self.encoder_attn(hidden_states, key_value_states=encoder_hidden_states)
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.final_layer_norm(hidden_states)
        hidden_states = self.fc2(F.gelu(self.fc1(hidden_states)))
        return residual + hidden_states


class ParlerTTSDecoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.ModuleList([nn.Embedding(CODEBOOK_SIZE + 1, D_MODEL) for _ in range(NUM_CODEBOOKS)])
        self.layers = nn.ModuleList([ParlerTTSDecoderLayer() for _ in range(DEC_LAYERS)])
        self.layer_norm = nn.LayerNorm(D_MODEL)
        self.gradient_checkpointing = False
        self._gradient_checkpointing_func = None

    def forward(self, input_ids, encoder_hidden_states=None, prompt_hidden_states=None):
        inputs_embeds = sum(self.embed_tokens[codebook](input_ids[:, codebook]) for codebook in range(NUM_CODEBOOKS))
        if prompt_hidden_states is not None:
            inputs_embeds = torch.cat([prompt_hidden_states, inputs_embeds], dim=1)
        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(decoder_layer.__call__, hidden_states,
                                                                  encoder_hidden_states)
            else:
                hidden_states = decoder_layer(hidden_states, encoder_hidden_states)
        return self.layer_norm(hidden_states)


class ParlerTTSForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.decoder = ParlerTTSDecoder()
        self.lm_heads = nn.ModuleList([nn.Linear(D_MODEL, CODEBOOK_SIZE, bias=False) for _ in range(NUM_CODEBOOKS)])

    def forward(self, input_ids, encoder_hidden_states=None, prompt_hidden_states=None, labels=None):
        hidden_states = self.decoder(input_ids, encoder_hidden_states, prompt_hidden_states)
        lm_logits = torch.stack([head(hidden_states) for head in self.lm_heads], dim=1)
        loss = None
        if labels is not None:
            logits = lm_logits[:, :, -labels.shape[1]:]
            loss_fct = nn.CrossEntropyLoss()
            loss = 0
            for codebook in range(NUM_CODEBOOKS):
                codebook_logits = logits[:, codebook].contiguous().view(-1, logits.shape[-1])
                codebook_labels = labels[..., codebook].contiguous().view(-1)
                loss = loss + loss_fct(codebook_logits, codebook_labels)
            loss = loss / NUM_CODEBOOKS
        return loss, lm_logits


class Seq2SeqLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class ParlerTTSForConditionalGeneration(nn.Module):
    def __init__(self):
        super().__init__()
        self.text_encoder = T5EncoderModel()
        self.audio_encoder = DACModel()
        self.decoder = ParlerTTSForCausalLM()
        self.enc_to_dec_proj = nn.Linear(T5_D_MODEL, D_MODEL)
        self.embed_prompts = nn.Embedding(T5_VOCAB, D_MODEL)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation="sdpa"):
        return cls()                            # config.json + model.safetensors; torch_dtype None: float32

    def freeze_encoders(self, freeze_text_encoder=True):
        if freeze_text_encoder:
            for param in self.text_encoder.parameters():
                param.requires_grad = False
        for param in self.audio_encoder.parameters():
            param.requires_grad = False

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        for module in self.modules():
            if hasattr(module, "gradient_checkpointing"):
                module._gradient_checkpointing_func = functools.partial(checkpoint, use_reentrant=False)
                module.gradient_checkpointing = True

    def forward(self, input_ids=None, attention_mask=None, prompt_input_ids=None, labels=None):
        encoder_hidden_states = self.text_encoder(input_ids, attention_mask)
        encoder_hidden_states = self.enc_to_dec_proj(encoder_hidden_states)
        prompt_hidden_states = self.embed_prompts(prompt_input_ids)
        decoder_input_ids = labels.transpose(1, 2).contiguous()      # shifted right with the delay pattern
        loss, logits = self.decoder(decoder_input_ids, encoder_hidden_states, prompt_hidden_states, labels=labels)
        return Seq2SeqLMOutput(loss, logits)


# ------------------------------------------------------------------------------------------------
# accelerate 1.1, as far as the training script uses it
# ------------------------------------------------------------------------------------------------
class AcceleratedOptimizer(object):
    def __init__(self, optimizer, accelerator):
        self.optimizer, self.accelerator = optimizer, accelerator

    def step(self, closure=None):
        if self.accelerator.sync_gradients:
            self.optimizer.step(closure)

    def zero_grad(self, set_to_none=True):
        if self.accelerator.sync_gradients:
            self.optimizer.zero_grad(set_to_none)


class Accelerator(object):
    def __init__(self, gradient_accumulation_steps=1, mixed_precision="no", log_with=None):
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.mixed_precision = mixed_precision
        self.step = 0
        self.sync_gradients = True
        self.device = "cuda"

    def prepare(self, model, optimizer, dataloader):
        model.to(self.device)
        return model, AcceleratedOptimizer(optimizer, self), dataloader

    @contextlib.contextmanager
    def accumulate(self, model):
        self.step += 1
        self.sync_gradients = self.step % self.gradient_accumulation_steps == 0
        yield

    def autocast(self):
        return torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.mixed_precision == "bf16")

    def backward(self, loss):
        loss = loss / self.gradient_accumulation_steps
        loss.backward()

    def clip_grad_norm_(self, parameters, max_norm):
        return 0.0        # torch.nn.utils.clip_grad_norm_ (foreach norms: a few bytes per parameter)


# ------------------------------------------------------------------------------------------------
# training/run_parler_tts_training.py as launched by the user:
#   accelerate launch run_parler_tts_training.py ./helpers/training_configs/finetune_large_expresso.json
# (the repo's starting-point config, model_name_or_path changed from mini-v1 to large-v1; one RTX 4090)
# ------------------------------------------------------------------------------------------------
TRAINING_ARGS = {
    "model_name_or_path": "parler-tts/parler-tts-large-v1",
    "per_device_train_batch_size": 2,
    "gradient_accumulation_steps": 8,
    "gradient_checkpointing": True,
    "freeze_text_encoder": True,
    "learning_rate": 0.00008,
    "adam_beta1": 0.9,
    "adam_beta2": 0.99,
    "weight_decay": 0.01,
    "max_grad_norm": 1.0,
    "max_duration_in_seconds": 30,
    "dtype": "bfloat16",
    "num_train_epochs": 8,
}
FRAME_RATE = 86                                  # DAC codes per second


def train_dataloader(batch_size, max_seconds):
    """DataLoader over the preprocessed Expresso + own-voice set: descriptions, transcripts (prompts) and
    the DAC codes of the audio, padded to the batch's longest (the set's clips run up to 30 s)."""
    rng = random.Random(4)
    while True:
        frames = int(rng.uniform(0.75, 1.0) * max_seconds * FRAME_RATE) + NUM_CODEBOOKS
        yield {
            "input_ids": torch.zeros(batch_size, 48, dtype=torch.long, device="cpu"),
            "attention_mask": torch.zeros(batch_size, 48, dtype=torch.long, device="cpu"),
            "prompt_input_ids": torch.zeros(batch_size, 64, dtype=torch.long, device="cpu"),
            "labels": torch.zeros(batch_size, frames, NUM_CODEBOOKS, dtype=torch.long, device="cpu"),
        }


def main():
    args = TRAINING_ARGS
    accelerator = Accelerator(gradient_accumulation_steps=args["gradient_accumulation_steps"],
                              mixed_precision="bf16", log_with="wandb")
    model = ParlerTTSForConditionalGeneration.from_pretrained(args["model_name_or_path"])
    model.freeze_encoders(args["freeze_text_encoder"])
    if args["gradient_checkpointing"]:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(
        params=[p for p in model.parameters() if p.requires_grad],
        lr=args["learning_rate"],
        betas=(args["adam_beta1"], args["adam_beta2"]),
        eps=1e-8,
        weight_decay=args["weight_decay"],
    )
    loader = train_dataloader(args["per_device_train_batch_size"], args["max_duration_in_seconds"])
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for step, batch in enumerate(loader):
        batch = {k: v.to(accelerator.device) for k, v in batch.items()}
        with accelerator.accumulate(model):
            with accelerator.autocast():
                outputs = model(**batch)
            loss = outputs.loss
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), args["max_grad_norm"])
            optimizer.step()
            optimizer.zero_grad()
        if step % 8 == 7:
            print("step %d: loss %.3f" % ((step + 1) // 8, loss.item()))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
