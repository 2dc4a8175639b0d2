"""torch.nn.Parameter: a tensor that shares the storage of the tensor it is made from."""
import torch


class Parameter(torch.Tensor):
    def __new__(cls, data=None, requires_grad=True):
        p = torch.Tensor.__new__(cls)
        p.device, p._block, p.nbytes, p._base = data.device, None, data.nbytes, data
        p.requires_grad = bool(requires_grad)
        return p

    def __init__(self, data=None, requires_grad=True):
        pass

    def __deepcopy__(self, memo):
        """As PyTorch's: a Parameter over a clone of its data (same device), requires_grad kept; unlike
        Tensor.__deepcopy__ the .grad is not copied."""
        if id(self) in memo:
            return memo[id(self)]
        result = type(self)(torch.empty_like(self), self.requires_grad)
        memo[id(self)] = result
        return result
