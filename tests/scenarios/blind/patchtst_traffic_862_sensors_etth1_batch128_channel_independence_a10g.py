r"""Long-horizon forecasting: PatchTST on Traffic (862 road sensors) with the batch_size 128 of the ETTh1 script it
was copied from; channel independence makes the encoder's batch 128 x 862 = 110,336 sequences, and the first
layer's attention scores (28.9 GB) are larger than the A10G (24 GB).

The real code: yuqinie98/PatchTST, PatchTST_supervised, the user's scripts/PatchTST/traffic_720.sh:

    python -u run_longExp.py --is_training 1 --root_path ./dataset/ --data_path traffic.csv \
      --model_id traffic_512_720 --model PatchTST --data custom --features M --seq_len 512 --pred_len 720 \
      --enc_in 862 --e_layers 3 --n_heads 16 --d_model 128 --d_ff 256 --dropout 0.2 --fc_dropout 0.2 \
      --head_dropout 0 --patch_len 16 --stride 8 --des Exp --train_epochs 100 --patience 10 --lradj TST \
      --pct_start 0.2 --itr 1 --batch_size 128 --learning_rate 0.0001

(the model dimensions of the repository's traffic.sh, the rest of the etth1.sh the user started from: 128 is a
batch for 7 series; traffic.sh uses 24).  exp_main.py's loop: batch_x.float().to(device); outputs =
model(batch_x); MSELoss; loss.backward(); Adam step.

What happens: PatchTST treats each series of each sample as its own sequence, so the transformer's batch is
110,336 sequences of 64 patches (512 steps, patch 16, stride 8, end padding).  W_P's output, the dropout's output
and each of Q, K and V are 110,336 x 64 x 128 float32 = 3.6 GB (3.37 GiB), the dropout mask 0.9 GB, the batch,
targets and RevIN's copies about 1 GB: 18.4 GiB allocated (plus the 0.5 GiB context) of the A10G's 22.5 GiB when
the first encoder layer computes torch.matmul(q, k): 110,336 x 16 heads x 64 x 64 x 4 B = 28.9 GB (27,584 MiB),
requested with 3.5 GiB free.  The first forward pass of the first step fails.

What an expert says first: the batch is ~100x too large for this dataset -- its cost scales with batch x 862
series: lower --batch_size (8 peaks at ~19 GiB on this card, 4 at ~9.6 GiB) and keep the effective batch with
gradient accumulation if wanted.  Mixed precision or a memory-efficient attention kernel help after that, not
instead: at batch 128 the score tensor alone is larger than the card and the three layers' activations come to
hundreds of GB.  Wrong advice: empty_cache / expandable_segments (5 MiB is cached), inference_mode (this is
training), quantization or an 8-bit optimizer (weights and optimizer state are a few MB), other processes (none).
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
from torch import optim  # noqa: E402

# ------------------------------------------------------------------------------------------------
# PatchTST_supervised/layers/RevIN.py and layers/PatchTST_backbone.py (yuqinie98/PatchTST), as cloned
# ------------------------------------------------------------------------------------------------


class RevIN(nn.Module):
    def __init__(self, num_features, eps=1e-5, affine=True, subtract_last=False):
        super().__init__()
        self.num_features, self.eps, self.affine, self.subtract_last = num_features, eps, affine, subtract_last

    def forward(self, x, mode):
        if mode == "norm":
            self.mean = x.mean(dim=1, keepdim=True).detach()
            self.stdev = (x.var(dim=1, keepdim=True, unbiased=False) + self.eps).sqrt().detach()
            x = x - self.mean
            x = x / self.stdev
        return x


class Transpose(nn.Module):
    def __init__(self, *dims, contiguous=False):
        super().__init__()
        self.dims, self.contiguous = dims, contiguous

    def forward(self, x):
        if self.contiguous:
            return x.transpose(*self.dims).contiguous()
        return x.transpose(*self.dims)


class _ScaledDotProductAttention(nn.Module):
    def __init__(self, d_model, n_heads, attn_dropout=0.0, res_attention=False, lsa=False):
        super().__init__()
        self.attn_dropout = nn.Dropout(attn_dropout)
        self.res_attention = res_attention
        head_dim = d_model // n_heads
        self.scale = head_dim ** -0.5          # nn.Parameter(torch.tensor(head_dim ** -0.5), requires_grad=lsa)
        self.lsa = lsa

    def forward(self, q, k, v, prev=None, key_padding_mask=None, attn_mask=None):
        # q: [bs x n_heads x max_q_len x d_k], k: [bs x n_heads x d_k x seq_len], v: [bs x n_heads x seq_len x d_v]
        attn_scores = torch.matmul(q, k) * self.scale
        if prev is not None:
            attn_scores = attn_scores + prev
        attn_weights = F.softmax(attn_scores, dim=-1)
        attn_weights = self.attn_dropout(attn_weights)
        output = torch.matmul(attn_weights, v)
        if self.res_attention:
            return output, attn_weights, attn_scores
        return output, attn_weights


class _MultiheadAttention(nn.Module):
    def __init__(self, d_model, n_heads, d_k=None, d_v=None, res_attention=False, attn_dropout=0.0,
                 proj_dropout=0.0, qkv_bias=True, lsa=False):
        super().__init__()
        d_k = d_model // n_heads if d_k is None else d_k
        d_v = d_model // n_heads if d_v is None else d_v
        self.n_heads, self.d_k, self.d_v = n_heads, d_k, d_v
        self.W_Q = nn.Linear(d_model, d_k * n_heads, bias=qkv_bias)
        self.W_K = nn.Linear(d_model, d_k * n_heads, bias=qkv_bias)
        self.W_V = nn.Linear(d_model, d_v * n_heads, bias=qkv_bias)
        self.res_attention = res_attention
        self.sdp_attn = _ScaledDotProductAttention(d_model, n_heads, attn_dropout=attn_dropout,
                                                   res_attention=self.res_attention, lsa=lsa)
        self.to_out = nn.Sequential(nn.Linear(n_heads * d_v, d_model), nn.Dropout(proj_dropout))

    def forward(self, Q, K=None, V=None, prev=None, key_padding_mask=None, attn_mask=None):
        bs = Q.size(0)
        if K is None:
            K = Q
        if V is None:
            V = Q
        q_s = self.W_Q(Q).view(bs, -1, self.n_heads, self.d_k).transpose(1, 2)
        k_s = self.W_K(K).view(bs, -1, self.n_heads, self.d_k).permute(0, 2, 3, 1)
        v_s = self.W_V(V).view(bs, -1, self.n_heads, self.d_v).transpose(1, 2)
        if self.res_attention:
            output, attn_weights, attn_scores = self.sdp_attn(q_s, k_s, v_s, prev=prev)
        else:
            output, attn_weights = self.sdp_attn(q_s, k_s, v_s)
        output = output.transpose(1, 2).contiguous().view(bs, -1, self.n_heads * self.d_v)
        output = self.to_out(output)
        if self.res_attention:
            return output, attn_weights, attn_scores
        return output, attn_weights


class TSTEncoderLayer(nn.Module):
    def __init__(self, q_len, d_model, n_heads, d_k=None, d_v=None, d_ff=256, norm="BatchNorm", attn_dropout=0,
                 dropout=0.0, bias=True, res_attention=False, pre_norm=False):
        super().__init__()
        self.res_attention = res_attention
        self.self_attn = _MultiheadAttention(d_model, n_heads, d_k, d_v, attn_dropout=attn_dropout,
                                             proj_dropout=dropout, res_attention=res_attention)
        self.dropout_attn = nn.Dropout(dropout)
        self.norm_attn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff, bias=bias), nn.GELU(), nn.Dropout(dropout),
                                nn.Linear(d_ff, d_model, bias=bias))
        self.dropout_ffn = nn.Dropout(dropout)
        self.norm_ffn = nn.Sequential(Transpose(1, 2), nn.BatchNorm1d(d_model), Transpose(1, 2))
        self.pre_norm = pre_norm

    def forward(self, src, prev=None, key_padding_mask=None, attn_mask=None):
        if self.res_attention:
            src2, attn, scores = self.self_attn(src, src, src, prev)
        else:
            src2, attn = self.self_attn(src, src, src)
        src = src + self.dropout_attn(src2)
        src = self.norm_attn(src)
        src2 = self.ff(src)
        src = src + self.dropout_ffn(src2)
        src = self.norm_ffn(src)
        if self.res_attention:
            return src, scores
        return src


class TSTEncoder(nn.Module):
    def __init__(self, q_len, d_model, n_heads, d_k=None, d_v=None, d_ff=None, norm="BatchNorm", attn_dropout=0.0,
                 dropout=0.0, res_attention=False, n_layers=1, pre_norm=False):
        super().__init__()
        self.layers = nn.ModuleList([TSTEncoderLayer(q_len, d_model, n_heads=n_heads, d_k=d_k, d_v=d_v, d_ff=d_ff,
                                                     norm=norm, attn_dropout=attn_dropout, dropout=dropout,
                                                     res_attention=res_attention, pre_norm=pre_norm)
                                     for i in range(n_layers)])
        self.res_attention = res_attention

    def forward(self, src, key_padding_mask=None, attn_mask=None):
        output = src
        scores = None
        if self.res_attention:
            for mod in self.layers:
                output, scores = mod(output, prev=scores)
            return output
        for mod in self.layers:
            output = mod(output)
        return output


class TSTiEncoder(nn.Module):
    """Channel independence: every one of the n_vars series of a sample is its own sequence of patches."""

    def __init__(self, c_in, patch_num, patch_len, n_layers=3, d_model=128, n_heads=16, d_ff=256, norm="BatchNorm",
                 attn_dropout=0.0, dropout=0.0, res_attention=True, pre_norm=False):
        super().__init__()
        self.patch_num, self.patch_len = patch_num, patch_len
        self.W_P = nn.Linear(patch_len, d_model)
        self.W_pos = nn.Parameter(torch.zeros(patch_num, d_model))     # positional_encoding("zeros", learn_pe=True)
        self.dropout = nn.Dropout(dropout)
        self.encoder = TSTEncoder(patch_num, d_model, n_heads, d_ff=d_ff, norm=norm, attn_dropout=attn_dropout,
                                  dropout=dropout, pre_norm=pre_norm, res_attention=res_attention, n_layers=n_layers)

    def forward(self, x):                                            # x: [bs x nvars x patch_len x patch_num]
        n_vars = x.shape[1]
        x = x.permute(0, 1, 3, 2)                                    # x: [bs x nvars x patch_num x patch_len]
        x = self.W_P(x)                                              # x: [bs x nvars x patch_num x d_model]
        u = torch.reshape(x, (x.shape[0] * x.shape[1], x.shape[2], x.shape[3]))   # u: [bs * nvars x patch_num x d_model]
        u = self.dropout(u + self.W_pos)
        z = self.encoder(u)                                          # z: [bs * nvars x patch_num x d_model]
        z = torch.reshape(z, (-1, n_vars, z.shape[-2], z.shape[-1]))
        z = z.permute(0, 1, 3, 2)                                    # z: [bs x nvars x d_model x patch_num]
        return z


class Flatten_Head(nn.Module):
    def __init__(self, n_vars, nf, target_window, head_dropout=0):
        super().__init__()
        self.linear = nn.Linear(nf, target_window)
        self.dropout = nn.Dropout(head_dropout)

    def forward(self, x):
        x = x.flatten(start_dim=-2)
        x = self.linear(x)
        return self.dropout(x)


class PatchTST_backbone(nn.Module):
    def __init__(self, c_in, context_window, target_window, patch_len, stride, n_layers=3, d_model=128, n_heads=16,
                 d_ff=256, dropout=0.0, attn_dropout=0.0, head_dropout=0, padding_patch="end", revin=True,
                 affine=False, subtract_last=False, res_attention=True):
        super().__init__()
        self.revin = revin
        if self.revin:
            self.revin_layer = RevIN(c_in, affine=affine, subtract_last=subtract_last)
        self.patch_len, self.stride, self.padding_patch = patch_len, stride, padding_patch
        patch_num = int((context_window - patch_len) / stride + 1)
        if padding_patch == "end":
            self.padding_patch_layer = nn.ReplicationPad1d((0, stride))
            patch_num += 1
        self.backbone = TSTiEncoder(c_in, patch_num=patch_num, patch_len=patch_len, n_layers=n_layers,
                                    d_model=d_model, n_heads=n_heads, d_ff=d_ff, attn_dropout=attn_dropout,
                                    dropout=dropout, res_attention=res_attention)
        self.head_nf = d_model * patch_num
        self.head = Flatten_Head(c_in, self.head_nf, target_window, head_dropout=head_dropout)

    def forward(self, z):                                            # z: [bs x nvars x seq_len]
        if self.revin:
            z = z.permute(0, 2, 1)
            z = self.revin_layer(z, "norm")
            z = z.permute(0, 2, 1)
        if self.padding_patch == "end":
            z = self.padding_patch_layer(z)
        z = z.unfold(dimension=-1, size=self.patch_len, step=self.stride)   # z: [bs x nvars x patch_num x patch_len]
        z = z.permute(0, 1, 3, 2)                                    # z: [bs x nvars x patch_len x patch_num]
        z = self.backbone(z)
        z = self.head(z)                                             # z: [bs x nvars x target_window]
        return z


class Model(nn.Module):
    """models/PatchTST.py"""

    def __init__(self, configs):
        super().__init__()
        self.model = PatchTST_backbone(c_in=configs.enc_in, context_window=configs.seq_len,
                                       target_window=configs.pred_len, patch_len=configs.patch_len,
                                       stride=configs.stride, n_layers=configs.e_layers, d_model=configs.d_model,
                                       n_heads=configs.n_heads, d_ff=configs.d_ff, dropout=configs.dropout,
                                       attn_dropout=configs.dropout, head_dropout=configs.head_dropout,
                                       padding_patch=configs.padding_patch, revin=configs.revin,
                                       affine=configs.affine, subtract_last=configs.subtract_last)

    def forward(self, x):                                            # x: [Batch, Input length, Channel]
        x = x.permute(0, 2, 1)
        x = self.model(x)
        x = x.permute(0, 2, 1)
        return x


# ------------------------------------------------------------------------------------------------
# run_longExp.py + exp/exp_main.py, as launched by the user's scripts/PatchTST/traffic_720.sh
# ------------------------------------------------------------------------------------------------
class Args(object):
    """The command line of traffic_720.sh: the model dimensions of the repository's traffic.sh, the rest
    of the etth1.sh the user started from (its --batch_size 128 kept)."""
    is_training = 1
    model_id = "traffic_512_720"
    model = "PatchTST"
    data = "custom"
    root_path = "./dataset/"
    data_path = "traffic.csv"
    features = "M"
    seq_len = 512
    label_len = 48
    pred_len = 720
    enc_in = 862
    e_layers = 3
    n_heads = 16
    d_model = 128
    d_ff = 256
    dropout = 0.2
    fc_dropout = 0.2
    head_dropout = 0
    patch_len = 16
    stride = 8
    padding_patch = "end"
    revin = 1
    affine = 0
    subtract_last = 0
    des = "Exp"
    train_epochs = 100
    patience = 10
    lradj = "TST"
    pct_start = 0.2
    itr = 1
    batch_size = 128
    learning_rate = 0.0001
    use_amp = False


class Dataset_Custom(object):
    """data_provider/data_loader.py: traffic.csv, 17,544 hourly rows x 862 road-occupancy sensors; the
    training split's windows of seq_len rows, and the pred_len rows after them."""

    def __init__(self, args, flag="train"):
        self.seq_len, self.label_len, self.pred_len, self.n_vars = args.seq_len, args.label_len, args.pred_len, args.enc_in
        rows = 17544
        border = int(rows * 0.7)
        self.n = border - self.seq_len - self.pred_len + 1

    def __len__(self):
        return self.n


class DataLoader(object):
    """torch.utils.data.DataLoader(shuffle=True, drop_last=True, num_workers=10): host batches."""

    def __init__(self, dataset, batch_size, shuffle=True, num_workers=10, drop_last=True):
        self.dataset, self.batch_size = dataset, batch_size

    def __len__(self):
        return len(self.dataset) // self.batch_size

    def __iter__(self):
        d = self.dataset
        for _ in range(len(self)):
            batch_x = torch.zeros(self.batch_size, d.seq_len, d.n_vars, dtype=torch.float64, device="cpu")
            batch_y = torch.zeros(self.batch_size, d.label_len + d.pred_len, d.n_vars, dtype=torch.float64,
                                  device="cpu")
            yield batch_x, batch_y, None, None


class Exp_Main(object):
    def __init__(self, args):
        self.args = args
        self.device = "cuda:0"
        self.model = Model(args).float().to(self.device)

    def _get_data(self, flag):
        data_set = Dataset_Custom(self.args, flag)
        return data_set, DataLoader(data_set, batch_size=self.args.batch_size, shuffle=True, drop_last=True)

    def train(self, setting):
        train_data, train_loader = self._get_data(flag="train")
        train_steps = len(train_loader)
        model_optim = optim.Adam(self.model.parameters(), lr=self.args.learning_rate)
        criterion = nn.MSELoss()
        print("train steps per epoch: %d" % train_steps)
        for epoch in range(self.args.train_epochs):
            self.model.train()
            for i, (batch_x, batch_y, batch_x_mark, batch_y_mark) in enumerate(train_loader):
                model_optim.zero_grad()
                batch_x = batch_x.float().to(self.device)
                batch_y = batch_y.float().to(self.device)
                outputs = self.model(batch_x)
                f_dim = -1 if self.args.features == "MS" else 0
                outputs = outputs[:, -self.args.pred_len:, f_dim:]
                batch_y = batch_y[:, -self.args.pred_len:, f_dim:]
                loss = criterion(outputs, batch_y)
                loss.backward()
                model_optim.step()
                if (i + 1) % 100 == 0:
                    print("\titers: %d, epoch: %d | loss: %.7f" % (i + 1, epoch + 1, loss.item()))
        return self.model


def main():
    args = Args()
    setting = "{}_{}_{}_ft{}_sl{}_ll{}_pl{}_dm{}_nh{}_el{}_df{}_{}_0".format(
        args.model_id, args.model, args.data, args.features, args.seq_len, args.label_len, args.pred_len,
        args.d_model, args.n_heads, args.e_layers, args.d_ff, args.des)
    exp = Exp_Main(args)
    print(">>>>>>>start training : {}>>>>>>>>>>>>>>>>>>>>>>>>>>".format(setting))
    exp.train(setting)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
