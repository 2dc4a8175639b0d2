"""torch.nn, as far as the role and phase tests use it: Module (parameters, buffers, submodules,
__call__ -> _call_impl -> forward, to/cuda/_apply, load_state_dict) and Parameter; functional and parallel as
far as the scenario programs use them (nn/functional.py, nn/parallel)."""
from torch.nn.parameter import Parameter  # noqa: F401
from torch.nn.modules.module import Module  # noqa: F401
from torch.nn import modules  # noqa: F401
from torch.nn.modules.conv import Conv1d, Conv2d, Conv3d  # noqa: F401,E402
from torch.nn import functional  # noqa: F401,E402
from torch.nn import parallel  # noqa: F401,E402
