from torch.nn.modules.module import Module  # noqa: F401
from torch.nn.modules.conv import Conv1d, Conv2d, Conv3d  # noqa: F401,E402
