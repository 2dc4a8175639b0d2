"""reindex_footage.py -- a logistics company re-indexes 30 days of footage from the 412 ceiling fisheye
cameras of its depots (people / forklift near-miss search).  One AWS g4dn.xlarge (Tesla T4, 16 GB,
14.5 GiB usable), YOLOv8x in fp16 under torch.inference_mode().  Each clip is decoded on the host (2880 x
2880 fisheye frames), moved to the GPU, dewarped to a 3840 x 2160 panorama with F.grid_sample, letterboxed
to 1280 x 736 and run through the detector, 16 frames a batch.  The dewarp map of a camera comes from its
calibration (cv2.fisheye.initUndistortRectifyMap, 0.8 s on the CPU for a 4K map), and each camera
recurs every few minutes in the time-ordered clip index, so the map is memoized:

    @functools.lru_cache(maxsize=None)
    def dewarp_maps(camera_id):
        K, D = calib[camera_id]
        mapx, mapy = cv2.fisheye.initUndistortRectifyMap(K, D, np.eye(3), P, (3840, 2160), cv2.CV_32FC1)
        grid = torch.from_numpy(np.stack([mapx, mapy], -1)).cuda()       # normalized to [-1, 1]
        valid = torch.from_numpy(inside_circle(mapx, mapy)).float().cuda()
        return grid[None], valid[None, None]

    for clip in index.sorted_by_time(since="2026-11-01"):
        grid, valid = dewarp_maps(clip.camera_id)
        ...
        pano = F.grid_sample(frames, grid.expand(n, -1, -1, -1), align_corners=False) * valid

Each camera's entry is a 3840 x 2160 float32 grid (66 MB) and mask (33 MB): 100 MB that stays on the GPU
for good.  The developer thought of "a map per camera" as small; 412 of them are 41 GB.  A batch needs
about 1.7 GB of working memory (the uint8 frames, their fp16 copy, the 0.8 GB panorama, the detector's
activations), freed after each clip; every camera seen for the first time adds 100 MB that is never
freed.  After 133 distinct cameras (25 minutes of footage into the first day, 150 clips) the maps hold
12.4 GiB and the detector's forward can no longer get a 288 MB activation: the job dies.

An expert: an unbounded memo cache of tensors on the GPU, one entry per camera, grows until it fills the
card.  Bound it (lru_cache(maxsize=16)) and read the index grouped by camera so the bound does not
thrash, or keep the maps on the host (pinned) and move the current camera's, or compute the grid on
the GPU per clip (a closed-form function of K and D, milliseconds).  Wrong first advice: a smaller
batch or a smaller panorama (buys a few cameras), fp16 / quantization (already fp16; the maps are the
problem), inference_mode (already on), empty_cache or expandable_segments (the maps are live tensors
the cache references), a bigger GPU first (an 80 GB card would hold all 412 maps, 41 GB, at five
times the price, until the next depot's cameras are added).
"""
import functools
import os
import random
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ops the stand-in lacks, written as PyTorch's (C++ there: no frame of the program's), under a torch file name
_TORCH_OPS = '''
class _HostTensor(object):
    """torch.from_numpy(a): a CPU tensor over a host array of nbytes."""
    is_cuda = False

    def __init__(self, nbytes, dtype="uint8"):
        self.nbytes, self.dtype = nbytes, dtype

    def float(self):
        return _HostTensor(self.nbytes * 4 // _ITEMSIZE[self.dtype], "float32")

    def cuda(self, device=None, non_blocking=False):
        return empty(self.nbytes // _ITEMSIZE[self.dtype], dtype=self.dtype, device="cuda")


def from_numpy(a):
    return _HostTensor(a.nbytes, a.dtype)


def _to_half_scaled(t):
    """frames.half().div_(255): a new float16 tensor of the same element count."""
    return empty(t.nbytes, dtype=float16, device=t.device)


def _grid_sample(input, grid, mode="bilinear", padding_mode="zeros", align_corners=None):
    """F.grid_sample: an output of the input's batch and channels at the grid's height x width."""
    return empty(input._n * input._c * grid._hw, dtype=input.dtype, device=input.device)


def _letterbox(input, size):
    return empty(input._n * input._c * size[0] * size[1], dtype=input.dtype, device=input.device)
'''
exec(compile(_TORCH_OPS, os.path.join(os.path.dirname(torch.__file__), "functional.py"), "exec"), torch.__dict__)
F.grid_sample = torch._grid_sample

PANO_W, PANO_H = 3840, 2160
FISHEYE = 2880
BATCH = 16


class ndarray(object):
    def __init__(self, nbytes, dtype="float32"):
        self.nbytes, self.dtype = nbytes, dtype


class cv2_fisheye(object):
    @staticmethod
    def initUndistortRectifyMap(K, D, R, P, size, m1type):
        w, h = size
        return ndarray(w * h * 4), ndarray(w * h * 4)


def inside_circle(mapx, mapy):
    return ndarray(mapx.nbytes // 4, "uint8")


def np_stack_xy(mapx, mapy):
    return ndarray(mapx.nbytes + mapy.nbytes)


calib = {}


@functools.lru_cache(maxsize=None)
def dewarp_maps(camera_id):
    K, D = calib[camera_id]
    mapx, mapy = cv2_fisheye.initUndistortRectifyMap(K, D, None, None, (PANO_W, PANO_H), "CV_32FC1")
    grid = torch.from_numpy(np_stack_xy(mapx, mapy)).cuda()
    grid._hw = PANO_W * PANO_H
    valid = torch.from_numpy(inside_circle(mapx, mapy)).float().cuda()
    return grid, valid


class C2f(torch.nn.Module):
    def __init__(self, n_params):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_params, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class DetectionModel(torch.nn.Module):
    """ultralytics YOLOv8x (68.2M parameters), fused, .half()."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, n in enumerate((1_200_000, 9_800_000, 19_700_000, 26_400_000, 11_100_000)):
            setattr(self, "stage%d" % i, C2f(n))

    def forward(self, x):
        n = x._n
        feats = []
        # stem and stages at 1280 x 736 (fp16): each stage's output kept only as long as the neck needs it
        h, w, c = 368, 640, 80
        prev = torch.empty(n * c * h * w, dtype=torch.float16, device="cuda")
        for i in range(1, 5):
            h, w, c = h // 2, w // 2, min(c * 2, 640)
            split = torch.empty(n * c * h * w * 3, dtype=torch.float16, device="cuda")   # C2f concat
            out = torch.empty(n * c * h * w, dtype=torch.float16, device="cuda")
            del split
            if i >= 2:
                feats.append(out)
            prev = out
        head = torch.empty(n * 84 * 19_320, dtype=torch.float16, device="cuda")
        del feats, prev
        return head


class Clip(object):
    def __init__(self, camera_id, t):
        self.camera_id, self.t = camera_id, t

    def decode(self):
        """PyAV decode on the host: 16 fisheye frames, uint8 HWC."""
        return ndarray(BATCH * FISHEYE * FISHEYE * 3, "uint8")


def sorted_by_time(cameras, minutes):
    rng = random.Random(20261101)
    for m in range(minutes):
        for cam in rng.sample(cameras, 6):         # ~6 cameras with motion per minute
            yield Clip(cam, m)


cameras = ["%s-%03d" % (depot, k) for depot in ("DUS", "HAM", "LEJ", "NUE") for k in range(103)]
for cam in cameras:
    calib[cam] = ("K", "D")

try:
    model = DetectionModel().cuda().eval()
    done = 0
    with torch.inference_mode():
        for clip in sorted_by_time(cameras, 60 * 24 * 30):
            grid, valid = dewarp_maps(clip.camera_id)
            frames = torch.from_numpy(clip.decode()).cuda(non_blocking=True)
            frames = torch._to_half_scaled(frames)
            frames._n, frames._c = BATCH, 3
            pano = F.grid_sample(frames, grid, align_corners=False)
            pano._n, pano._c = BATCH, 3
            del frames
            x = torch._letterbox(pano, (736, 1280))
            x._n = BATCH
            del pano
            dets = model(x)
            del x, dets
            done += 1
            if done % 100 == 0:
                info = dewarp_maps.cache_info()
                print("clips %d, cameras seen %d, allocated %.1f GiB" % (
                    done, info.currsize, torch.cuda.memory_allocated() / float(1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
