"""train_imagenet.py -- a platform team benchmarks its new input pipeline with the classic recipe: ResNet-50 on
ImageNet-1k, batch 256, SGD with momentum, fp16 autocast, on one V100-SXM2-32GB (31.7 GiB
usable).  Instead of DALI they use their own GPU JPEG decoder, a small C++ library on nvJPEG loaded with
ctypes (libgpujpeg.so): it decodes a batch on the GPU, resizes and crops into a PyTorch tensor it gets
from the caller.  Baseline JPEGs go through a path with buffers it reuses; the few thousand ImageNet files
that are progressive JPEGs (~0.3%) need nvJPEG's GPU-hybrid path, for which the library cudaMallocs a
DCT-coefficient buffer per batch (0.2-0.7 MiB per progressive image).  Its cleanup sits after an early
return added for the CMYK fallback, so that buffer is never freed:

    images = torch.empty((256, 3, 224, 224), dtype=torch.uint8, device="cuda")
    decoder.decode_resize_crop(jpeg_bytes, out=images)       # ctypes -> libgpujpeg.so

PyTorch never sees this memory: memory_allocated() between steps is flat (0.1 GiB: weights and momentum),
reserved is flat (9.7 GiB, the activations' cache), while nvidia-smi climbs ~1 GiB per 1,000 steps (11.2
GiB at step 1,000, 19.6 GiB in epoch 2, 28.1 GiB in epoch 4).  Near the end of epoch 4, 1 h 20 in, ~11,000
leaked buffers hold ~21 GiB and the library's own cudaMalloc for the next batch fails: "gpujpeg:
cudaMalloc(533950) failed: out of memory" from decode_resize_crop, with PyTorch holding its 9.6 GiB
activation cache (unused between steps, needed by the next forward).

An expert: growth outside the framework.  The process's usage (NVML) minus PyTorch's reservation rises
step after step, PyTorch's own numbers are flat, and the failing call is the decoder library's cudaMalloc:
the leak is in that native library (fix its cleanup path, or have it decode into buffers PyTorch owns).
Wrong first advice: empty_cache (PyTorch's cache is its steady working set: releasing it lets this batch
decode, and the next forward fails instead), expandable_segments, release_references (no Python object
holds the memory), a smaller batch or gradient checkpointing (only delays it), a bigger GPU, restarting
(a workaround), stopping other processes (there are none).
"""
import ctypes
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB, GiB = 1 << 20, 1 << 30
BATCH_SIZE, IMAGE_SIZE = 256, 224
STEPS_PER_EPOCH = 1281167 // BATCH_SIZE


# ---- stand-in for libgpujpeg.so (C++ on nvJPEG), as its ctypes binding calls it: its own cudaMalloc ----
class GpuJpegDecoder(object):
    def __init__(self, device=0):
        self._rt = ctypes.CDLL("libcudart.so.13")
        self._rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self._rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.device = device

    def decode_resize_crop(self, jpegs, out):
        progressive = [j for j in jpegs if j["progressive"]]
        if progressive:
            nbytes = sum(j["coeff_bytes"] for j in progressive)
            buf = ctypes.c_void_p(0)
            err = self._rt.cudaMalloc(ctypes.byref(buf), nbytes)
            if err != 0:
                self._rt.cudaGetLastError()
                scen_truth.mark("fail", self.device, nbytes)      # test scaffolding: the simulator's books
                raise RuntimeError("gpujpeg: cudaMalloc(%d) failed: out of memory (decode_batch.cpp:212)" % nbytes)
            # ... GPU-hybrid Huffman decode into buf, IDCT, resize, crop into `out` ...
            # (cudaFree(buf) is after the CMYK fallback's early return: never reached)
        return out


# ---- ResNet-50 (torchvision), memory as the sizes of what autograd keeps per stage, fp16 ----
class Stage(nn.Module):
    def __init__(self, n_params, saved_bytes_per_image):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_params * 4, device="cuda"))
        self.saved_bytes_per_image = saved_bytes_per_image

    def forward(self, x):
        out = torch.empty(x.batch * self.saved_bytes_per_image, device="cuda")
        out._saved = x
        out.batch = x.batch
        return out


class ResNet50(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.stem = Stage(9_536, 5_200_000)
        self.layer1 = Stage(215_808, 14_800_000)
        self.layer2 = Stage(1_219_584, 9_900_000)
        self.layer3 = Stage(7_098_368, 7_400_000)
        self.layer4 = Stage(14_964_736, 1_900_000)
        self.fc = nn.Parameter(torch.empty(2_049_000 * 4, device="cuda"))

    def forward(self, x):
        for stage in (self.stem, self.layer1, self.layer2, self.layer3, self.layer4):
            x = stage(x)
        logits = torch.empty(x.batch * 1000 * 4, device="cuda")
        logits._saved = x
        return logits


def imagenet_batches(rng):
    """File records of a shuffled ImageNet epoch: ~0.3% progressive JPEGs, ~0.4 MiB of DCT coefficients each
    (Y, Cb, Cr at 16 bits, for the ~400x350 typical image)."""
    while True:
        batch = []
        for _ in range(BATCH_SIZE):
            prog = rng.random() < 0.003
            batch.append({"progressive": prog, "coeff_bytes": int(rng.uniform(0.2, 0.7) * MiB) if prog else 0})
        yield batch


def normalize(images):
    """images.half().sub_(mean).div_(std): a float16 copy of the batch."""
    x = torch.empty(images.nbytes * 2, device="cuda")
    x.batch = BATCH_SIZE
    return x


def cross_entropy(logits, labels):
    from torch.autograd._graph import derive
    loss = torch.empty(512, device="cuda")
    loss._saved = logits
    return derive(loss, logits)


model = ResNet50().cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
decoder = GpuJpegDecoder(device=0)
rng = random.Random(1000)
loader = imagenet_batches(rng)

try:
    for epoch in range(1, 91):
        for step in range(1, STEPS_PER_EPOCH + 1):
            jpegs = next(loader)
            images = torch.empty(BATCH_SIZE * 3 * IMAGE_SIZE * IMAGE_SIZE, dtype=torch.uint8, device="cuda")
            decoder.decode_resize_crop(jpegs, out=images)
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(normalize(images))
                loss = cross_entropy(logits, None)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del images, logits, loss
            if step % 1000 == 0:
                free, total = torch.cuda.mem_get_info()
                print("epoch %d step %4d  allocated %.2f GiB  reserved %.2f GiB  device used %.2f GiB" % (
                    epoch, step, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB,
                    (total - free) / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
