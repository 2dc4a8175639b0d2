"""torch._C, as far as the adapter uses it."""
from torch import _alloc


def _cuda_attach_out_of_memory_observer(observer):
    from torch import cuda
    if _alloc.broken("attach"):
        raise RuntimeError("fake torch: _cuda_attach_out_of_memory_observer broken on purpose")
    if _alloc.backend_name() == "cudaMallocAsync":
        raise RuntimeError("cudaMallocAsync does not yet support attachOutOfMemoryObserver. "
                           "If you need it, please file an issue describing your use case.")
    if not cuda._cuda_init_done:
        # PyTorch 2.0 crashed here (pytorch#107330); the stand-in refuses loudly instead, so a test
        # notices an adapter that attaches before CUDA is initialised.
        raise RuntimeError("fake torch: observer attached before CUDA initialisation")
    cuda._observers.append(observer)
