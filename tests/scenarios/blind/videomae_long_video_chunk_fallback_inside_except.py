"""extract_clip_features.py -- dense clip features of a video corpus (a sports archive) with a
VideoMAE ViT-L (fp16, 0.6 GiB) on a 16 GB V100, with plain `LD_PRELOAD=liboomguard.so`:

    model = VideoMAE.from_pretrained("videomae-large-finetuned-kinetics").half().cuda().eval()
    with torch.no_grad():
        for video in videos:
            clips = sample_clips(video).cuda()              # every 16-frame clip, stride 32 frames
            try:
                feats = model(clips)                        # all clips of the video in one pass
            except torch.cuda.OutOfMemoryError:
                torch.cuda.empty_cache()
                feats = torch.cat([model(c) for c in clips.split(32)])   # fall back to chunks of 32
            save(video, feats)

Most videos are highlight reels of a few clips.  A full match recording gives 120 clips: the first
block's attention scores for all of them (8.8 GiB) are allocated, their softmax (another 8.8 GiB)
is not.  The fallback runs inside the `except` block: the exception's traceback keeps the failed
pass's frames, and with them the clips' hidden states, q/k/v and the 8.8 GiB of scores, alive.
empty_cache() cannot return any of it.  The handler starts with ~3.7 GiB free, and the first
32-clip chunk fails at its own softmax (2.3 GiB) with 0.9 GiB left.  Outside the handler the same
chunk needs ~5 GiB of the ~14 GiB free.

An expert: leave the except block before retrying (note the failure, fall through, run the
fallback after it, or `del` what the failed pass left), or simply always run fixed chunks of clips
(the per-video batch is unbounded).  Not empty_cache (the handler already calls it; the memory is
live), not expandable_segments (nothing is fragmented), not checkpointing or autocast (no autograd,
already fp16), not a smaller training batch.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
TOKENS = 1568                   # 8 x 14 x 14 tubelets of a 16 x 224 x 224 clip
DIM = 1024
HEADS = 16
scen_truth.note_every_empty(torch)


def half(nbytes):
    return torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")


class Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(half(6 * MiB))
        self.proj = torch.nn.Parameter(half(2 * MiB))

    def _attn(self, q, k, v, n):
        scores = half(n * HEADS * TOKENS * TOKENS * 2)           # q @ k^T, fp16
        probs = half(n * HEADS * TOKENS * TOKENS * 2)            # softmax(scores)
        del scores
        out = half(n * TOKENS * DIM * 2)
        del probs
        return out

    def forward(self, x, n):
        qkv = half(3 * n * TOKENS * DIM * 2)
        ctx = self._attn(qkv, qkv, qkv, n)
        del qkv
        return half(n * TOKENS * DIM * 2)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = Attention()
        self.mlp = torch.nn.Parameter(half(16 * MiB))

    def forward(self, x, n):
        h = half(n * TOKENS * DIM * 2)                            # layer norm
        a = self.attn(h, n)
        del h
        m = half(4 * n * TOKENS * DIM * 2)                        # mlp hidden
        del m
        return half(n * TOKENS * DIM * 2)


class VideoMAE(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(half(2 * MiB))
        self.blocks = [Block() for _ in range(24)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, clips):
        n = clips.nbytes // CLIP_BYTES
        x = half(n * TOKENS * DIM * 2)                            # tubelet embedding
        for b in self.blocks:
            x = b(x, n)
        return half(n * DIM * 2)                                   # mean-pooled features


CLIP_BYTES = 3 * 16 * 224 * 224 * 2


def sample_clips(n_clips):
    return half(n_clips * CLIP_BYTES)


def split(clips, size):
    """clips.split(size): views of at most `size` clips each (no new memory)."""
    n = clips.nbytes // CLIP_BYTES
    out = []
    for i in range(0, n, size):
        v = clips.view()
        v.nbytes = min(size, n - i) * CLIP_BYTES
        out.append(v)
    return out


def main():
    model = VideoMAE().eval()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    videos = [("highlights_%03d" % i, 4 + i % 5) for i in range(12)] + [("match_2024_05_11_full", 120)]
    done = {}
    with torch.no_grad():
        for name, n_clips in videos:
            clips = sample_clips(n_clips)
            try:
                feats = model(clips)
            except torch.OutOfMemoryError:
                torch.cuda.empty_cache()
                feats = [model(c) for c in split(clips, 32)]
            done[name] = True
            del clips, feats


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above, at each failure
sys.exit(0)
