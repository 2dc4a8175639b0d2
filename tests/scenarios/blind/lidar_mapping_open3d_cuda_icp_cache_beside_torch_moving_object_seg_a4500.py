"""build_map.py -- the HD-map team of an autonomous-shuttle start-up turns drive logs into static point-cloud
maps: LiDAR odometry with Open3D's tensor API on the GPU (voxel down-sampling, normals, point-to-plane ICP
against the map built so far), and every 10 sweeps a moving-object segmentation network (a 4DMOS/MapMOS-style
sparse MinkUNet, MinkowskiEngine, which allocates through PyTorch's caching allocator; 150 MB of fp32
weights, a 2.4 GiB peak per window under no_grad) that removes pedestrians and cars from the last 10
sweeps before they go into the map.  Open3D 0.18, PyTorch 2.2, one RTX A4500 (20 GB) in the team's
processing box.  Hesai Pandar128, ~230k points per sweep at 10 Hz; the map is kept at 0.1 m voxels.

    device = o3d.core.Device("CUDA:0")
    global_map = None
    for i, sweep in enumerate(log.sweeps()):
        scan = o3d.t.geometry.PointCloud(o3c.Tensor(sweep.xyz, device=device)).voxel_down_sample(0.1)
        scan.estimate_normals(max_nn=30, radius=0.5)
        if global_map is not None:
            submap = global_map.crop(box_around(pose, 60.0))
            reg = o3d.t.pipelines.registration.icp(scan, submap, 1.0, pose, PointToPlane(), criteria)
            pose = reg.transformation
        window.append(scan.transform(pose))
        if len(window) == 10:
            pts = torch.utils.dlpack.from_dlpack(merge(window).point.positions.to_dlpack())
            with torch.no_grad():
                moving = mos_net(pts)                                  # MinkUNet, through PyTorch
            torch.cuda.empty_cache()         # added after the first OOM "to give Open3D room"
            static = merge(window).select_by_mask(to_o3d(~moving))
            global_map = static if global_map is None else global_map.append(static).voxel_down_sample(0.1)
            window = []

The short test logs (a few hundred sweeps) run.  A 4-minute log (2,400 sweeps) dies with
torch.OutOfMemoryError in the segmentation network's forward pass at sweep 1,060: "Tried to allocate 673.83
MiB ... 588 MiB free ... 1792 MiB allocated by PyTorch, 609 MiB reserved but unallocated".  nvidia-smi shows
this one process holding 19.4 of the card's 20 GiB; PyTorch accounts for 2.4 GiB of it.

What holds the card: Open3D's CUDA memory manager.  On Linux it is MemoryManagerCached: a caching allocator
modelled on PyTorch's (best fit within 4x the request, split, merge) on top of cudaMallocAsync, that gives
blocks back to the driver only when ITS OWN next allocation fails (or when o3d.core.cuda.release_cache() is
called).  The global map grows every window, so every map-sized buffer (append, the voxel hash map, the
crop mask and index, the ICP target index) is a little larger than any cached block it could use, is
allocated anew, and the old ones stay cached.  Open3D's footprint ratchets up to whatever the device has
free, and every torch.cuda.empty_cache() hands PyTorch's freed segments to it.  At the failure Open3D holds
16.4 GiB of cudaMallocAsync blocks, of which 0.2 GiB are live tensors (the map, the window).  PyTorch
cannot get its next segment: the cudaMalloc fails with the memory sitting unused in another library's
cache in the same process.

An expert: the memory is outside PyTorch, cached by Open3D in this process.  First: release Open3D's cache
before the PyTorch step (o3d.core.cuda.release_cache() after the ICP/map update of each window), or keep
the growing map and its crop/downsample on the CPU device so that only the per-sweep work uses CUDA, or
run odometry and segmentation in separate processes.  Wrong first advice: a smaller batch or mixed
precision for the network (it needs 2.4 GiB and the card has 20), torch.cuda.empty_cache() or
expandable_segments (PyTorch caches 0.6 GiB, inside this forward pass; the rest is the other library's
cache, and the user's empty_cache makes it worse), killing other processes (there are none: nvidia-smi's 19.4 GiB is this process),
restarting, a bigger GPU (the map keeps growing).
"""
import ctypes
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB, GiB = 1 << 20, 1 << 30


# ---------------- open3d.core, as far as the memory goes (plain-Python mirror of Open3D 0.18) ----------------
class MemoryManagerCUDA(object):
    """cudaMallocAsync / cudaFreeAsync on the default stream (the device supports memory pools)."""

    def __init__(self):
        self.rt = ctypes.CDLL("libcudart.so.13")
        self.rt.cudaMallocAsync.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_void_p]
        self.rt.cudaFreeAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p]

    def malloc(self, size):
        p = ctypes.c_void_p(0)
        if self.rt.cudaMallocAsync(ctypes.byref(p), size, None) != 0:
            self.rt.cudaGetLastError()
            raise RuntimeError("[Open3D Error] CUDA runtime error: out of memory")
        return p.value

    def free(self, ptr):
        self.rt.cudaFreeAsync(ctypes.c_void_p(ptr), None)


class MemoryManagerCached(object):
    """open3d/core/MemoryManagerCached.cpp: virtual blocks carved from real blocks; best fit in [n, 4n] whose
    real block is at most 4n; split; free merges neighbours; real blocks go back to the device manager only
    when a device allocation fails (just enough of them) or on release_cache()."""
    K_MAX_FRAGMENTATION = 4

    def __init__(self, device_mm):
        self.device_mm = device_mm
        self.real = {}            # real ptr -> [size, sorted list of [ptr, size, free]]
        self.owner = {}           # virtual ptr -> real ptr

    def _extract_free(self, n):
        best = None
        for rptr, (rsize, vblocks) in self.real.items():
            if rsize > self.K_MAX_FRAGMENTATION * n:
                continue
            for vb in vblocks:
                if vb[2] and n <= vb[1] <= self.K_MAX_FRAGMENTATION * n and (best is None or vb[1] < best[1][1]):
                    best = (rptr, vb)
        return best

    def malloc(self, nbytes):
        n = (nbytes + 7) // 8 * 8
        hit = self._extract_free(n)
        if hit is not None:
            rptr, vb = hit
            vblocks = self.real[rptr][1]
            if vb[1] > n:
                vblocks.insert(vblocks.index(vb) + 1, [vb[0] + n, vb[1] - n, True])
                vb[1] = n
            vb[2] = False
            self.owner[vb[0]] = rptr
            return vb[0]
        try:
            ptr = self.device_mm.malloc(n)
        except RuntimeError:
            self._release(n)
            ptr = self.device_mm.malloc(n)          # do not catch the error if it still fails
        self.real[ptr] = [n, [[ptr, n, False]]]
        self.owner[ptr] = ptr
        return ptr

    def free(self, ptr):
        rptr = self.owner.pop(ptr)
        vblocks = self.real[rptr][1]
        i = [vb[0] for vb in vblocks].index(ptr)
        vblocks[i][2] = True
        if i + 1 < len(vblocks) and vblocks[i + 1][2]:
            vblocks[i][1] += vblocks.pop(i + 1)[1]
        if i > 0 and vblocks[i - 1][2]:
            vblocks[i - 1][1] += vblocks.pop(i)[1]

    def _releasable(self):
        return sorted((size, rptr) for rptr, (size, vb) in self.real.items() if len(vb) == 1 and vb[0][2])

    def _release(self, n):
        released = 0
        cand = self._releasable()
        while cand and released < n:
            fit = [c for c in cand if c[0] >= n - released]
            size, rptr = fit[0] if fit else cand[-1]
            cand.remove((size, rptr))
            del self.real[rptr]
            self.device_mm.free(rptr)
            released += size

    def release_cache(self):
        self._release(1 << 62)

    def held(self):
        return sum(size for size, _ in self.real.values())


_mm = MemoryManagerCached(MemoryManagerCUDA())


class o3c(object):
    class Tensor(object):
        """open3d.core.Tensor on CUDA:0: its bytes come from the cached memory manager."""

        def __init__(self, nbytes):
            self.nbytes = int(nbytes)
            self._ptr = _mm.malloc(self.nbytes)

        def __del__(self):
            if getattr(self, "_ptr", None) is not None:
                _mm.free(self._ptr)
                self._ptr = None

    class cuda(object):
        @staticmethod
        def release_cache():
            _mm.release_cache()


class PointCloud(object):
    """open3d.t.geometry.PointCloud: positions and normals, float32"""

    def __init__(self, n, normals=False):
        self.n = int(n)
        self.positions = o3c.Tensor(self.n * 12)
        self.normals = o3c.Tensor(self.n * 12) if normals else None

    def voxel_down_sample(self, voxel_size, keep_ratio):
        table = o3c.Tensor(self.n * 48)                 # the voxel hash map (keys, values, buckets)
        idx = o3c.Tensor(self.n * 8)
        out = PointCloud(self.n * keep_ratio, normals=self.normals is not None)
        del table, idx
        return out

    def estimate_normals(self, max_nn=30, radius=0.5):
        index = o3c.Tensor(self.n * 40)                 # hybrid search index
        nbrs = o3c.Tensor(self.n * max_nn * 8)          # neighbour indices and distances
        cov = o3c.Tensor(self.n * 36)
        self.normals = o3c.Tensor(self.n * 12)
        del index, nbrs, cov

    def crop(self, share):
        mask = o3c.Tensor(self.n)
        idx = o3c.Tensor(self.n * share * 8)
        out = PointCloud(self.n * share, normals=True)
        del mask, idx
        return out

    def transform(self):
        out = PointCloud(self.n, normals=True)
        return out

    def append(self, other):
        return PointCloud(self.n + other.n, normals=True)


def icp(source, target, iterations=30):
    """open3d.t.pipelines.registration.icp, point-to-plane"""
    index = o3c.Tensor(target.n * 40)                   # fixed-radius index over the target
    for _ in range(iterations):
        corr = o3c.Tensor(source.n * 12)
        reduce_buf = o3c.Tensor(source.n * 29 * 4)
        del corr, reduce_buf
    del index
    return "T"


def merge(clouds):
    return PointCloud(sum(c.n for c in clouds), normals=True)


# ---------------- the moving-object segmentation network (PyTorch) ----------------
class MOSNet(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(150 * MiB, device="cuda"), requires_grad=False)

    def forward(self, n_points):
        feats = torch.empty(n_points * 4 * 4, device="cuda")
        skips = []
        for c, stride in ((96, 1), (128, 2), (256, 4), (384, 8)):
            n = n_points // stride
            kmap = torch.empty(n * 27 * 2 * 4, device="cuda")            # kernel map (in, out) pairs
            for block in range(2):                                        # two residual blocks per level
                h = torch.empty(n * c * 4, device="cuda")                 # conv
                h2 = torch.empty(n * c * 4, device="cuda")                # batch norm
                h3 = torch.empty(n * c * 4, device="cuda")                # + residual, relu
                del h, h2
            del kmap
            skips.append(h3)
        for h in reversed(skips):
            up = torch.empty(h.nbytes * 2, device="cuda")                 # transposed conv + concat
            fused = torch.empty(h.nbytes * 2, device="cuda")
            del up, fused
        logits = torch.empty(n_points * 2 * 4, device="cuda")
        del skips, feats
        return logits


mos_net = MOSNet().eval()

# ---------------- the mapping loop ----------------
SWEEPS = 2400
window, global_map = [], None
try:
    for i in range(SWEEPS):
        raw = PointCloud(230_000)
        scan = raw.voxel_down_sample(0.1, keep_ratio=0.4)
        del raw
        scan.estimate_normals(max_nn=30, radius=0.5)
        if global_map is not None:
            submap = global_map.crop(share=min(1.0, 1.6e6 / global_map.n))
            pose = icp(scan, submap)
            del submap
        window.append(scan.transform())
        del scan
        if len(window) == 10:
            merged = merge(window)
            with torch.no_grad():
                torch.cuda.reset_peak_memory_stats()
                moving = mos_net(merged.n)
                peak = torch.cuda.max_memory_allocated()
            torch.cuda.empty_cache()                                      # "to give Open3D room"
            static = merged.voxel_down_sample(0.1, keep_ratio=0.085)      # 10 sweeps -> new map voxels
            del moving, merged
            if global_map is None:
                global_map = static
            else:
                appended = global_map.append(static)
                global_map = appended.voxel_down_sample(0.1, keep_ratio=0.995)
                del appended
            del static
            window = []
            if (i + 1) % 200 == 0:
                free, total = torch.cuda.mem_get_info()
                print("sweep %4d  map %5.2fM pts  open3d holds %5.2f GiB  torch peak %4.2f GiB  free %5.2f GiB"
                      % (i + 1, global_map.n / 1e6, _mm.held() / GiB, peak / GiB, free / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
