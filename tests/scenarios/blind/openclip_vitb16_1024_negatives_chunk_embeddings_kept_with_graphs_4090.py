"""OpenCLIP ViT-B/16 domain fine-tune on one RTX 4090 (24 GB), trying to get 1024 in-batch negatives.

The real program (open_clip 2.24, torch 2.3, one GPU, no torchrun):

    model, _, preprocess = open_clip.create_model_and_transforms("ViT-B-16", pretrained="laion2b_s34b_b88k")
    model.cuda().train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.2)
    scaler = torch.cuda.amp.GradScaler()
    for images, texts in loader:                       # 1024 pairs per batch: "CLIP needs big batches"
        img_feats, txt_feats = [], []
        with torch.autocast("cuda", dtype=torch.float16):
            for i in range(0, 1024, 64):               # "micro-batches of 64 fit easily"
                img_feats.append(F.normalize(model.encode_image(images[i:i+64].cuda()), dim=-1))
                txt_feats.append(F.normalize(model.encode_text(texts[i:i+64].cuda()), dim=-1))
            loss = clip_loss(torch.cat(img_feats), torch.cat(txt_feats), model.logit_scale.exp())
        scaler.scale(loss).backward()
        ...

The user knows that a batch of 64 pairs trains fine on this card (about 5.3 GB of activations), so they
"accumulate" 16 chunks of 64 to get the 1024x1024 similarity matrix the CLIP papers use.  But every chunk
is encoded with autograd on and its embeddings are kept, with their graphs, for the single loss at the end:
nothing is freed until backward, so the step needs 16 times one chunk's activations.

Sizes (ViT-B/16 image tower: 197 tokens, width 768, 12 blocks; text tower: 77 tokens, width 512, 12 blocks;
149.6M parameters in fp32 = 0.6 GB).  Per block, under fp16 autocast with SDPA attention (no s^2 scores kept),
autograd keeps ~36 bytes x width per token: the fp16 copy of ln_1's output (2h), q/k/v (6h), the attention
output (2h), the fp32 residual stream after attention (4h), ln_2's fp16 output (2h), c_fc's output and the GELU
output (8h + 8h) and the block's fp32 output (4h).  One chunk of 64 pairs:
  image: 64 x 197 = 12,608 tokens x (3,072 B of patch/pos embeddings + 12 x 36 x 768 B) = 4.22 GB
  text:  64 x 77  =  4,928 tokens x (2,048 B of token/pos embeddings  + 12 x 36 x 512 B) = 1.10 GB
  = 5.32 GB per chunk, plus its 38.5 MB of pixels, which the patch convolution saves.
24 GiB card: 0.5 GB context + 0.6 GB weights leave ~24.6 GB; with the caching allocator's rounding (the text
tower's 5-10 MB tensors live in 20 MiB segments) a chunk takes ~5.4 GB, so four chunks (22.2 GB allocated) fit
and chunk 5 dies in its image tower, at block 7 of 12 (the 37 MiB fp32 residual stream after attention),
during the first step, before any backward or optimizer step.

What an expert says: the list of embeddings keeps every chunk's graph.  For a contrastive loss the fix is
GradCache (Gao et al. 2021): encode all chunks under torch.no_grad, compute the loss and the gradient w.r.t.
the 1024 embeddings, then re-encode chunk by chunk with autograd on and backward each chunk with its cached
embedding gradient; peak memory is one chunk.  Alternatively open_clip's --grad-checkpointing
(model.set_grad_checkpointing()): each chunk then keeps only its block inputs (~0.3 GB), 16 chunks ~4.7 GB, which
fits.  Wrong advice: "smaller batch + gradient accumulation" (accumulating per-chunk losses changes the
objective: each chunk would see only 63 negatives, the very thing the user is trying to avoid), empty_cache or
expandable_segments (the memory is live), inference_mode (this is training), quantization.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
CONTRASTIVE_BATCH = 1024     # pairs in one similarity matrix (the negatives)
MICRO_BATCH = 64             # pairs encoded at a time
IMAGE_TOKENS, TEXT_TOKENS = 197, 77
VOCAB = 49408


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
        y = saved_for_backward(x, h, torch.float16)            # ln_1(x), cast to fp16 for in_proj
        qkv = saved_for_backward(y, 3 * h, torch.float16)      # q, k, v saved by SDPA
        attn = saved_for_backward(qkv, h, torch.float16)       # SDPA output, saved by out_proj
        x = saved_for_backward(attn, h, torch.float32)         # residual stream, saved by ln_2
        y = saved_for_backward(x, h, torch.float16)            # ln_2(x) in fp16, saved by c_fc
        fc = saved_for_backward(y, 4 * h, torch.float16)       # c_fc output, saved by GELU
        act = saved_for_backward(fc, 4 * h, torch.float16)     # GELU output, saved by c_proj
        return saved_for_backward(act, h, torch.float32)       # x + mlp(...): next block's ln_1 input


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
    def __init__(self, width=768, layers=12, heads=12, patch=16, output_dim=512):
        super().__init__()
        self.width = width
        self.conv1_weight = nn.Parameter(torch.empty(width * 3 * patch * patch, dtype=torch.float32, device=DEVICE))
        self.positional_embedding = nn.Parameter(torch.empty(IMAGE_TOKENS * width, dtype=torch.float32, device=DEVICE))
        self.transformer = Transformer(width, layers, heads)
        self.proj = nn.Parameter(torch.empty(width * output_dim, dtype=torch.float32, device=DEVICE))

    def forward(self, pixels, batch):
        n = batch * IMAGE_TOKENS
        x = saved_for_backward(pixels, n * self.width, torch.float32)   # patches + class token + pos, ln_pre
        x = self.transformer(x, n)
        return saved_for_backward(x, batch * 512, torch.float16)         # ln_post(cls) @ proj


class TextTransformer(nn.Module):
    def __init__(self, width=512, layers=12, heads=8, output_dim=512):
        super().__init__()
        self.width = width
        self.token_embedding = nn.Parameter(torch.empty(VOCAB * width, dtype=torch.float32, device=DEVICE))
        self.positional_embedding = nn.Parameter(torch.empty(TEXT_TOKENS * width, dtype=torch.float32, device=DEVICE))
        self.transformer = Transformer(width, layers, heads)
        self.text_projection = nn.Parameter(torch.empty(width * output_dim, dtype=torch.float32, device=DEVICE))

    def forward(self, tokens, batch):
        n = batch * TEXT_TOKENS
        x = saved_for_backward(tokens, n * self.width, torch.float32)   # token_embedding(text) + pos
        x = self.transformer(x, n)
        return saved_for_backward(x, batch * 512, torch.float16)         # ln_final(x[eot]) @ text_projection


class CLIP(nn.Module):
    def __init__(self):
        super().__init__()
        self.visual = VisionTransformer()
        self.text = TextTransformer()
        self.logit_scale = nn.Parameter(torch.empty(1, dtype=torch.float32, device=DEVICE))

    def encode_image(self, pixels, batch):
        return self.visual(pixels, batch)

    def encode_text(self, tokens, batch):
        return self.text(tokens, batch)


def load_shard_batch(step):
    """webdataset batch of CONTRASTIVE_BATCH (image, caption) pairs, kept on the host; cut into chunks that go
    to the GPU as they are encoded (images[i:i+64].cuda(non_blocking=True))."""
    for i in range(0, CONTRASTIVE_BATCH, MICRO_BATCH):
        pixels = torch.empty(MICRO_BATCH * 3 * 224 * 224, dtype=torch.float32, device=DEVICE)
        tokens = torch.empty(MICRO_BATCH * TEXT_TOKENS, dtype=torch.int8, device=DEVICE)   # int64 ids, 8 B each
        yield pixels, tokens


def clip_loss(image_features, text_features, logit_scale):
    all_img = torch.empty(CONTRASTIVE_BATCH * 512, dtype=torch.float16, device=DEVICE)    # torch.cat(...)
    all_txt = torch.empty(CONTRASTIVE_BATCH * 512, dtype=torch.float16, device=DEVICE)
    all_img._saved, all_txt._saved = image_features[-1], text_features[-1]
    logits_per_image = torch.empty(CONTRASTIVE_BATCH * CONTRASTIVE_BATCH, dtype=torch.float16, device=DEVICE)
    logits_per_image._saved = all_img
    labels = torch.empty(CONTRASTIVE_BATCH, dtype=torch.int8, device=DEVICE)
    return F.cross_entropy(logits_per_image, labels)


def train_step(model, optimizer, scaler, step):
    image_features, text_features = [], []
    with torch.autocast("cuda", dtype=torch.float16):
        for pixels, tokens in load_shard_batch(step):
            image_features.append(model.encode_image(pixels, MICRO_BATCH))
            text_features.append(model.encode_text(tokens, MICRO_BATCH))
        loss = clip_loss(image_features, text_features, model.logit_scale)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def main():
    model = CLIP()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.2)
    scaler = torch.cuda.amp.GradScaler()
    for step in range(2000):
        train_step(model, optimizer, scaler, step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
