"""Distilling a small CLIP (ViT-S/16 image tower + 12-layer text tower, 62M parameters) from OpenCLIP ViT-L/14
(laion2b_s32b_b82k) on one A100 40GB; the teacher runs with autograd on.

The real program (open_clip 2.26, torch 2.4), a TinyCLIP-style affinity-distillation loop:

    teacher, _, preprocess = open_clip.create_model_and_transforms("ViT-L-14", pretrained="laion2b_s32b_b82k")
    teacher = teacher.cuda()                      # no .eval(), no .requires_grad_(False), no torch.no_grad()
    student = open_clip.create_model("ViT-S-16-tiny-text").cuda().train()
    opt = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.1)
    loss_fn = DistillClipLoss()
    for images, texts in loader:                  # batch 256
        with torch.autocast("cuda", dtype=torch.bfloat16):
            t_img = F.normalize(teacher.encode_image(images), dim=-1)
            t_txt = F.normalize(teacher.encode_text(texts), dim=-1)
            s_img = F.normalize(student.encode_image(images), dim=-1)
            s_txt = F.normalize(student.encode_text(texts), dim=-1)
            loss = clip_loss(s_img, s_txt) + affinity_kd(s_img @ s_txt.T, t_img @ t_txt.T)
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)

open_clip returns the teacher with requires_grad=True on every parameter (it is a trainable model), and the
distillation target t_img @ t_txt.T is not detached, so autograd records the teacher's whole forward: every
block keeps its activations for a backward that would then also make 1.7 GB of teacher gradients that no
optimizer ever reads (the optimizer holds only the student's parameters).

Sizes (teacher ViT-L/14: image tower 257 tokens, width 1024, 24 blocks; text tower 77 tokens, width 768, 12
blocks; 428M parameters in fp32 = 1.71 GB.  Student 62M fp32 = 0.25 GB).  Per block, under bf16 autocast with
SDPA attention, autograd keeps ~36 bytes x width per token (ln_1's bf16 output 2h, q/k/v 6h, attention output
2h, fp32 residual 4h, ln_2's bf16 output 2h, c_fc and GELU outputs 8h + 8h, fp32 block output 4h):
  teacher image tower, batch 256: 65,792 tokens x 36 x 1024 B = 2.4 GB per block, 58 GB for 24 blocks
  teacher text tower:             19,712 tokens x 36 x 768 B  = 0.55 GB per block, 6.5 GB for 12 blocks
  student (for comparison):       ~12 GB for both towers at batch 256
A100 40 GB: 0.5 GB context + 2.0 GB of weights + 0.15 GB of pixels leave ~40 GB: the teacher's image tower
alone runs out of memory in block 17 of its 24 (38.8 GB allocated after 16 blocks; the failing request is the
135 MB bf16 ln_1 output), in the first step, before the student has run at all.  Under torch.no_grad the teacher
needs only one block's temporaries (~2.4 GB) and the student's ~12 GB of activations fit easily.

What an expert says: the teacher is a fixed target: teacher.eval().requires_grad_(False) and run its forward
under torch.no_grad() (or torch.inference_mode()), or precompute its embeddings once.  Wrong advice: a smaller
batch (it shrinks the contrastive batch of the student for a waste that is not its own), gradient
checkpointing (it would checkpoint a forward that needs no backward at all), an 8-bit optimizer, LoRA or ZeRO
(the student's optimizer state is 0.5 GB), empty_cache / expandable_segments (all of it is live), a bigger GPU.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
BATCH_SIZE = 256
IMAGE_SIZE = 224
VOCAB, TEXT_TOKENS = 49408, 77


def saved_for_backward(prev, numel, dtype):
    """A tensor an op of the forward makes and autograd keeps for the backward (chained after `prev`)."""
    t = torch.empty(numel, dtype=dtype, device=DEVICE)
    t._saved = prev
    return t


class ResidualAttentionBlock(nn.Module):
    """open_clip.transformer.ResidualAttentionBlock: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x))."""

    def __init__(self, width, heads):
        super().__init__()
        self.width, self.heads = width, heads
        self.in_proj_weight = nn.Parameter(torch.empty(3 * width * width, dtype=torch.float32, device=DEVICE))
        self.out_proj_weight = nn.Parameter(torch.empty(width * width, dtype=torch.float32, device=DEVICE))
        self.c_fc_weight = nn.Parameter(torch.empty(4 * width * width, dtype=torch.float32, device=DEVICE))
        self.c_proj_weight = nn.Parameter(torch.empty(4 * width * width, dtype=torch.float32, device=DEVICE))

    def forward(self, x, n_tokens):
        h = n_tokens * self.width
        if not torch.is_grad_enabled():                          # nothing is kept for backward
            qkv = torch.empty(3 * h, dtype=torch.bfloat16, device=DEVICE)
            fc = torch.empty(4 * h, dtype=torch.bfloat16, device=DEVICE)
            del qkv, fc
            return torch.empty(h, dtype=torch.float32, device=DEVICE)
        y = saved_for_backward(x, h, torch.bfloat16)            # ln_1(x), cast for in_proj
        qkv = saved_for_backward(y, 3 * h, torch.bfloat16)      # q, k, v saved by SDPA
        attn = saved_for_backward(qkv, h, torch.bfloat16)       # SDPA output, saved by out_proj
        x = saved_for_backward(attn, h, torch.float32)          # residual stream, saved by ln_2
        y = saved_for_backward(x, h, torch.bfloat16)            # ln_2(x), saved by c_fc
        fc = saved_for_backward(y, 4 * h, torch.bfloat16)       # c_fc output, saved by GELU
        act = saved_for_backward(fc, 4 * h, torch.bfloat16)     # GELU output, saved by c_proj
        return saved_for_backward(act, h, torch.float32)        # next block's ln_1 input


class Transformer(nn.Module):
    def __init__(self, width, layers, heads):
        super().__init__()
        self.width = width
        self.resblocks = [ResidualAttentionBlock(width, heads) for _ in range(layers)]
        for i, blk in enumerate(self.resblocks):
            setattr(self, "resblock_%d" % i, blk)

    def forward(self, x, n_tokens):
        for blk in self.resblocks:
            x = blk(x, n_tokens)
        return x


class VisionTransformer(nn.Module):
    def __init__(self, width, layers, heads, patch, output_dim):
        super().__init__()
        self.width, self.output_dim = width, output_dim
        self.n_tokens = (IMAGE_SIZE // patch) ** 2 + 1
        self.conv1_weight = nn.Parameter(torch.empty(width * 3 * patch * patch, dtype=torch.float32, device=DEVICE))
        self.positional_embedding = nn.Parameter(torch.empty(self.n_tokens * width, dtype=torch.float32,
                                                             device=DEVICE))
        self.transformer = Transformer(width, layers, heads)
        self.proj = nn.Parameter(torch.empty(width * output_dim, dtype=torch.float32, device=DEVICE))

    def forward(self, pixels, batch):
        n = batch * self.n_tokens
        x = saved_for_backward(pixels, n * self.width, torch.float32)   # patches + class token + pos, ln_pre
        x = self.transformer(x, n)
        return saved_for_backward(x, batch * self.output_dim, torch.bfloat16)


class TextTransformer(nn.Module):
    def __init__(self, width, layers, heads, output_dim):
        super().__init__()
        self.width, self.output_dim = width, output_dim
        self.token_embedding = nn.Parameter(torch.empty(VOCAB * width, dtype=torch.float32, device=DEVICE))
        self.positional_embedding = nn.Parameter(torch.empty(TEXT_TOKENS * width, dtype=torch.float32,
                                                             device=DEVICE))
        self.transformer = Transformer(width, layers, heads)
        self.text_projection = nn.Parameter(torch.empty(width * output_dim, dtype=torch.float32, device=DEVICE))

    def forward(self, tokens, batch):
        n = batch * TEXT_TOKENS
        x = saved_for_backward(tokens, n * self.width, torch.float32)
        x = self.transformer(x, n)
        return saved_for_backward(x, batch * self.output_dim, torch.bfloat16)


class CLIP(nn.Module):
    def __init__(self, vision_cfg, text_cfg, embed_dim):
        super().__init__()
        self.visual = VisionTransformer(output_dim=embed_dim, **vision_cfg)
        self.transformer = TextTransformer(output_dim=embed_dim, **text_cfg)
        self.logit_scale = nn.Parameter(torch.empty(1, dtype=torch.float32, device=DEVICE))

    def encode_image(self, pixels, batch):
        return self.visual(pixels, batch)

    def encode_text(self, tokens, batch):
        return self.transformer(tokens, batch)


def create_model(name, pretrained=None):
    """open_clip.create_model(...).cuda(): weights in fp32 (precision="fp32"), every parameter trainable."""
    if name == "ViT-L-14":
        return CLIP(dict(width=1024, layers=24, heads=16, patch=14), dict(width=768, layers=12, heads=12), 768)
    if name == "ViT-S-16-tiny-text":
        return CLIP(dict(width=384, layers=12, heads=6, patch=16), dict(width=384, layers=12, heads=6), 384)
    raise ValueError(name)


class DistillClipLoss(nn.Module):
    """open_clip.loss.DistillClipLoss: CLIP loss of the student + KL(teacher || student) over the in-batch
    image-text affinities (logit_scale * img @ txt.T)."""

    def forward(self, image_features, text_features, dist_image_features, dist_text_features):
        logits_per_image = torch.empty(BATCH_SIZE * BATCH_SIZE, dtype=torch.float32, device=DEVICE)
        logits_per_image._saved = image_features
        dist_logits_per_image = torch.empty(BATCH_SIZE * BATCH_SIZE, dtype=torch.float32, device=DEVICE)
        dist_logits_per_image._saved = dist_image_features
        contrastive = F.cross_entropy(logits_per_image, None)
        distill = F.cross_entropy(dist_logits_per_image, None)   # soft targets: -(p_t * log p_s).sum(-1)
        return contrastive                                       # + distill


def loader():
    """webdataset pipeline; (images, texts) moved with .cuda(non_blocking=True)."""
    while True:
        images = torch.empty(BATCH_SIZE * 3 * IMAGE_SIZE * IMAGE_SIZE, dtype=torch.float32, device=DEVICE)
        texts = torch.empty(BATCH_SIZE * TEXT_TOKENS * 8, dtype=torch.uint8, device=DEVICE)
        yield images, texts


def main():
    teacher = create_model("ViT-L-14", pretrained="laion2b_s32b_b82k")
    student = create_model("ViT-S-16-tiny-text")
    student.train()
    opt = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.1)
    loss_fn = DistillClipLoss()
    for step, (images, texts) in enumerate(loader()):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            t_img = teacher.encode_image(images, BATCH_SIZE)
            t_txt = teacher.encode_text(texts, BATCH_SIZE)
            s_img = student.encode_image(images, BATCH_SIZE)
            s_txt = student.encode_text(texts, BATCH_SIZE)
            loss = loss_fn(s_img, s_txt, t_img, t_txt)
        scen_truth.backward(loss)                    # loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
