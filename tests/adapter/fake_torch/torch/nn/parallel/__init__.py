"""torch.nn.parallel, as far as the scenario programs use it: DistributedDataParallel."""
from torch.nn.parallel.distributed import DistributedDataParallel  # noqa: F401
