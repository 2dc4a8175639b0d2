"""torch.nn.Conv1d/2d/3d as PyTorch lays them out (torch/nn/modules/conv.py): the module's forward calls
_conv_forward, which calls torch.nn.functional.conv2d (a builtin in PyTorch, a Python function here), so the
failing stack shows the frames PyTorch's does.  The weight is a Parameter of out x in x kernel elements; the
output is the input's bytes times out/in channels over stride squared (sizes in bytes, no shapes)."""
import torch
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter


class _ConvNd(Module):
    _dims = 2

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, bias=True, dtype=None,
                 device=None):
        Module.__init__(self)
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        k = kernel_size ** self._dims if isinstance(kernel_size, int) else 1
        if not isinstance(kernel_size, int):
            for d in kernel_size:
                k *= d
        self.weight = Parameter(torch.empty(out_channels * in_channels * k * 4, device=device))
        self.bias = Parameter(torch.empty(out_channels * 4, device=device)) if bias else None

    def _conv_forward(self, input, weight, bias):
        from torch.nn import functional as F
        conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[self._dims]
        return conv(input, weight, bias, self.stride, out_channels=self.out_channels, in_channels=self.in_channels)


class Conv1d(_ConvNd):
    _dims = 1

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)


class Conv2d(_ConvNd):
    _dims = 2

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)


class Conv3d(_ConvNd):
    _dims = 3

    def forward(self, input):
        return self._conv_forward(input, self.weight, self.bias)
