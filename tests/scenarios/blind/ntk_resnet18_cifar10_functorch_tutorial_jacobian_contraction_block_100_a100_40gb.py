"""entk_resnet18.py -- a PhD student's kernel-regime experiment: the empirical neural tangent kernel of a
trained CIFAR-10 ResNet-18 (11.2M parameters) on 2,000 training images, to compare kernel regression with
the network.  The kernel code is PyTorch's "Neural Tangent Kernels" tutorial (torch.func), unchanged:

    params = {k: v.detach() for k, v in net.named_parameters()}
    def fnet_single(params, x):
        return functional_call(net, params, (x.unsqueeze(0),)).squeeze(0)

    def empirical_ntk_jacobian_contraction(fnet_single, params, x1, x2):
        jac1 = vmap(jacrev(fnet_single), (None, 0))(params, x1)
        jac1 = [j.flatten(2) for j in jac1.values()]
        jac2 = vmap(jacrev(fnet_single), (None, 0))(params, x2)
        jac2 = [j.flatten(2) for j in jac2.values()]
        result = torch.stack([torch.einsum('Naf,Mbf->NMab', j1, j2) for j1, j2 in zip(jac1, jac2)])
        return result.sum(0)

The tutorial runs it on a toy CNN with x_train of 20 images and x_test of 5.  The student fills the
2,000 x 2,000 kernel in blocks of 100 x 100 images on a lab A100 40GB (39.5 GiB usable).  For one block,
vmap(jacrev(...)) materialises every parameter's Jacobian for every sample and every logit at once:
100 x 10 x 11.2M x 4 bytes = 44.7 GB for jac1 alone (jac2 would be as much again).  The failure comes
inside the first vmap(jacrev) call, while the per-parameter Jacobians are being made (layer4's convolutions,
2.36M parameters each, take 8.8 GiB apiece): a layer3 convolution's 2.2 GiB is refused with 37.8 GiB already
held by the Jacobians made so far.  No training runs; no optimizer exists.

An expert: the operation materialises a tensor larger than the card; compute it in pieces.  Use blocks of
~10-20 images (the kernel is assembled block by block anyway), or vmap's chunk_size, or contract one
parameter group at a time (make jac1/jac2 for one parameter, accumulate its einsum, free it), or the
tutorial's other method, NTK-vector products (empirical_ntk_ntk_vps), which never builds the Jacobian.
Wrong first advice: gradient checkpointing (activations are a few hundred MB; the Jacobians are the memory),
mixed precision (halving is not enough here, and bf16 Jacobians wreck the kernel's conditioning),
expandable_segments / empty_cache (everything is live), inference_mode (jacrev needs autograd), an 8-bit
optimizer or ZeRO (there is no optimizer), quantization, CPU offload.
"""
import os
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---------------------------------------------------------------------------------------------------------
# What the simulator's torch lacks, in the shape of the real API and defined as if in torch's own files (a
# failing stack then shows the frames it shows with PyTorch): torch.func's functional_call, vmap and jacrev
# (vmap over a batch of jacrev: one Jacobian per parameter, of batch x outputs x the parameter's elements,
# made parameter by parameter in the order backward reaches them), shapes, and the tensor ops the tutorial's
# contraction uses (flatten, einsum, stack, sum).
# ---------------------------------------------------------------------------------------------------------
def _as_library(path, src):
    ns = {"torch": torch, "nn": nn, "__name__": os.path.splitext(os.path.basename(path))[0]}
    exec(compile(src, path, "exec"), ns)
    return ns


_func = _as_library(os.path.join(os.path.dirname(torch.__file__), "_functorch", "eager_transforms.py"), r'''
def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def _make(shape, device="cuda"):
    t = torch.empty(_numel(shape), dtype=torch.float32, device=device)
    t.shape = tuple(shape)
    return t


def _reshaped(t, shape):
    v = t.view()
    v.shape = tuple(shape)
    return v


torch.Tensor.unsqueeze = lambda t, d: _reshaped(t, t.shape[:d] + (1,) + t.shape[d:])
torch.Tensor.squeeze = lambda t, d: _reshaped(t, t.shape[:d] + t.shape[d + 1:])
torch.Tensor.flatten = lambda t, start=0: _reshaped(t, t.shape[:start] + (_numel(t.shape[start:]),))
torch.Tensor.sum = lambda t, dim: _make(t.shape[:dim] + t.shape[dim + 1:])


def einsum(eq, a, b):
    """'Naf,Mbf->NMab'"""
    return _make((a.shape[0], b.shape[0], a.shape[1], b.shape[1]))


def stack(ts):
    return _make((len(ts),) + tuple(ts[0].shape))


torch.einsum, torch.stack = einsum, stack

_plain_detach = torch.Tensor.detach


def _detach(t):
    v = _plain_detach(t)
    if hasattr(t, "shape"):
        v.shape = t.shape
    return v


def _getitem(t, idx):
    """t[i:j]: a view of rows i..j."""
    return _reshaped(t, (len(range(*idx.indices(t.shape[0]))),) + tuple(t.shape[1:]))


def _named_parameters(self, prefix=""):
    for k, p in self._parameters.items():
        if p is not None:
            yield prefix + k, p
    for k, m in self._modules.items():
        for item in _named_parameters(m, prefix + k + "."):
            yield item


torch.Tensor.detach = _detach
torch.Tensor.__getitem__ = _getitem
nn.Module.named_parameters = _named_parameters


def _param(shape):
    p = nn.Parameter(_make(shape))
    p.shape = tuple(shape)
    return p


class Conv2d(nn.Module):
    def __init__(self, cin, cout, kernel_size, stride=1, padding=0, bias=False):
        nn.Module.__init__(self)
        self.weight = _param((cout, cin, kernel_size, kernel_size))


class BatchNorm2d(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.weight, self.bias = _param((c,)), _param((c,))


class Linear(nn.Module):
    def __init__(self, fan_in, fan_out):
        nn.Module.__init__(self)
        self.weight, self.bias = _param((fan_out, fan_in)), _param((fan_out,))


nn.Conv2d, nn.BatchNorm2d, nn.Linear = Conv2d, BatchNorm2d, Linear

_call_params = [None]


def functional_call(module, params, args):
    """torch.func.functional_call: the module's forward with `params` in place of its parameters."""
    _call_params[0] = params
    try:
        return module(*args)
    finally:
        _call_params[0] = None


class _Jacrev(object):
    def __init__(self, func, argnums=0):
        self.func, self.argnums = func, argnums

    def batched(self, params, x):
        """vmap(jacrev(func), (None, 0))(params, x): the forward once per sample (batched), then a backward per
        output (batched), which makes each parameter's Jacobian, N x outputs x its elements, last layer first;
        the gradients of the activations on the way are per sample and per output too."""
        n = x.shape[0]
        sample = _reshaped(x, x.shape[1:])
        out = self.func(params, sample)
        outputs = out.shape[0]
        acts = [_make((n,) + a) for a in _forward_activations(x.shape[1:])]
        jac = {}
        for name in reversed(list(params)):
            p = params[name]
            act_grad = _make((n, outputs, _numel(_act_shape_for(name, x.shape[1:]))))
            jac[name] = _make((n, outputs) + tuple(p.shape))
            del act_grad
        return dict((k, jac[k]) for k in params)


def jacrev(func, argnums=0):
    return _Jacrev(func, argnums)


def vmap(func, in_dims=0):
    def batched(params, x):
        return func.batched(params, x)
    return batched


_STAGES = {"conv1": (64, 32), "bn1": (64, 32), "layer1": (64, 32), "layer2": (128, 16), "layer3": (256, 8),
           "layer4": (512, 4), "linear": (10, 1)}


def _act_shape_for(name, in_shape):
    c, s = _STAGES[name.split(".")[0]]
    return (c, s, s)


def _forward_activations(in_shape):
    return [(c, s, s) for c, s in _STAGES.values() for _ in range(4)]
''')
functional_call, vmap, jacrev = _func["functional_call"], _func["vmap"], _func["jacrev"]


# ---------------------------------------------------------------------------------------------------------
# The student's code
# ---------------------------------------------------------------------------------------------------------
class BasicBlock(nn.Module):
    def __init__(self, in_planes, planes, stride=1):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(in_planes, planes, kernel_size=3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        if stride != 1 or in_planes != planes:
            self.shortcut = nn.Module()
            self.shortcut.conv = nn.Conv2d(in_planes, planes, kernel_size=1, stride=stride, bias=False)
            self.shortcut.bn = nn.BatchNorm2d(planes)


class ResNet18(nn.Module):
    """kuangliu/pytorch-cifar's ResNet18 (3x3 stem, no max-pool), 10 classes."""

    def __init__(self, num_classes=10):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        in_planes = 64
        for i, (planes, stride) in enumerate(((64, 1), (128, 2), (256, 2), (512, 2))):
            layer = nn.Module()
            layer.block0 = BasicBlock(in_planes, planes, stride)
            layer.block1 = BasicBlock(planes, planes, 1)
            setattr(self, "layer%d" % (i + 1), layer)
            in_planes = planes
        self.linear = nn.Linear(512, num_classes)

    def forward(self, x):
        # relu(bn1(conv1(x))) -> layer1..layer4 -> avg_pool2d(4) -> linear
        out = torch.empty(x.shape[0] * 10, dtype=torch.float32, device="cuda")
        out.shape = (x.shape[0], 10)
        return out


net = ResNet18().cuda()
net.eval()                                   # weights of the 200-epoch checkpoint (94.9% test accuracy)
params = {k: v.detach() for k, v in net.named_parameters()}
print("parameters: %.2fM" % (sum(p.nbytes for p in params.values()) / 4 / 1e6))


def fnet_single(params, x):
    return functional_call(net, params, (x.unsqueeze(0),)).squeeze(0)


def empirical_ntk_jacobian_contraction(fnet_single, params, x1, x2):
    # Compute J(x1)
    jac1 = vmap(jacrev(fnet_single), (None, 0))(params, x1)
    jac1 = jac1.values()
    jac1 = [j.flatten(2) for j in jac1]

    # Compute J(x2)
    jac2 = vmap(jacrev(fnet_single), (None, 0))(params, x2)
    jac2 = jac2.values()
    jac2 = [j.flatten(2) for j in jac2]

    # Compute J(x1) @ J(x2).T
    result = torch.stack([torch.einsum('Naf,Mbf->NMab', j1, j2) for j1, j2 in zip(jac1, jac2)])
    result = result.sum(0)
    return result


N, BLOCK = 2000, 100
x_train = torch.empty(N * 3 * 32 * 32, dtype=torch.float32, device="cuda")     # 2,000 CIFAR-10 images
x_train.shape = (N, 3, 32, 32)
K = torch.empty(N * N * 10 * 10, dtype=torch.float32, device="cuda")           # the kernel, N x N x 10 x 10
K.shape = (N, N, 10, 10)


try:
    for i in range(0, N, BLOCK):
        for j in range(0, N, BLOCK):
            k_ij = empirical_ntk_jacobian_contraction(fnet_single, params, x_train[i:i + BLOCK],
                                                      x_train[j:j + BLOCK])
            print("block (%d, %d) done, %.1f GiB allocated" % (i, j, torch.cuda.memory_allocated() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
