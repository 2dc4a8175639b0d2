"""train_probe.py -- a precision-agriculture team maps crop types in drone orthomosaics (20 classes: maize,
soy, wheat stubble, fallow, hedges, ...).  The recipe is the DINOv2 paper's "linear" segmentation probe:
a frozen DINOv2 ViT-L/14 (304M parameters, fp32 as torch.hub gives it: 1.13 GiB) and a trained head on
the patch tokens of its last four blocks (BatchNorm + 1x1 conv to 20 classes, upsampled to the image).
One A10G (24 GB, 22.5 GiB usable) on AWS, crops of 518 x 518 (37 x 37 patches), batch 16:

    backbone = torch.hub.load("facebookresearch/dinov2", "dinov2_vitl14")
    model = Segmenter(backbone, LinearHead(4 * 1024, 20)).cuda()
    optimizer = torch.optim.AdamW(model.decode_head.parameters(), lr=1e-3)   # only the head is trained
    for epoch in range(epochs):
        model.train()
        model.backbone.eval()                # frozen backbone: no drop-path, fixed statistics
        for images, masks in loader:
            logits = model(images)
            loss = F.cross_entropy(logits, masks)
            loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

"Frozen" here means two things the user believes and PyTorch does not: the backbone is in eval mode (it
only switches dropout / drop-path / norm behaviour) and its weights are not in the optimizer (they are
never updated).  Its parameters still have requires_grad=True, so autograd records the whole ViT-L
forward for a backward that will compute 1.13 GiB of gradients nobody uses: every block keeps ~1.6 GiB of
activations at 16 x 1370 tokens.  The first forward of the first step dies in block 14 of 24, 21 GiB
in; nothing is cached, nothing grew, no step has run.

An expert: the backbone is frozen only in the optimizer; stop autograd from recording it:
`model.backbone.requires_grad_(False)` and run its forward under `torch.no_grad()` (the features are
inputs to the head): the forward then holds one block's temporaries at a time (<1 GiB), no backbone
gradients are made, and batch 16 fits with room to spare.  Wrong first advice: a smaller batch (batch 8
still records ~19 GiB and trains nothing more), gradient checkpointing (recomputes a forward that needs
no backward at all), expandable_segments / empty_cache (nothing is cached), mixed precision first (halves
memory that should not exist), inference_mode (its features cannot be saved by the head's backward: a
RuntimeError), LoRA / quantization / a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

N_CLASSES = 20
BATCH_SIZE = 16
IMG = 518
PATCH = 14
TOKENS = (IMG // PATCH) ** 2 + 1          # 1369 patches + [CLS]
EMBED = 1024
DEPTH = 24


# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
def _add(a, b):
    """x + branch: a new tensor of x's size in both inputs' graph.  The addition saves no tensor, but its
    node holds the nodes of both inputs, and with them what those saved (the branch's chain)."""
    out = torch._derive(torch.empty_like(a), a, b)
    if out._params:
        out._saved = (a, getattr(b, "_saved", None))
    return out


torch.Tensor.__add__ = _add


def _records(module, *inputs):
    """Whether autograd records this op: grad mode on and a parameter or an input that needs a gradient."""
    if not torch.is_grad_enabled():
        return False
    if any(p is not None and p.requires_grad for p in module._parameters.values()):
        return True
    return any(t._params or t.requires_grad for t in inputs)


class Linear(torch.nn.Module):
    """torch.nn.Linear: saves its input for the weight's gradient."""

    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.fin, self.fout = fin, fout
        self.weight = torch.nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(fout * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes // self.fin * self.fout, device="cuda")
        if _records(self, x):
            out._saved = x
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(dim * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(dim * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty_like(x)
        if _records(self, x):
            out._saved = x
        return out


class GELU(torch.nn.Module):
    def forward(self, x):
        out = torch.empty_like(x)
        if _records(self, x):
            out._saved = x
        return out


class LayerScale(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.gamma = torch.nn.Parameter(torch.empty(dim * 4, device="cuda"))

    def forward(self, x):
        out = torch.empty_like(x)
        if _records(self, x):
            out._saved = x
        return out


class MemEffAttention(torch.nn.Module):
    """dinov2/layers/attention.py: qkv, fused attention (no T x T matrix kept), proj."""

    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)

    def forward(self, x):
        qkv = self.qkv(x)
        o = torch.empty(x.nbytes, device="cuda")          # attention output (+ logsumexp) saved with q, k, v
        if _records(self, qkv):
            o._saved = qkv
        return self.proj(o)


class Mlp(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.fc1 = Linear(dim, 4 * dim)
        self.act = GELU()
        self.fc2 = Linear(4 * dim, dim)

    def forward(self, x):
        return self.fc2(self.act(self.fc1(x)))


class NestedTensorBlock(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = MemEffAttention(dim)
        self.ls1 = LayerScale(dim)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim)
        self.ls2 = LayerScale(dim)

    def forward(self, x):
        x = x + self.ls1(self.attn(self.norm1(x)))
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x


class PatchEmbed(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.proj = torch.nn.Conv2d(3, dim, PATCH, stride=PATCH, device="cuda")

    def forward(self, images):
        return torch.empty(images.nbytes // (3 * IMG * IMG) * TOKENS * EMBED, device="cuda")


class DinoVisionTransformer(torch.nn.Module):
    """torch.hub's dinov2_vitl14 (fp32)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = PatchEmbed(EMBED)
        self.cls_token = torch.nn.Parameter(torch.empty(EMBED * 4, device="cuda"))
        self.pos_embed = torch.nn.Parameter(torch.empty(TOKENS * EMBED * 4, device="cuda"))
        for i in range(DEPTH):
            setattr(self, "blocks_%d" % i, NestedTensorBlock(EMBED))
        self.norm = LayerNorm(EMBED)

    def get_intermediate_layers(self, x, n=4):
        x = self.patch_embed(x)
        outs = []
        for i in range(DEPTH):
            x = getattr(self, "blocks_%d" % i)(x)
            if i >= DEPTH - n:
                outs.append(self.norm(x))
        return outs

    def forward(self, x):
        return self.get_intermediate_layers(x)


class LinearHead(torch.nn.Module):
    """The DINOv2 'linear' segmentation head: BN over the 4 concatenated layers, 1x1 conv to classes."""

    def __init__(self, cin, n_classes):
        torch.nn.Module.__init__(self)
        self.bn = LayerNorm(cin)
        self.conv_seg = Linear(cin, n_classes)

    def forward(self, feats):
        x = torch._derive(torch.empty(sum(f.nbytes for f in feats), device="cuda"), *feats)   # torch.cat
        logits = self.conv_seg(self.bn(x))
        return F.interpolate(logits, scale_factor=PATCH, mode="bilinear")


class Segmenter(torch.nn.Module):
    def __init__(self, backbone, head):
        torch.nn.Module.__init__(self)
        self.backbone = backbone
        self.decode_head = head

    def forward(self, images):
        feats = self.backbone(images)
        return self.decode_head(feats)


def orthomosaic_tiles(n_steps):
    for _ in range(n_steps):
        images = torch.empty(BATCH_SIZE * 3 * IMG * IMG, dtype=torch.float32, device="cuda")
        masks = torch.empty(BATCH_SIZE * IMG * IMG * 8, device="cuda")          # int64 labels
        yield images, masks


def main():
    backbone = DinoVisionTransformer()
    model = Segmenter(backbone, LinearHead(4 * EMBED, N_CLASSES)).cuda()
    optimizer = torch.optim.AdamW(model.decode_head.parameters(), lr=1e-3, weight_decay=1e-4)
    n_train = sum(p.nbytes for p in optimizer.param_groups[0]["params"]) // 4
    print("trainable parameters (head): %.2fM" % (n_train / 1e6))
    for epoch in range(40):
        model.train()
        model.backbone.eval()
        for step, (images, masks) in enumerate(orthomosaic_tiles(250)):
            logits = model(images)
            loss = F.cross_entropy(logits, masks)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 50 == 0:
                print("epoch %d step %d allocated %.1f GiB" % (epoch, step, torch.cuda.memory_allocated() / 2**30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
