"""finetune_timesformer.py -- action recognition on surgical videos: a TimeSformer-Base (divided
space-time attention, 12 blocks, 86M parameters) fine-tuned on one 32 GB V100, PyTorch 2.2, batch 4.
To "use every frame" the user samples each clip at its native length (16 to 64 frames at 224 px) and
pads nothing, so every step has a different number of tokens and every activation a different size:

    for clips, labels in loader:                   # clips: [4, T, 3, 224, 224], T varies per batch
        loss = F.cross_entropy(model(clips.cuda()), labels.cuda())
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The first batch is a 64-frame one: each block saves a 2.4 GiB activation and its attention needs a
1.5 GiB temporary; the caching allocator keeps those twelve 2.4 GiB segments and the 1.5 GiB one, 30
GiB reserved on a 32 GiB card (AdamW's moments later settle into the 1.5 GiB one).  The next batch has
40-frame clips and needs less in total (18 GiB saved + a 0.94 GiB temporary), but each 1.5 GiB
activation goes into one of the cached 2.4 GiB blocks and leaves a 0.9 GiB hole; in the last block the
0.94 GiB attention temporary fits in none of the holes (11.7 GiB reserved but unallocated in all),
and the driver has 0.7 GiB left.  It fails with more than ten times the request cached and free.

An expert: fragmentation from varying shapes -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or
max_split_size_mb), and/or batch clips of similar length (bucket by frame count, or sample a fixed
number of frames).  Not a bigger GPU, not 8-bit optimizers or ZeRO, not a smaller model: the
40-frame step needs less than the 64-frame step that went through.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

CLIP_FRAMES = [64, 40, 24, 56, 16, 48]          # the loader's first batches (frames per clip)


class DividedSTBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(28 * MiB, device="cuda"))

    def forward(self, x, frames):
        saved = torch.empty(2458 * MiB * frames // 64, device="cuda")    # saved for backward
        saved._saved = x
        attn_tmp = torch.empty(1536 * MiB * frames // 64, device="cuda")  # space-time attention scratch
        del attn_tmp
        return saved


class TimeSformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "block%d" % i, DividedSTBlock())

    def forward(self, clips, frames):
        x = clips
        for i in range(12):
            x = getattr(self, "block%d" % i)(x, frames)
        logits = torch.empty(4 * 400 * 4, device="cuda")
        logits._saved = x
        return logits


def main():
    model = TimeSformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.05)
    for frames in CLIP_FRAMES:
        clips = torch.empty(4 * frames * 3 * 224 * 224 * 4, device="cuda")     # clips.cuda()
        logits = model(clips, frames)
        loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, clips


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
