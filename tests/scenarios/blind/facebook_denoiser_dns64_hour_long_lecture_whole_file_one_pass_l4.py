r"""Speech enhancement: facebook denoiser (dns64) run over a folder of lecture recordings, each file in one pass; the
files of 8-16 minutes go through, a 62-minute lecture needs ~70 GiB and fails in the first encoder layer (L4, 24 GB).

The real code: `python -m denoiser.enhance --dns64 --noisy_dir /data/lectures_2024ws --out_dir /data/enhanced
--device cuda` (denoiser 0.1.5).  enhance.py loads each file whole (Audioset, batch_size 1) and runs

    with torch.no_grad():
        estimate = model(noisy)
        estimate = (1 - args.dry) * estimate + args.dry * noisy

Demucs(hidden=64) upsamples the signal 4x (resample=4), then five encoder layers Conv1d(k=8, s=4) -> ReLU ->
Conv1d 1x1 to twice the channels -> GLU (64, 128, ... 1024 channels), a 2-layer LSTM, and a mirrored decoder that
adds each layer's skip connection.

What happens: memory is linear in the file's length, and the first layer works at the upsampled rate.  62 min at
16 kHz = 59.5 M samples, 238 M after upsampling; the first conv's output is 64 channels x 59.5 M frames x 4 B =
15.2 GB (14.2 GiB), and the ReLU after it (nn.ReLU(), not in place) asks for a second tensor of that size.  The
files before it (7.8 to 16.5 min) peaked at up to 19.2 GiB -- about 1.17 GiB per minute of audio, in the first
layer's 1x1 conv and GLU and the decoder's skip additions -- so the L4's 22.5 GiB holds ~18 minutes.  On the
lecture, with 15.9 GiB allocated (the conv output, the upsampled input) and 3.9 GiB free, the ReLU's 14.2 GiB
request fails.  no_grad is on: nothing is kept for backward; the 2.2 GiB the cache holds from earlier files are no
help either.

What an expert says first: the input is the problem, not the model or the batch: enhance long recordings in
chunks (30-60 s windows with a short overlap, cross-faded; or denoiser's streaming mode, DemucsStreamer /
--streaming), so memory is bounded by the chunk rather than by the file.  Wrong advice: a smaller batch (it is 1),
gradient checkpointing or inference_mode (inference under no_grad already), expandable_segments / empty_cache
(one 14.2 GiB request), a bigger GPU (the next two-hour file needs ~140 GiB); half precision halves it and bounds
nothing.
"""
import math
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

# ------------------------------------------------------------------------------------------------
# denoiser/resample.py and denoiser/demucs.py (facebookresearch/denoiser 0.1.5), as pip-installed
# ------------------------------------------------------------------------------------------------


def kernel_upsample2(zeros=56):
    return torch.zeros(1, 1, 2 * zeros)         # the windowed sinc kernel (math on 112 values)


def upsample2(x, zeros=56):
    """Upsampling the input by 2 using sinc interpolation."""
    *other, time = x.shape
    kernel = kernel_upsample2(zeros).to(x.device)
    out = F.conv1d(x.view(-1, 1, time), kernel, padding=zeros)[..., 1:].view(*other, time)
    y = torch.stack([x, out], dim=-1)
    return y.view(*other, -1)


class BLSTM(nn.Module):
    def __init__(self, dim, layers=2, bi=True):
        super().__init__()
        klass = nn.LSTM
        self.lstm = klass(bidirectional=bi, num_layers=layers, hidden_size=dim, input_size=dim)
        self.linear = None
        if bi:
            self.linear = nn.Linear(2 * dim, dim)

    def forward(self, x, hidden=None):
        x, hidden = self.lstm(x, hidden)
        if self.linear:
            x = self.linear(x)
        return x, hidden


class Demucs(nn.Module):
    """Demucs speech enhancement model (causal, 5 layers, resample x4)."""

    def __init__(self, chin=1, chout=1, hidden=48, depth=5, kernel_size=8, stride=4, causal=True, resample=4,
                 growth=2, max_hidden=10000, normalize=True, glu=True, rescale=0.1, floor=1e-3, sample_rate=16000):
        super().__init__()
        self.chin, self.chout, self.hidden, self.depth = chin, chout, hidden, depth
        self.kernel_size, self.stride, self.causal, self.floor = kernel_size, stride, causal, floor
        self.resample, self.normalize, self.sample_rate = resample, normalize, sample_rate
        self.encoder = nn.ModuleList()
        self.decoder = nn.ModuleList()
        activation = nn.GLU(1) if glu else nn.ReLU()
        ch_scale = 2 if glu else 1
        for index in range(depth):
            encode = []
            encode += [
                nn.Conv1d(chin, hidden, kernel_size, stride),
                nn.ReLU(),
                nn.Conv1d(hidden, hidden * ch_scale, 1), activation,
            ]
            self.encoder.append(nn.Sequential(*encode))
            decode = []
            decode += [
                nn.Conv1d(hidden, ch_scale * hidden, 1), activation,
                nn.ConvTranspose1d(hidden, chout, kernel_size, stride),
            ]
            if index > 0:
                decode.append(nn.ReLU())
            self.decoder.insert(0, nn.Sequential(*decode))
            chout = hidden
            chin = hidden
            hidden = min(int(growth * hidden), max_hidden)
        self.lstm = BLSTM(chin, bi=not causal)

    def valid_length(self, length):
        length = math.ceil(length * self.resample)
        for idx in range(self.depth):
            length = math.ceil((length - self.kernel_size) / self.stride) + 1
            length = max(length, 1)
        for idx in range(self.depth):
            length = (length - 1) * self.stride + self.kernel_size
        length = int(math.ceil(length / self.resample))
        return int(length)

    def forward(self, mix):
        if mix.dim() == 2:
            mix = mix.unsqueeze(1)
        if self.normalize:
            mono = mix.mean(dim=1, keepdim=True)
            std = mono.std(dim=-1, keepdim=True)
            mix = mix / (self.floor + std)
        else:
            std = 1
        length = mix.shape[-1]
        x = mix
        x = F.pad(x, (0, self.valid_length(length) - length))
        if self.resample == 2:
            x = upsample2(x)
        elif self.resample == 4:
            x = upsample2(x)
            x = upsample2(x)
        skips = []
        for encode in self.encoder:
            x = encode(x)
            skips.append(x)
        x = x.permute(2, 0, 1)
        x, _ = self.lstm(x)
        x = x.permute(1, 2, 0)
        for decode in self.decoder:
            skip = skips.pop(-1)
            x = x + skip[..., :x.shape[-1]]
            x = decode(x)
        x = x[..., :length]
        return std * x


def dns64():
    """denoiser.pretrained.dns64(): Demucs(hidden=64), weights from dns64-a7761ff99a7d5bb6.th."""
    model = Demucs(hidden=64, sample_rate=16000)
    return model


# ------------------------------------------------------------------------------------------------
# denoiser/enhance.py as the user runs it:
#   python -m denoiser.enhance --dns64 --noisy_dir /data/lectures_2024ws --out_dir /data/enhanced --device cuda
# ------------------------------------------------------------------------------------------------
SAMPLE_RATE = 16000
# the recordings of the folder, sorted as Audioset lists them, with their lengths in minutes
NOISY_FILES = [
    ("/data/lectures_2024ws/01_intro_q_and_a.wav", 9.5),
    ("/data/lectures_2024ws/02_guest_talk_excerpt.wav", 14.0),
    ("/data/lectures_2024ws/03_lab_briefing.wav", 11.2),
    ("/data/lectures_2024ws/04_seminar_part1.wav", 16.5),
    ("/data/lectures_2024ws/05_office_hour.wav", 12.3),
    ("/data/lectures_2024ws/06_announcements.wav", 7.8),
    ("/data/lectures_2024ws/07_lecture_signal_processing_full.wav", 62.0),
    ("/data/lectures_2024ws/08_seminar_part2.wav", 13.0),
]


class Args(object):
    dns64 = True
    noisy_dir = "/data/lectures_2024ws"
    out_dir = "/data/enhanced"
    device = "cuda"
    dry = 0.0
    streaming = False
    batch_size = 1
    num_workers = 10


class Audioset(object):
    """denoiser.audio.Audioset(files, with_path=True, sample_rate=16000, channels=1, convert=True)."""

    def __init__(self, files, sample_rate=SAMPLE_RATE):
        self.files, self.sample_rate = files, sample_rate

    def __len__(self):
        return len(self.files)

    def __getitem__(self, index):
        path, minutes = self.files[index]
        num_frames = int(minutes * 60 * self.sample_rate)
        out = torch.zeros(1, num_frames, device="cpu")       # torchaudio.load(path): (channels, time) float32
        return out, path


def loader(dset, batch_size=1):
    """distrib.loader(dset, batch_size=1, num_workers=...): one recording per batch."""
    for i in range(len(dset)):
        wav, path = dset[i]
        yield wav.view(1, *wav.shape), [path]


def get_estimate(model, noisy, args):
    with torch.no_grad():
        estimate = model(noisy)
        estimate = (1 - args.dry) * estimate + args.dry * noisy
    return estimate


def save_wavs(estimates, noisy_sigs, filenames, out_dir, sr=16000):
    for estimate, noisy, filename in zip([estimates.cpu()], [noisy_sigs.cpu()], filenames):
        pass        # write(estimate, filename + "_enhanced.wav", sr=sr); write(noisy, filename + "_noisy.wav", sr=sr)


def _estimate_and_save(model, noisy_signals, filenames, out_dir, args):
    estimate = get_estimate(model, noisy_signals, args)
    save_wavs(estimate, noisy_signals, filenames, out_dir, sr=model.sample_rate)


def enhance(args, model=None):
    if model is None:
        model = dns64()
    model.to(args.device)
    model.eval()
    dset = Audioset(NOISY_FILES, sample_rate=model.sample_rate)
    for data in loader(dset, batch_size=1):
        noisy_signals, filenames = data
        noisy_signals = noisy_signals.to(args.device)
        print("enhancing %s (%.1f min)" % (filenames[0], noisy_signals.shape[-1] / 60.0 / SAMPLE_RATE))
        _estimate_and_save(model, noisy_signals, filenames, args.out_dir, args)


def main():
    enhance(Args())


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
