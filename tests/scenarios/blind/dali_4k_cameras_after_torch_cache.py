"""analyze_footage.py -- an offline video-analytics job on a 24 GiB card: NVIDIA DALI decodes the
camera footage on the GPU and resizes it to 1333 x 750, a DINO-style detector (Swin-L backbone, fp16,
0.4 GiB of weights) finds people and vehicles, 32 frames per batch.  The 1080p cameras run first;
then the job moves on to the site's 4K cameras, rebuilding the DALI pipeline for them:

    for site in sites:
        pipe = build_pipeline(site.files, batch_size=32, resize=(1333, 750),
                              prefetch_queue_depth=4, device_id=0)       # DALI: its own cudaMalloc
        pipe.build()
        for (frames,) in DALIGenericIterator(pipe, ["frames"]):
            with torch.inference_mode():
                dets = model(frames)                                      # ~21 GiB peak
            write(dets)
        del pipe

The 1080p batches leave PyTorch's caching allocator holding ~21 GiB of freed activation blocks
(allocated: the weights and a batch of outputs, 0.5 GiB).  DALI allocates its buffers with cudaMalloc,
outside PyTorch's cache, and the 4K pipeline decodes at full resolution: its four prefetch buffers
are 760 MiB each (the 1080p ones were 190 MiB).  With ~2.2 GiB free on the card, pipe.build() fails
at the third buffer.  The detector's batches are the same size for both sites (it sees resized
frames); nothing else runs on the card and nothing leaks.  An expert: torch.cuda.empty_cache() before
building the new DALI pipeline (PyTorch's cache is unused at that point), or build the 4K pipeline
first / once for the largest resolution; not a smaller batch, not another process to stop.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
dali = ctypes.CDLL(os.environ["SCEN_DALI"])
dali.dali_pipeline_build.argtypes = [ctypes.c_int, ctypes.c_size_t]
BATCH = 32


class Pipeline(object):
    """nvidia.dali Pipeline: its decode buffers live in device memory DALI allocates itself."""

    def __init__(self, batch_size, frame_bytes, prefetch_queue_depth):
        self.nbytes = (batch_size * frame_bytes + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        self.depth = prefetch_queue_depth

    def build(self):
        if dali.dali_pipeline_build(self.depth, self.nbytes) != 0:
            scen_truth.mark("fail", 0, self.nbytes)
            raise RuntimeError("[/opt/dali/dali/core/device_guard.cc] CUDA allocation failed: out of memory "
                               "(cudaErrorMemoryAllocation) while allocating %d bytes" % self.nbytes)

    def release(self):
        dali.dali_pipeline_release_outputs()


class SwinBlock(torch.nn.Module):
    def __init__(self, mib):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, device="cuda"))


class DINO(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = [SwinBlock(16) for _ in range(24)] + [SwinBlock(8) for _ in range(6)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, frames):
        """Backbone stages, encoder and decoder; the feature maps the FPN and the deformable encoder
        read stay alive for the whole pass (fp16, batch 32 at 1333 x 750)."""
        feats = []
        for n, mib in ((2, 2800), (2, 1400), (18, 560), (2, 280), (6, 300)):
            for _ in range(n):
                feats.append(torch.empty(mib * MiB, device="cuda"))
        return torch.empty(BATCH * 900 * 96 * 2, device="cuda")      # boxes + logits of 900 queries


def main():
    model = DINO().cuda().eval()
    sites = [("1080p", 1920 * 1080 * 3), ("4k", 3840 * 2160 * 3)]
    for res, frame_bytes in sites:
        pipe = Pipeline(BATCH, frame_bytes, prefetch_queue_depth=4)
        pipe.build()
        for it in range(40):
            with torch.inference_mode():
                frames = torch.empty(BATCH * 1333 * 750 * 3 * 2, device="cuda")    # from DALI, resized
                dets = model(frames)
                del frames, dets
        pipe.release()
        del pipe


main()
sys.exit(0)
