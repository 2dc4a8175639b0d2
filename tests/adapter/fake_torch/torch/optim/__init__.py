"""torch.optim, as far as the adapter and the scenarios use it: the global step hooks
(torch.optim.optimizer.register_optimizer_step_post_hook) and two optimizers, SGD and AdamW,
whose step() runs them.  AdamW keeps two state tensors per parameter, made at its first step, as
PyTorch's does; the stand-in computes nothing."""
from torch.optim.optimizer import Optimizer  # noqa: F401
from torch.optim.sgd import SGD  # noqa: F401
from torch.optim.adamw import AdamW  # noqa: F401

# as PyTorch's torch/optim/__init__.py does: the submodules are no attributes of the package (they
# stay in sys.modules, where the adapter finds torch.optim.optimizer)
del optimizer, sgd, adamw  # noqa: F821
