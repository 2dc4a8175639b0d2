"""frb_search.py -- a radio-astronomy group's fast-radio-burst search on one Tesla V100 32GB, in one process:
a filterbank file (4096 channels, 64 us samples, 8 bits) is read in blocks of 2^20 samples (67 s); for each
block a small RFI-flagging U-Net (PyTorch, fp16, inference mode) masks interference, then the group's own
numba CUDA kernels dedisperse the block over 1024 DM trials and compute boxcar S/N, and the candidates go
to the host:

    for block in reader.blocks(2**20):
        d_fil = cuda.to_device(block)                                  # numba: 4096 x 2^20 uint8, 4 GiB
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            mask = rfi_net(downsample(torch.as_tensor(d_fil, device="cuda")))   # zero-copy view
        torch.cuda.empty_cache()                                       # "leave the memory to numba"
        apply_mask[grid, tpb](d_fil, cuda.as_cuda_array(mask))
        d_dm = cuda.device_array((1024, 2**20), np.float32)            # numba: 4 GiB
        dedisperse[grid, tpb](d_fil, d_dm, delays)
        d_snr = cuda.device_array((1024, 2**20), np.float32)           # numba: 4 GiB
        boxcar_snr[grid, tpb](d_dm, d_snr, widths)
        cands += find_peaks(d_snr.copy_to_host(), 7.0)

The U-Net runs on the whole block at once (1024 averaged channels x 131,072 averaged samples, 32 base
channels: 8 GiB per full-resolution feature map) and peaks at 20.3 GiB; block 0 goes through with numba
holding only d_fil (4 GiB).  Two things keep numba's memory: d_dm and d_snr of the previous block stay
bound to their names until they are reassigned, after the next block's U-Net; and numba frees device
arrays lazily -- a dropped array joins its context's pending-deallocation queue, flushed only when it
holds more than 10 arrays or more than 20% of the card (6.35 GiB), or when numba's own allocation fails.
So during block 1's U-Net numba holds 16 GiB: the new d_fil (needed), block 0's d_dm and d_snr (stale) and
block 0's d_fil (a pending free).  PyTorch, its cache emptied before, asks for the decoder's full-resolution
map (8 GiB) with 8.4 GiB allocated, 3.2 GiB free and 3.6 GiB of its own segments free in pieces, and fails.

An expert: the memory is this process's, outside PyTorch (numba's device arrays, through the driver API),
12 of the 16 GiB no longer needed: drop d_dm and d_snr once the candidates are on the host, and flush numba's
deferred frees before the torch stage (`cuda.current_context().memory_manager.deallocations.clear()`, or
NUMBA_CUDA_MAX_PENDING_DEALLOCS_COUNT=0), or make both libraries draw from one pool (RMM with numba's EMM
plugin and PyTorch's rmm allocator).  Running the U-Net in tiles would also let it fit, but leaves 12 GiB
wasted: a second step.  Wrong first advice: empty_cache (PyTorch's cache is already empty), a smaller batch
(the U-Net already runs one block), expandable_segments, mixed precision (fp16 already), stopping other
processes (there are none), a bigger GPU.
"""
import ctypes
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
NCHAN, NSAMP, NDM = 4096, 1 << 20, 1024


# ---- numba.cuda, as far as this script uses it: device arrays are cuMemAlloc'd in the primary context by
#      numba's own memory manager (ctypes bindings to the driver) and freed through the context's
#      pending-deallocation queue (numba/cuda/cudadrv/driver.py: _PendingDeallocs) -------------------------
class _Driver(object):
    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        P = ctypes.POINTER
        self.lib.cuInit.argtypes = [ctypes.c_uint]
        self.lib.cuDeviceGet.argtypes = [P(ctypes.c_int), ctypes.c_int]
        self.lib.cuDevicePrimaryCtxRetain.argtypes = [P(ctypes.c_void_p), ctypes.c_int]
        self.lib.cuCtxPushCurrent_v2.argtypes = [ctypes.c_void_p]
        self.lib.cuMemAlloc_v2.argtypes = [P(ctypes.c_uint64), ctypes.c_size_t]
        self.lib.cuMemFree_v2.argtypes = [ctypes.c_uint64]
        self.lib.cuMemGetInfo_v2.argtypes = [P(ctypes.c_size_t), P(ctypes.c_size_t)]
        self.ctx = None

    def init(self):
        if self.ctx is None:
            self.lib.cuInit(0)
            dev = ctypes.c_int()
            self.lib.cuDeviceGet(ctypes.byref(dev), 0)
            ctx = ctypes.c_void_p()
            self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev)
            self.lib.cuCtxPushCurrent_v2(ctx)
            self.ctx = ctx

    def mem_info(self):
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.lib.cuMemGetInfo_v2(ctypes.byref(free), ctypes.byref(total))
        return free.value, total.value


driver = _Driver()


class CudaAPIError(Exception):
    pass


class _PendingDeallocs(object):
    CUDA_DEALLOCS_COUNT = 10
    CUDA_DEALLOCS_RATIO = 0.2

    def __init__(self, capacity):
        self._cons = []
        self._size = 0
        self.memory_capacity = capacity

    @property
    def _max_pending_bytes(self):
        return int(self.memory_capacity * self.CUDA_DEALLOCS_RATIO)

    def add_item(self, dtor, handle, size):
        self._cons.append((dtor, handle, size))
        self._size += int(size)
        if len(self._cons) > self.CUDA_DEALLOCS_COUNT or self._size > self._max_pending_bytes:
            self.clear()

    def clear(self):
        while self._cons:
            dtor, handle, size = self._cons.pop(0)
            dtor(handle)
        self._size = 0

    def __len__(self):
        return len(self._cons)


class _MemoryManager(object):
    def __init__(self):
        driver.init()
        self.deallocations = _PendingDeallocs(driver.mem_info()[1])

    def memalloc(self, nbytes):
        ptr = ctypes.c_uint64()
        if driver.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes) != 0:
            self.deallocations.clear()                        # numba's own retry: flush, then try again
            if driver.lib.cuMemAlloc_v2(ctypes.byref(ptr), nbytes) != 0:
                raise CudaAPIError("[2] Call to cuMemAlloc results in CUDA_ERROR_OUT_OF_MEMORY")
        return ptr.value


class _Context(object):
    def __init__(self):
        self.memory_manager = _MemoryManager()
        self.deallocations = self.memory_manager.deallocations


_ctx = []


def current_context():
    if not _ctx:
        _ctx.append(_Context())
    return _ctx[0]


class DeviceNDArray(object):
    def __init__(self, shape, itemsize):
        self.shape, self.itemsize = shape, itemsize
        self.nbytes = itemsize
        for d in shape:
            self.nbytes *= d
        self._mm = current_context().memory_manager
        self.ptr = self._mm.memalloc(self.nbytes)

    @property
    def __cuda_array_interface__(self):
        return {"shape": self.shape, "data": (self.ptr, False), "version": 3}

    def copy_to_host(self):
        return ("host", self.nbytes)

    def __del__(self):
        try:
            self._mm.deallocations.add_item(driver.lib.cuMemFree_v2, self.ptr, self.nbytes)
        except Exception:
            pass


class cuda(object):
    @staticmethod
    def to_device(host_block):
        return DeviceNDArray(host_block, 1)

    @staticmethod
    def device_array(shape, dtype_size):
        return DeviceNDArray(shape, dtype_size)

    @staticmethod
    def as_cuda_array(t):
        return t

    current_context = staticmethod(current_context)


class _Kernel(object):
    """@cuda.jit kernel: kernel[grid, tpb](args) launches it (the stand-in computes nothing)."""

    def __getitem__(self, config):
        return lambda *args: None


apply_mask, dedisperse, boxcar_snr = _Kernel(), _Kernel(), _Kernel()


# ---- the RFI-flagging U-Net (PyTorch) --------------------------------------------------------------------
class RFIUNet(torch.nn.Module):
    """2D U-Net over (channel, time), 32 base channels, 7.8M parameters; the input is the block averaged 4x in
    frequency and 8x in time: 1024 x 131,072 pixels."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(7_800_000 * 4, device="cuda"), requires_grad=False)

    def forward(self, x):
        px = 1024 * 131_072
        enc1a = torch.empty(px * 32 * 2, dtype=torch.uint8, device="cuda")     # conv1a, fp16: 8 GiB
        enc1 = torch.empty(px * 32 * 2, dtype=torch.uint8, device="cuda")      # conv1b (the skip): 8 GiB
        del enc1a
        enc2 = torch.empty(px // 4 * 64 * 2, dtype=torch.uint8, device="cuda")
        enc3 = torch.empty(px // 16 * 128 * 2, dtype=torch.uint8, device="cuda")
        dec2 = torch.empty(px // 4 * 64 * 2, dtype=torch.uint8, device="cuda")
        del enc3, enc2
        dec1 = torch.empty(px * 32 * 2, dtype=torch.uint8, device="cuda")
        del enc1, dec2
        mask = torch.empty(px, dtype=torch.uint8, device="cuda")
        return mask


class _ArrayView(object):
    """torch.as_tensor(numba_array, device="cuda"): a tensor over numba's memory (__cuda_array_interface__),
    no copy."""

    def __init__(self, arr):
        self.nbytes = arr.nbytes
        self._arr = arr


def as_tensor(arr, device=None):
    return _ArrayView(arr)


def downsample(x):
    """(4096, 2^20) uint8 -> (1024, 131072) float16: average 4 channels and 8 samples."""
    return torch.empty(1024 * 131_072 * 2, dtype=torch.uint8, device="cuda")


def find_peaks(snr_host, threshold):
    return []


def blocks(n_blocks):
    for i in range(n_blocks):
        yield (NCHAN, NSAMP)


try:
    rfi_net = RFIUNet().cuda().eval()
    cands = []
    for i, block in enumerate(blocks(40)):
        d_fil = cuda.to_device(block)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            mask = rfi_net(downsample(as_tensor(d_fil, device="cuda")))
        print("block %d: torch peak %.1f GiB, numba pending frees %d (%.1f GiB)" % (
            i, torch.cuda.max_memory_allocated() / GiB, len(cuda.current_context().deallocations),
            cuda.current_context().deallocations._size / GiB))
        torch.cuda.empty_cache()
        apply_mask[4096, 256](d_fil, cuda.as_cuda_array(mask))
        d_dm = cuda.device_array((NDM, NSAMP), 4)
        dedisperse[(NDM, 1024), 256](d_fil, d_dm, None)
        d_snr = cuda.device_array((NDM, NSAMP), 4)
        boxcar_snr[(NDM, 1024), 256](d_dm, d_snr, None)
        cands += find_peaks(d_snr.copy_to_host(), 7.0)
        torch.cuda.reset_peak_memory_stats()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
