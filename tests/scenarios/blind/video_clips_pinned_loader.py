"""train_video.py -- fine-tuning a 300M-parameter video transformer (ViT-L backbone, 16-frame clips
at 224 px, fp32, AdamW) for action recognition on a 24 GiB card, with a fast input pipeline:

    loader = DataLoader(clips, batch_size=24, num_workers=8, pin_memory=True, prefetch_factor=2,
                        persistent_workers=True)
    model = VideoTransformer.from_pretrained(ckpt).cuda()
    for clips, labels in loader:
        clips = clips.cuda(non_blocking=True)
        loss = criterion(model(clips), labels)               # no autocast, no checkpointing
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The pinned staging buffers of the loader (16 batches in flight, 3.4 GiB of page-locked host
memory) are host memory: they take nothing from the GPU.  The first forward fails in block ~19 of
24: 1568 tokens x 24 clips save ~1.2 GiB per block.  An expert: the batch is too big for fp32
activations: a smaller batch with gradient accumulation, autocast (bf16), or checkpointing the
blocks; the pinned memory, other processes or a restart are beside the point.
"""
import ctypes
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

_cudart = ctypes.CDLL("libcudart.so.13")
_cudart.cudaHostAlloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t, ctypes.c_uint]
BATCH_BYTES = 24 * 16 * 3 * 224 * 224 * 4


class PinnedLoader(object):
    """DataLoader(pin_memory=True): the pin-memory thread's page-locked buffers, one per batch in
    flight (num_workers x prefetch_factor), reused for the whole run."""

    def __init__(self, in_flight=16):
        self.buffers = []
        for _ in range(in_flight):
            p = ctypes.c_void_p(0)
            if _cudart.cudaHostAlloc(ctypes.byref(p), BATCH_BYTES, 0) != 0:
                raise RuntimeError("cudaHostAlloc failed")
            self.buffers.append(p)

    def __iter__(self):
        for i in range(100000):
            yield torch.empty(BATCH_BYTES, device="cuda")         # clips.cuda(non_blocking=True)


class VideoTransformer(torch.nn.Module):
    def __init__(self, depth=24):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(24 * MiB, device="cuda"))
        for i in range(depth):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(48 * MiB, device="cuda")))
        self.depth = depth

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, clips):
        h = clips
        for _ in range(self.depth):
            attn = torch.empty(680 * MiB, device="cuda")      # attention probabilities, saved
            mlp = torch.empty(550 * MiB, device="cuda")       # MLP hidden, saved
            mlp._saved, mlp._attn = h, attn
            h = mlp
        logits = torch.empty(24 * 400 * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def main():
    loader = PinnedLoader()
    model = VideoTransformer.from_pretrained("ckpt/video-l").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5)
    for clips in loader:
        loss = model(clips)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, clips


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
