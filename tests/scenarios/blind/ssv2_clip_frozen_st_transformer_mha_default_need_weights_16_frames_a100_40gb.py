"""train_ssv2_st.py -- a research group's video classifier for Something-Something-v2 (174 classes), on one
A100 40GB (39.4 GiB usable), PyTorch 2.3, bf16 autocast.

The design: OpenAI CLIP ViT-B/16 as a frozen per-frame encoder (fp16 as clip.load gives it, run under
torch.no_grad), and a trainable 4-layer "space-time" transformer on top that attends jointly over ALL patch
tokens of all frames (SSv2 is about motion, so a CLS-per-frame temporal head was not good enough).  Each block
was written by hand with torch.nn.MultiheadAttention, as most code on GitHub calls it:

    class STBlock(nn.Module):
        def __init__(self, dim=768, heads=12):
            self.norm1 = nn.LayerNorm(dim)
            self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
            ...
        def forward(self, x):
            h = self.norm1(x)
            h, _ = self.attn(h, h, h)          # <- need_weights defaults to True
            x = x + h
            return x + self.mlp(self.norm2(x))

    # train loop
    with torch.no_grad():
        feats = clip_visual(frames)            # (B*T, 197, 768)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        logits = head(feats.view(B, T * 197, 768))
        loss = F.cross_entropy(logits, labels)

With 8 frames (1,576 tokens a clip) it trained at batch 16, peaking in the high teens of GiB.  For the final
run the config went to num_frames=16 ("twice the frames, about twice the memory").  The first training step fails in the
first forward pass, inside the attention of the 4th (last) block, at q@k^T: "Tried to allocate 3.55 GiB"
with 1.4 GiB free and 37 GiB allocated -- the first three blocks' saved activations, 12 GiB each; no
backward has run yet.

Why: nn.MultiheadAttention(..., need_weights=True) -- the default -- cannot use the fused
scaled_dot_product_attention kernels (PyTorch only takes them when the weights are not asked for); it runs the
textbook path: q@k^T (B*heads, L, L) in bf16, softmax in fp32 under autocast, a bf16 copy of it for the second
bmm, and returns the head-averaged weights (B, L, L), which the caller throws away into `_`.  With L = 16*197 =
3,152 that is 7.1 GiB (fp32 softmax, saved for backward) + 3.55 GiB (bf16 copy, saved) per block, quadratic in
the number of frames: 16 frames cost 4x what 8 did per block, not 2x.

An expert: the memory is the materialized L x L attention matrices of a training forward, kept for backward.
First fix: call the attention without weights -- self.attn(h, h, h, need_weights=False) or
F.scaled_dot_product_attention -- so the flash / memory-efficient kernel runs: O(L) memory, ~1.4 GiB a block
(the forward then peaks near 6 GiB), and faster.  Then, if more is needed: gradient checkpointing of the ST
blocks, fewer tokens (pool patches 2x2 or fewer frames), or a smaller micro-batch with gradient accumulation.
Wrong first advice: mixed precision (autocast is already on), expandable_segments / empty_cache (nothing is
cached: the activations are live), inference_mode / no_grad (this is training; the frozen backbone already
runs under no_grad), a bigger GPU (an 80 GB card holds 16 frames, and fails again at 24), quantization (28M
trainable params).

The stand-in torch has no nn.MultiheadAttention / LayerNorm / Linear: they are written below with the real
classes' names and signatures, allocating what PyTorch 2.3's kernels allocate for them (sizes in elements of
their dtype).
"""
import math
import sys

import torch
from torch import nn
from torch.autograd._graph import derive

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---------------------------------------------------------------------------------------------------------------
# the pieces of torch.nn the stand-in lacks: same names and call signatures as PyTorch's, same allocations
def _new(numel, dtype, inputs=(), saved=()):
    """A kernel's output of numel elements of dtype, made from `inputs`.  With autograd on, its graph node keeps
    the tensors the real kernel saves for backward (`saved`) and, for an input it does not save, that input's
    own node (what the input kept), so the whole forward stays reachable from the output as in PyTorch."""
    out = torch.empty(int(numel), dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        refs = list(saved)
        for t in inputs:
            if any(t is u for u in saved):
                continue
            up = getattr(t, "_saved", None)
            refs.extend(up if isinstance(up, tuple) else ())
        keep = []
        for t in refs:
            if all(t is not k for k in keep):
                keep.append(t)
        out._saved = tuple(keep)
    return derive(out, *inputs)


def _numel(t):
    return t.nbytes // torch._ITEMSIZE[t.dtype]


def _autocast_dtype():
    return torch.bfloat16 if torch.is_autocast_enabled() else None


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True, dtype=None):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=dtype or torch.float32,
                                               device="cuda"))

    def forward(self, x):
        rows = _numel(x) // self.in_features
        lp = _autocast_dtype()
        if lp and x.dtype != lp:
            x = _new(_numel(x), lp, (x,))                 # autocast's bf16 copy of the input
        return _new(rows * self.out_features, lp or x.dtype, (x, self.weight), saved=(x,))


class LayerNorm(nn.Module):
    def __init__(self, dim, dtype=None):
        nn.Module.__init__(self)
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(2 * dim, dtype=dtype or torch.float32, device="cuda"))

    def forward(self, x):
        # layer_norm runs in float32 under autocast
        return _new(_numel(x), torch.float32 if torch.is_autocast_enabled() else x.dtype, (x, self.weight),
                    saved=(x,))


class GELU(nn.Module):
    def forward(self, x):
        return _new(_numel(x), x.dtype, (x,), saved=(x,))


class MultiheadAttention(nn.Module):
    """torch.nn.MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False); forward
    as F.multi_head_attention_forward runs it in training (the fast path is for inference only)."""

    def __init__(self, embed_dim, num_heads, dropout=0.0, bias=True, batch_first=False):
        nn.Module.__init__(self)
        self.embed_dim, self.num_heads, self.dropout, self.batch_first = embed_dim, num_heads, dropout, batch_first
        self.head_dim = embed_dim // num_heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim * embed_dim, dtype=torch.float32, device="cuda"))
        self.out_proj = Linear(embed_dim, embed_dim)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        bsz, tgt_len, E = query.shape_hint
        src_len = tgt_len
        lp = _autocast_dtype()
        x = query
        if lp and x.dtype != lp:
            x = _new(_numel(x), lp, (x,))                                             # autocast's bf16 copy
        dt = lp or x.dtype
        proj = _new(tgt_len * bsz * 3 * E, dt, (x, self.in_proj_weight), saved=(x,))  # in_proj: linear
        qkv = _new(tgt_len * bsz * 3 * E, dt, (proj,))                                # unflatten..contiguous()
        del proj
        n_bh = bsz * self.num_heads
        if not need_weights:
            # scaled_dot_product_attention: flash / memory-efficient kernel, O(L) memory
            out = _new(n_bh * tgt_len * self.head_dim, dt, (qkv,), saved=(qkv,))
            out._lse = torch.empty(n_bh * tgt_len, dtype=torch.float32, device="cuda")
            weights = None
        else:
            q_scaled = _new(n_bh * tgt_len * self.head_dim, dt, (qkv,))               # q * sqrt(1/head_dim)
            scores = _new(n_bh * tgt_len * src_len, dt, (q_scaled, qkv), saved=(q_scaled, qkv))  # bmm(q, k^T)
            del q_scaled
            probs = _new(n_bh * tgt_len * src_len, torch.float32, (scores,))          # softmax: fp32 under autocast
            del scores                                                                # (it saves its output)
            probs_lp = _new(n_bh * tgt_len * src_len, dt, (probs,), saved=(probs,))   # bmm casts it to bf16
            out = _new(n_bh * tgt_len * self.head_dim, dt, (probs_lp, qkv), saved=(probs_lp, qkv))  # bmm(p, v)
            weights = probs
            if average_attn_weights:
                weights = _new(bsz * tgt_len * src_len, torch.float32, (probs,))       # .view(b, h, L, L).mean(1)
            del probs, probs_lp
        del qkv
        out = _new(_numel(out), dt, (out,))                                           # transpose..contiguous()
        out = self.out_proj(out)
        out.shape_hint = (bsz, tgt_len, E)
        return out, weights


def _shaped(t, shape):
    t.shape_hint = shape
    return t


# ---------------------------------------------------------------------------------------------------------------
# the model
class CLIPVisual(nn.Module):
    """OpenAI CLIP ViT-B/16 image tower (86M params), fp16 as clip.load("ViT-B/16", device="cuda") returns it."""

    def __init__(self):
        nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "resblock_%d" % i, nn.Parameter(torch.empty(7_087_872, dtype=torch.float16, device="cuda")))
        self.conv1 = nn.Parameter(torch.empty(768 * 3 * 16 * 16, dtype=torch.float16, device="cuda"))

    def forward(self, frames, n_frames):
        # 12 pre-LN blocks, attention with need_weights=False (CLIP's own code passes it): per-layer temporaries
        tokens = n_frames * 197
        x = torch.empty(tokens * 768, dtype=torch.float16, device="cuda")
        for i in range(12):
            qkv = torch.empty(tokens * 3 * 768, dtype=torch.float16, device="cuda")
            a = torch.empty(tokens * 768, dtype=torch.float16, device="cuda")
            del qkv
            hmid = torch.empty(tokens * 3072, dtype=torch.float16, device="cuda")
            nxt = torch.empty(tokens * 768, dtype=torch.float16, device="cuda")
            del hmid, a
            x = nxt
        return x                                             # (B*T, 197, 768): all patch tokens, not just CLS


class STBlock(nn.Module):
    def __init__(self, dim=768, heads=12, mlp_ratio=4):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = MultiheadAttention(dim, heads, batch_first=True)
        self.norm2 = LayerNorm(dim)
        self.fc1 = Linear(dim, dim * mlp_ratio)
        self.act = GELU()
        self.fc2 = Linear(dim * mlp_ratio, dim)

    def forward(self, x):
        shape = x.shape_hint
        h = _shaped(self.norm1(x), shape)
        h, _ = self.attn(h, h, h)
        x = _new(_numel(x), torch.float32, (x, h))                       # x + h
        h = self.fc2(self.act(self.fc1(self.norm2(x))))
        x = _new(_numel(x), torch.float32, (x, h))                       # x + mlp(norm2(x))
        return _shaped(x, shape)


class SpaceTimeHead(nn.Module):
    def __init__(self, num_frames, depth=4, dim=768, num_classes=174):
        nn.Module.__init__(self)
        self.num_frames = num_frames
        self.temporal_pos = nn.Parameter(torch.empty(num_frames * dim, dtype=torch.float32, device="cuda"))
        for i in range(depth):
            setattr(self, "block_%d" % i, STBlock(dim))
        self.depth = depth
        self.norm = LayerNorm(dim)
        self.fc = Linear(dim, num_classes)

    def forward(self, feats, batch):
        L = self.num_frames * 197
        x = _new(batch * L * 768, torch.float32, (feats, self.temporal_pos))  # feats.float() + pos
        x = _shaped(x, (batch, L, 768))
        for i in range(self.depth):
            x = getattr(self, "block_%d" % i)(x)
        pooled = _new(batch * 768, torch.float32, (x,))                  # mean over tokens
        return self.fc(self.norm(pooled))


# ---------------------------------------------------------------------------------------------------------------
# config and training loop
cfg = dict(num_frames=16, batch_size=16, lr=3e-4, epochs=30, steps_per_epoch=168_913 // 16)

visual = CLIPVisual().cuda().eval()
for p in visual.parameters():
    p.requires_grad_(False)
head = SpaceTimeHead(cfg["num_frames"]).cuda().train()
optimizer = torch.optim.AdamW(head.parameters(), lr=cfg["lr"], weight_decay=0.05)
print("tokens per clip: %d x 197 = %d" % (cfg["num_frames"], cfg["num_frames"] * 197))
print("trainable params %.1fM" % (sum(p.nbytes for p in head.parameters()) / 4 / 1e6))


def loader():
    """DALI pipeline on the CPU side: uniform 16-frame sampling, 224x224 crops, uint8 to the GPU."""
    for step in range(cfg["steps_per_epoch"]):
        frames = torch.empty(cfg["batch_size"] * cfg["num_frames"] * 3 * 224 * 224, dtype=torch.uint8,
                             device="cuda")
        labels = torch.empty(cfg["batch_size"] * 8, device="cuda")           # int64
        yield frames, labels


try:
    for step, (frames, labels) in enumerate(loader()):
        B, T = cfg["batch_size"], cfg["num_frames"]
        with torch.no_grad():
            feats = visual(frames, B * T)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = head(feats, B)
            loss = torch.nn.functional.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print("step %d peak %.1f GiB" % (step, torch.cuda.max_memory_allocated() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    print("allocated %.2f GiB, reserved %.2f GiB" % (torch.cuda.memory_allocated() / GiB,
                                                   torch.cuda.memory_reserved() / GiB), file=sys.stderr)
    raise
sys.exit(0)
