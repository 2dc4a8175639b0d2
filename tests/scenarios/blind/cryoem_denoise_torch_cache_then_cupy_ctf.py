"""preprocess_session.py -- a cryo-EM preprocessing script for one collection session on a 32 GB
V100, with plain `LD_PRELOAD=liboomguard.so`.  Stage 1 denoises the 4096 x 4096 micrographs with a
PyTorch U-Net (Topaz-style, run on whole micrographs, two at a time); stage 2 estimates the CTF of
the denoised stack with CuPy FFTs:

    model = UNet().cuda().eval()
    with torch.no_grad():
        for pair in micrograph_pairs:
            denoised.append(model(pair.cuda()).cpu())      # back to host memory
    # stage 2 -- CuPy
    stack = cupy.asarray(np.stack(denoised))               # 20 x 4096 x 4096 float32, 1.25 GiB
    spec = cupy.fft.fft2(stack)                             # complex64, 2.5 GiB
    power = cupy.abs(spec) ** 2                             # 1.25 GiB
    radial = rotational_average(power)                      # fails: 1.25 GiB

The U-Net's full-resolution feature maps made PyTorch's caching allocator reserve ~26 GiB during
stage 1.  Every tensor is gone (the results went to the CPU; PyTorch holds 30 MiB of weights), but
the allocator keeps its segments cached and CuPy's pool, which takes memory from the driver with
cudaMalloc, finds ~5 GiB free.  CuPy frees its own pool and retries, then raises OutOfMemoryError.

An expert: torch.cuda.empty_cache() between the stages (PyTorch's cache is invisible to CuPy), or
route CuPy through PyTorch's allocator so both draw on one pool; `del model` changes little.  Not a
smaller batch, fragmentation settings, inference mode or mixed precision (stage 1 is done), not
another process.
"""
import sys

import cupy
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
PIX = 4096 * 4096


class UNet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.enc = torch.nn.Parameter(torch.empty(10 * MiB, device="cuda"))
        self.mid = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))
        self.dec = torch.nn.Parameter(torch.empty(8 * MiB, device="cuda"))

    def forward(self, x):
        n = x.nbytes // (PIX * 4)
        e1 = torch.empty(n * 42 * PIX * 4, device="cuda")           # 42 channels at full resolution: 5.25 GiB
        e1b = torch.empty(n * 42 * PIX * 4, device="cuda")          # second conv of the block (skip)
        del e1
        e2 = torch.empty(n * 84 * PIX, device="cuda")               # pooled, 84 channels at 2048^2
        m = torch.empty(n * 84 * PIX, device="cuda")
        del e2
        up = torch.empty(n * 42 * PIX * 4, device="cuda")           # upsampled to full resolution
        cat = torch.empty(n * 84 * PIX * 4, device="cuda")          # concat with the skip: 10.5 GiB
        del up, e1b, m
        out = torch.empty(n * PIX * 4, device="cuda")
        del cat
        return out


def denoise(n_micrographs):
    model = UNet().eval()
    denoised = []
    with torch.no_grad():
        for i in range(0, n_micrographs, 2):
            pair = torch.empty(2 * PIX * 4, device="cuda")
            out = model(pair)
            denoised.append(out.nbytes)                  # out.cpu(): host copies, nothing kept on the GPU
            del out, pair
    return model, denoised


def rotational_average(power):
    return cupy.empty(power.shape, dtype=cupy.float32)


def estimate_ctf(denoised):
    n = sum(denoised) // (PIX * 4)                                          # 20 micrographs
    stack = cupy.empty((n, 4096, 4096), dtype=cupy.float32)
    spec = cupy.empty((n, 4096, 4096 * 2), dtype=cupy.float32)              # complex64 spectrum
    power = cupy.empty((n, 4096, 4096), dtype=cupy.float32)
    radial = rotational_average(power)
    return stack, spec, power, radial


def main():
    model, denoised = denoise(20)
    return estimate_ctf(denoised)


try:
    main()
except cupy.cuda.memory.OutOfMemoryError:
    scen_truth.mark("fail", 0, 20 * PIX * 4)
    raise
sys.exit(0)
