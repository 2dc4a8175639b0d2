"""upscale.py -- a super-resolution model (fp16 weights, 2 GiB) upscaling 4K frames by 2x on a 12 GiB card
under inference_mode, run with plain `LD_PRELOAD=liboomguard.so`:

    feats = model.encode(frame)                                  # 64 x 2160 x 3840 float32: 2 GiB
    up = F.interpolate(feats, scale_factor=2, mode="bicubic")    # 8 GiB
    out = model.head(up)

F.interpolate's full-resolution tensor fails.  An expert: upscale in tiles (each tile's features, then
stitch), which keeps the upsampled tensor a fraction of that; one frame is already the batch; not a leak,
not checkpointing (no training).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Upscaler(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        torch.set_default_dtype(torch.float16)                   # from_pretrained(..., torch_dtype=torch.float16)
        for i in range(16):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"),
                                                      requires_grad=False))
        torch.set_default_dtype(torch.float32)

    def forward(self, frame):
        feats = torch.empty(2025 * MiB, device="cuda")          # 64 x 2160 x 3840 float32
        feats._saved = frame
        up = F.interpolate(feats, scale_factor=2.0, mode="bicubic")
        return up


def main():
    model = Upscaler()
    with torch.inference_mode():
        for f in range(1000):
            frame = torch.empty(3 * 2160 * 3840 * 4, device="cuda")
            out = model(frame)
            del out, frame


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
