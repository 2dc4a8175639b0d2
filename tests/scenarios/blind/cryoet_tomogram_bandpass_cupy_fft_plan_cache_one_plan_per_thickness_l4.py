"""bandpass_tomos.py -- a cryo-electron-tomography lab pre-filters a session's tomograms on the GPU before
particle picking: a 3D band-pass + CTF phase flip done with CuPy FFTs, one tomogram after another, on a
cloud L4 (23,034 MiB), run with plain `LD_PRELOAD=liboomguard.so python bandpass_tomos.py *.mrc`:

    import cupy as cp, mrcfile
    for path in tomograms:                                      # 1024 x 1024 x Z float32 volumes
        vol = cp.asarray(mrcfile.read(path))                   # Z from each tilt series' thickness: 296..364
        spec = cp.fft.rfftn(vol)                               # complex64, 1024 x 1024 x (Z//2 + 1)
        spec *= bandpass_ctf(spec.shape, defocus[path])        # float32 filter of the spectrum's shape
        out = cp.fft.irfftn(spec, s=vol.shape)
        mrcfile.write(out_path(path), out.get())
        del vol, spec, out                                     # nothing is kept from one tomogram to the next

Every array is dropped after its tomogram, and the script keeps nothing -- but CuPy does.  cupy.fft caches
cuFFT plans per device (cupy.fft.config.get_plan_cache(): LRU of 16 plans, no memory limit by default),
keyed by shape, and every plan owns its work area, allocated from CuPy's memory pool and held as long as
the plan is cached.  A 3D plan of this size needs a work area about the size of the spectrum (1024 x 1024 x
~170 x 8 B = 1.4 GB), and each tomogram has its own thickness, so each brings two new plans (R2C forward,
C2R inverse): +2.8 GB of live pool memory per tomogram that the 16-plan cache would only start evicting at
the 9th.  One tomogram's own arrays are ~5.5 GB (volume, spectrum, filter, output).  After six tomograms the
cache holds 12 plans (15.4 GiB of work areas); the 7th tomogram (Z = 336) adds its two plans (14 plans,
18.0 GiB) and then its inverse FFT's 1.31 GiB output no longer fits (0.85 GiB free, 0.55 GiB cached in split
blocks): CuPy frees its cached free blocks, retries, and raises OutOfMemoryError -- in a loop iteration that
needs no more than the ones before it, with "used" memory in CuPy's pool (20.6 GiB at the failure) rising by
the same step every tomogram, as if the script leaked.  (Along the way CuPy's pool twice recovered from a
failed cudaMalloc by freeing its cached blocks.)

What an expert says first: the memory is CuPy's cuFFT plan cache, not the script's arrays: bound it --
`cp.fft.config.get_plan_cache().set_memsize(4 * 2**30)` (or `set_size(2)`: only the current shape's two
plans) -- or pad every volume to one fixed shape so a single pair of plans is reused.  Wrong advice: "release
references / del the arrays" (the script already deletes everything; nothing it names holds the memory),
free_all_blocks / empty_cache (the pool already frees its free blocks before raising; the plans' work areas
are in use), PyTorch allocator settings (no PyTorch here), a smaller batch or mixed precision (one volume
at a time, no model), and a bigger GPU (it would only give the cache room to grow to its 16 plans, ~21 GiB of
work areas for shapes that never come back).
"""
import collections
import sys
import types

import cupy as cp

import scen_truth

# ---- cupy.fft as CuPy ships it (the stand-in CuPy has no cupy.fft): cupy/fft/_cache.pyx's PlanCache in
# miniature -- an LRU of plans per device, size 16 and memsize -1 (unlimited) by default -- and plans whose
# work area comes from the current memory pool, as cupy.cuda.cufft.PlanNd's `self.work_area = memory.alloc(...)`.


class PlanNd(object):
    def __init__(self, shape, fft_type, work_size):
        self.shape, self.fft_type = shape, fft_type
        self.work_area = cp.get_default_memory_pool().malloc(work_size)
        self.work_size = work_size


class PlanCache(object):
    def __init__(self, size=16, memsize=-1):
        self.size, self.memsize = size, memsize
        self._cache = collections.OrderedDict()
        self._curr_memsize = 0

    def get(self, key):
        plan = self._cache.get(key)
        if plan is not None:
            self._cache.move_to_end(key)
        return plan

    def __setitem__(self, key, plan):
        self._cache[key] = plan
        self._curr_memsize += plan.work_size
        while len(self._cache) > self.size or (self.memsize >= 0 and self._curr_memsize > self.memsize):
            _, old = self._cache.popitem(last=False)
            self._curr_memsize -= old.work_size

    def set_memsize(self, n):
        self.memsize = n

    def set_size(self, n):
        self.size = n


_plan_caches = {}


def get_plan_cache():
    dev = cp.cuda.runtime.getDevice()
    if dev not in _plan_caches:
        _plan_caches[dev] = PlanCache()
    return _plan_caches[dev]


def _get_plan(shape, fft_type, work_size):
    cache = get_plan_cache()
    key = (shape, fft_type)
    plan = cache.get(key)
    if plan is None:
        plan = PlanNd(shape, fft_type, work_size)
        cache[key] = plan
    return plan


def rfftn(a):
    nx, ny, nz = a.shape
    out_shape = (nx, ny, nz // 2 + 1)
    _get_plan(a.shape, "R2C", nx * ny * (nz // 2 + 1) * 8)
    return cp.empty(out_shape + (2,), cp.float32)        # complex64 (the stand-in has no complex dtype)


def irfftn(a, s):
    nx, ny, nzc = a.shape[:3]
    _get_plan(tuple(s), "C2R", nx * ny * nzc * 8)
    return cp.empty(tuple(s), cp.float32)


cp.fft = types.ModuleType("cupy.fft")
cp.fft.rfftn, cp.fft.irfftn = rfftn, irfftn
cp.fft.config = types.ModuleType("cupy.fft.config")
cp.fft.config.get_plan_cache = get_plan_cache
sys.modules["cupy.fft"], sys.modules["cupy.fft.config"] = cp.fft, cp.fft.config
# ---- end of cupy.fft


THICKNESS = [312, 296, 344, 328, 364, 304, 336, 320, 352, 300, 348, 316]     # Z of each tomogram, this session


def bandpass_ctf(shape, defocus):
    """The band-pass x CTF phase-flip filter for the spectrum, float32."""
    return cp.empty(shape, cp.float32)


_total_before_release = [0]


def watch_pool_release():
    """Test scaffolding: note the pool's size each time it frees its free blocks before a retry, for the mark."""
    p = cp.get_default_memory_pool()._pool()
    plain = p.free_all_blocks

    def free_all_blocks():
        _total_before_release[0] = p.total()
        plain()
    p.free_all_blocks = free_all_blocks


def mark_cupy_oom(err):
    """Truth mark (test scaffolding): the cudaMalloc CuPy's pool made for the failing request (its size, rounded
    to 512 B, is in the message), what the pool holds and what it gave back between its two attempts."""
    import re
    size = int(re.search(r"allocating ([0-9,]+) bytes", str(err)).group(1).replace(",", ""))
    pool = cp.get_default_memory_pool()
    scen_truth.mark("fail", 0, size, allocated=pool.used_bytes(), reserved=pool.total_bytes(),
                    released=_total_before_release[0] - pool.total_bytes(), fw=1)


def main():
    watch_pool_release()
    for i, z in enumerate(THICKNESS):
        shape = (1024, 1024, z)
        try:
            vol = cp.empty(shape, cp.float32)                               # cp.asarray(mrcfile.read(path))
            spec = cp.fft.rfftn(vol)
            filt = bandpass_ctf(spec.shape[:3], 2.5 + 0.1 * i)
            del filt                                                        # spec *= filter (in place)
            out = cp.fft.irfftn(spec, s=vol.shape)
        except cp.cuda.memory.OutOfMemoryError as e:
            mark_cupy_oom(e)
            raise
        del vol, spec, out                                                  # written out with out.get()
    return 0


if __name__ == "__main__":
    sys.exit(main())
