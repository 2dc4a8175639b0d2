"""infer_liver_segments.py -- a hospital research group's batch inference of liver / Couinaud-segment / tumour
segmentation on four-phase contrast CT (non-contrast, arterial, portal venous, delayed), on the department's
inference server, a Tesla T4 (16 GB).  Run with plain `LD_PRELOAD=liboomguard.so python infer.py`.

The preprocessing used to run on the CPU (SimpleITK, 4 minutes a study).  A colleague rewrote it on the GPU
with CuPy and kept its interface (it returns numpy, as the SimpleITK version did):

    import cupy as cp
    from cupyx.scipy import ndimage

    def preprocess(study):                        # -> np.ndarray, 4 x 560 x 400 x 400 float32
        fixed = resample_iso(cp.asarray(study.phase("PV").get_fdata(dtype=np.float32)))   # 1.0 mm iso
        grad_fixed = cp.stack(cp.gradient(fixed))                                        # 3 x V float32
        phases = [fixed]
        for name in ("NC", "ART", "DEL"):
            moving = resample_iso(cp.asarray(...))      # ndimage.affine_transform(order=3): float64 prefilter
            phases.append(demons_register(moving, fixed, grad_fixed))   # displacement + update fields, 3 x V
        return cp.asnumpy(normalize(cp.stack(phases)))

    model = DynUNet(spatial_dims=3, in_channels=4, out_channels=11, ...).cuda().eval()   # nnU-Net-like, 31 M
    for study in studies:
        image = torch.from_numpy(preprocess(study)).cuda()[None]
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            logits = sliding_window_inference(image, (128, 128, 128), sw_batch_size=4, predictor=model,
                                              overlap=0.5, mode="gaussian")   # stitched on the GPU
        seg = logits.softmax(1).argmax(1)

Every CuPy array is gone when preprocess() returns, but CuPy's default memory pool keeps every block it took:
10.7 GiB -- the demons registration's fields (per phase: displacement, update and smoothing buffers plus the
fixed image's gradient, 3 x 89.6 M voxels x 4 B = 1.0 GiB each), the float64 spline coefficients of each
560 MiB input, the resampled phases, and three 1.3 GiB blocks for the 4-phase stack and its normalisation
(no freed block was large enough for those, so the pool took new ones).  The blocks are idle, cached in the
process and invisible to torch; torch.cuda.empty_cache() does not touch them.  The torch side then wants, on
the first study: weights 124 MB, the 4-channel input 1.3 GiB, the stitched 11-class output 3.7 GiB, the count
map 0.3 GiB and each window batch's fp16 activations (~2 GiB, transient): ~7.7 GiB at its peak, which the
14.5 GiB this card gives a process holds easily on its own -- but not beside 10.7 GiB of CuPy's idle blocks.
It fails as sliding_window_inference allocates its 3.7 GiB output buffer, on the very first study (2.3 GiB
free).  Neither part leaks; each fits alone.

What an expert says first: release CuPy's cached pool after preprocessing
(cp.get_default_memory_pool().free_all_blocks(), or cap it: set_limit / CUPY_GPU_MEMORY_LIMIT, or have CuPy
allocate from PyTorch's allocator) -- the memory is another framework's cache in this same process.  Wrong:
torch.cuda.empty_cache() (torch's cache is not the one holding it), expandable_segments, stopping other
processes (there are none), smaller sw_batch_size / mixed precision / inference_mode as the fix (it already
runs fp16 under no_grad, and the window activations are not what fails), a bigger GPU.  Stitching on the CPU
(sliding_window_inference(..., device="cpu")) would get this study through too, but leaves 10.7 GiB idle on
the card: a second line, not the first.
"""
import sys

import cupy as cp
import torch
from torch import nn

import scen_truth

MiB = 1 << 20
FP32 = 4

# a study: portal-venous grid 512 x 512 x 560 (0.78 mm pixels, 1 mm slices), resampled to 1.0 mm isotropic
RAW = (560, 512, 512)
ISO = (560, 400, 400)
V = 560 * 400 * 400                    # 89.6 M voxels


# --- preprocessing (CuPy).  The stand-in CuPy has arrays and the pool, not cupyx.scipy.ndimage: these helpers
# allocate what the real calls allocate.
def load_phase(study, name):
    return cp.empty(RAW, dtype=cp.float32)            # cp.asarray(nib.load(...).get_fdata(dtype=np.float32))


def resample_iso(raw):
    """ndimage.affine_transform(raw, A, output_shape=ISO, order=3): spline_filter makes float64 coefficients of
    the whole input first."""
    coeffs = cp.empty(raw.shape, dtype=cp.float64)
    out = cp.empty(ISO, dtype=cp.float32)
    del coeffs
    return out


def gradient3(vol):
    return cp.empty((3,) + ISO, dtype=cp.float32)     # cp.stack(cp.gradient(vol))


def gaussian_smooth(field):
    tmp = cp.empty(field.shape, dtype=cp.float32)      # ndimage.gaussian_filter, one axis at a time
    out = cp.empty(field.shape, dtype=cp.float32)
    del tmp
    return out


def demons_register(moving, fixed, grad_fixed, iterations=(30, 20)):
    """Thirion demons, two levels: displacement field, update field (smoothed), warped moving image."""
    disp = cp.empty((3,) + ISO, dtype=cp.float32)
    for level_iters in iterations:
        for _ in range(2):                              # (the stand-in runs two of each level's iterations)
            warped = cp.empty(ISO, dtype=cp.float32)    # ndimage.map_coordinates(moving, grid + disp)
            diff = cp.empty(ISO, dtype=cp.float32)
            update = cp.empty((3,) + ISO, dtype=cp.float32)
            del warped, diff
            update = gaussian_smooth(update)            # disp += smoothed update (in place)
            del update
    out = cp.empty(ISO, dtype=cp.float32)              # the moving phase warped onto the fixed grid
    del disp
    return out


def normalize(stacked):
    tmp = cp.empty(stacked.shape, dtype=cp.float32)    # clip(-100, 250), then (x - mean) / std
    out = cp.empty(stacked.shape, dtype=cp.float32)
    del tmp
    return out


class HostArray(object):
    """What cp.asnumpy returns: host memory (no device bytes)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def preprocess(study):
    fixed = resample_iso(load_phase(study, "PV"))
    grad_fixed = gradient3(fixed)
    phases = [fixed]
    for name in ("NC", "ART", "DEL"):
        moving = resample_iso(load_phase(study, name))
        phases.append(demons_register(moving, fixed, grad_fixed))
        del moving
    stacked = cp.empty((4,) + ISO, dtype=cp.float32)   # cp.stack(phases)
    del phases, fixed, grad_fixed
    out = normalize(stacked)
    host = HostArray(out.nbytes)                        # cp.asnumpy(out): a copy in host memory
    del out, stacked
    return host                                         # every CuPy array gone; the pool keeps its blocks


# --- inference (torch / MONAI)
class DynUNet(nn.Module):
    """nnU-Net-like 3D U-Net, 6 stages (32..320 filters), 4 input channels, 11 output classes: 31 M parameters.
    The stand-in computes nothing; under no_grad each stage's output lives while the decoder still needs it
    (the skips), the rest is freed as soon as the next layer has run."""

    FILTERS = (32, 64, 128, 256, 320, 320)

    def __init__(self, in_channels=4, out_channels=11):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(31 * 1000 * 1000 * FP32, device="cuda"))
        self.out_channels = out_channels

    def forward(self, x, batch, roi):
        voxels = roi[0] * roi[1] * roi[2]
        skips = []
        for stage, f in enumerate(self.FILTERS):
            v = voxels // 8 ** stage
            a = torch.empty(batch * f * v, dtype=torch.float16, device="cuda")       # conv-IN-LReLU
            b = torch.empty(batch * f * v, dtype=torch.float16, device="cuda")       # conv-IN-LReLU
            del a
            skips.append(b)
        x = skips.pop()
        for stage in range(len(self.FILTERS) - 2, -1, -1):
            f, v = self.FILTERS[stage], voxels // 8 ** stage
            up = torch.empty(batch * f * v, dtype=torch.float16, device="cuda")      # transposed conv
            cat = torch.empty(batch * 2 * f * v, dtype=torch.float16, device="cuda")  # cat(up, skip)
            del up, x
            skips.pop()
            x = torch.empty(batch * f * v, dtype=torch.float16, device="cuda")       # conv block
            del cat
        return torch.empty(batch * self.out_channels * voxels, dtype=torch.float32, device="cuda")


def sliding_window_inference(image, roi, sw_batch_size, predictor, overlap=0.5, out_channels=11):
    """monai.inferers.sliding_window_inference with sw_device = device = the GPU: the output and the count map
    are full-volume tensors on the GPU; windows run sw_batch_size at a time."""
    importance = torch.empty(roi[0] * roi[1] * roi[2], dtype=torch.float32, device="cuda")   # gaussian map
    output = torch.empty(out_channels * V, dtype=torch.float32, device="cuda")
    count = torch.empty(V, dtype=torch.float32, device="cuda")
    steps = [int(-(-(s - r) // (r * (1 - overlap)))) + 1 for s, r in zip(ISO, roi)]
    n_windows = steps[0] * steps[1] * steps[2]
    for start in range(0, n_windows, sw_batch_size):
        batch = min(sw_batch_size, n_windows - start)
        win = torch.empty(batch * 4 * roi[0] * roi[1] * roi[2], dtype=torch.float32, device="cuda")
        seg = predictor(win, batch, roi)
        del win, seg                                    # added into output / count in place
    del importance, count
    return output


def main():
    model = DynUNet(in_channels=4, out_channels=11).eval()
    studies = ["LIVER-MPCT-%03d" % i for i in range(1, 41)]
    scen_truth.note_every_empty(torch)
    for study in studies:
        host = preprocess(study)
        image = torch.empty(host.nbytes, device="cuda")            # torch.from_numpy(...).cuda()[None]
        try:
            with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
                logits = sliding_window_inference(image, (128, 128, 128), 4, model, overlap=0.5)
            seg = torch.empty(V * 8, device="cuda")                 # softmax(1).argmax(1): int64 labels
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark()
            raise
        print("%s: segmented, CuPy pool %.1f GiB" % (study, cp.get_default_memory_pool().total_bytes() / 2 ** 30))
        del image, logits, seg
    return 0


if __name__ == "__main__":
    sys.exit(main())
