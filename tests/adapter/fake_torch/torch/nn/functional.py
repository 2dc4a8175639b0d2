"""torch.nn.functional, as far as the scenario programs use it: the Python functions whose frames the failing
stack shows in PyTorch (torch/nn/functional.py: cross_entropy, log_softmax, interpolate), each making the
tensors PyTorch's would, sized in bytes as the stand-in's tensors are (no shapes).  Nothing is computed;
each output is in its input's autograd graph (torch/autograd/_graph.py), as in PyTorch."""
import torch
from torch.autograd._graph import derive


def log_softmax(input, dim=-1, dtype=None):
    """A new tensor of the input's size (its dtype, or float32 when asked: dtype=torch.float32 of half logits
    doubles it)."""
    n = input.nbytes * (2 if dtype == torch.float32 and input.dtype in (torch.bfloat16, torch.float16) else 1)
    out = torch.empty(n, device=input.device)
    out._saved = input
    return derive(out, input)


def nll_loss(input, target, reduction="mean"):
    loss = torch.empty(512, device=input.device)
    loss._saved = input
    return derive(loss, input)


def cross_entropy(input, target, reduction="mean"):
    """log_softmax over the last dimension (a tensor of the logits' size), then nll_loss, as PyTorch's
    decomposition keeps it for backward."""
    return nll_loss(log_softmax(input, -1), target, reduction)


def interpolate(input, scale_factor=2.0, mode="nearest"):
    """The input upsampled by scale_factor in both spatial dimensions: scale_factor**2 times its bytes."""
    out = torch.empty(int(input.nbytes * float(scale_factor) ** 2), device=input.device)
    out._saved = input
    return derive(out, input)


def _conv(input, weight, stride, dims, out_channels, in_channels):
    """A convolution's output: the input's bytes times out/in channels, over stride per spatial dimension."""
    n = input.nbytes * max(out_channels, 1) // max(in_channels, 1) // max(int(stride), 1) ** dims
    out = torch.empty(max(n, 1), device=input.device)
    out._saved = input
    return derive(out, input)


def conv1d(input, weight, bias=None, stride=1, out_channels=1, in_channels=1):
    return _conv(input, weight, stride, 1, out_channels, in_channels)


def conv2d(input, weight, bias=None, stride=1, out_channels=1, in_channels=1):
    return _conv(input, weight, stride, 2, out_channels, in_channels)


def conv3d(input, weight, bias=None, stride=1, out_channels=1, in_channels=1):
    return _conv(input, weight, stride, 3, out_channels, in_channels)
