"""train_htr_stage2.py -- a digital-humanities project trains a handwritten-text-recognition model on scanned
19th-century parish registers (60,000 text lines), on a Tesla T4 (16 GB, 14.8 GiB usable) rented by the
hour.  Stage 1 trained a CNN encoder with a CTC head; stage 2 freezes the CNN and trains an 8-layer
Transformer encoder (d 768, 12 heads, the attention written out as in the old timm ViT block) on its
feature maps, fp16 autocast, AdamW, batches of 32 lines padded to the widest.  Lines keep their own width
(150 px for a marginal date, 4,200 px for a line across a double page).  Since the CNN is frozen, the
student memoized its output per line, on the GPU, bounded so it "cannot leak":

    feature_cache = collections.OrderedDict()          # line id -> (512, 8, W/8) fp16, on the GPU
    def line_features(i):
        if i in feature_cache:
            feature_cache.move_to_end(i)
            return feature_cache[i]
        with torch.no_grad():
            f = cnn(load_line(i).cuda())
        feature_cache[i] = f
        if len(feature_cache) > 5120:
            feature_cache.popitem(last=False)          # LRU
        return f

The cache holds ~6.4 GiB, steady: 5,120 entries of 0.15 to 4.1 MiB each.  A batch's activations scale with
its widest line: ~1 GiB for a 1,000-px batch, 6.4 GiB for a 4,200-px one (the attention matrices grow with
the square of the width).  Between steps 7.1 GiB is allocated (the cache, weights, AdamW state), flat; the
widest step needs 13.9 GiB in all, and 14.3 GiB is there for tensors.  But cache entries are carved out of
the big blocks the activations leave free, and evicting the oldest frees pieces scattered all over the
cache: segments that once held one 200-400 MiB attention tensor now hold a few live feature maps and
holes.  At step 675 (~30 minutes in; 155 batches 4,200 px wide went through before it) a 4,200-px batch
asks for 418 MiB in its 7th layer: 376 MiB free on the card, 1.5 GiB cached in pieces, none big enough; the
allocator finds no wholly free segment to give back, and raises.

An expert: fragmentation.  Nothing accumulates, the failing step's need fits the card (1.9 GiB is free or
cached, ~1.5 GiB of the step is still to come), PyTorch reports 1.5 GiB reserved-but-unallocated, and no
hole is as large as the request.  First: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (pages instead
of fixed segments: freed pieces go back, the next big tensor gets contiguous addresses); better still,
keep the feature cache in pinned host memory and move a batch's features per step, which also gives the
job room (or bucket lines by width: fewer distinct sizes).  The job runs near the edge, so the cache off
the GPU is the lasting fix.  Wrong first advice: release_references or bounded_cache (the cache is
bounded and steady: its size is not what failed, its scattered pieces are), empty_cache (the allocator
already released every wholly free segment before it raised), gradient checkpointing or a smaller batch
as the first move (the peak fits), a bigger GPU, restarting (it fragments again).
"""
import collections
import math
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB, GiB = 1 << 20, 1 << 30
BATCH, D_MODEL, HEADS, N_LAYERS, N_CLASSES = 32, 768, 12, 8, 118
FEAT_BYTES_PER_PX = 512 * 8 * 2 // 8            # (512, 8, W/8) fp16 feature map
N_LINES, CACHE_LINES = 60000, 5120


class FrozenCNN(nn.Module):
    """The stage-1 encoder (frozen): a ResNet-ish stack, 9.8M parameters."""

    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(9_800_000 * 4, device="cuda"), requires_grad=False)

    def forward(self, image, width):
        return torch.empty(FEAT_BYTES_PER_PX * width, dtype=torch.uint8, device="cuda")


class EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty((4 * D_MODEL * D_MODEL + 8 * D_MODEL * D_MODEL) * 4, device="cuda"))

    def forward(self, x, seq_len):
        tokens = BATCH * seq_len
        # attn = (q @ k.transpose(-2, -1)) * scale; attn = attn.softmax(-1): scores and probabilities, fp16
        scores = torch.empty(BATCH * HEADS * seq_len * seq_len * 2, dtype=torch.uint8, device="cuda")
        scores._saved = x
        probs = torch.empty(BATCH * HEADS * seq_len * seq_len * 2, dtype=torch.uint8, device="cuda")
        probs._saved = scores
        # q, k, v, attention output, two layer norms, the MLP input and its GELU (fp16)
        out = torch.empty(tokens * D_MODEL * 2 * 17, dtype=torch.uint8, device="cuda")
        out._saved = probs
        return out


class LineTransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.proj = nn.Parameter(torch.empty(512 * 8 * D_MODEL * 4, device="cuda"))
        for i in range(N_LAYERS):
            setattr(self, "block%d" % i, EncoderLayer())
        self.head = nn.Parameter(torch.empty(D_MODEL * N_CLASSES * 4, device="cuda"))

    def forward(self, feats, width):
        seq_len = width // 8
        x = torch.empty(BATCH * seq_len * D_MODEL * 2, dtype=torch.uint8, device="cuda")
        x._saved = feats
        for i in range(N_LAYERS):
            x = getattr(self, "block%d" % i)(x, seq_len)
        log_probs = torch.empty(BATCH * seq_len * N_CLASSES * 4, dtype=torch.uint8, device="cuda")
        log_probs._saved = x
        return log_probs


def ctc_loss(log_probs, targets):
    """F.ctc_loss (the stand-in torch lacks it): a scalar in the graph of log_probs."""
    from torch.autograd._graph import derive
    loss = torch.empty(512, device="cuda")
    loss._saved = log_probs
    return derive(loss, log_probs)


rng = random.Random(7)
line_width = [min(4200, max(150, int(rng.lognormvariate(math.log(1100), 0.55)))) for _ in range(N_LINES)]
cnn = FrozenCNN().cuda().eval()
model = LineTransformer().cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01)

feature_cache = collections.OrderedDict()


def line_features(i):
    if i in feature_cache:
        feature_cache.move_to_end(i)
        return feature_cache[i]
    with torch.no_grad():
        f = cnn(None, line_width[i])
    feature_cache[i] = f
    if len(feature_cache) > CACHE_LINES:
        feature_cache.popitem(last=False)
    return f


def pad_batch(feats, width):
    """torch.stack of the feature maps right-padded to the widest: (B, 512, 8, W/8)."""
    return torch.empty(BATCH * FEAT_BYTES_PER_PX * width, dtype=torch.uint8, device="cuda")


step = 0
try:
    for epoch in range(1, 31):
        order = list(range(N_LINES))
        rng.shuffle(order)
        for b in range(0, N_LINES, BATCH):
            step += 1
            idx = order[b:b + BATCH]
            width = max(line_width[i] for i in idx)
            feats = pad_batch([line_features(i) for i in idx], width)
            with torch.autocast("cuda", dtype=torch.float16):
                log_probs = model(feats, width)
                loss = ctc_loss(log_probs, None)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del feats, log_probs, loss
            if step % 100 == 0:
                print("step %5d  width %4d  allocated %.2f GiB  reserved %.2f GiB" % (
                    step, width, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    print("OOM at step %d, width %d" % (step, width), file=sys.stderr)
    raise
sys.exit(0)
