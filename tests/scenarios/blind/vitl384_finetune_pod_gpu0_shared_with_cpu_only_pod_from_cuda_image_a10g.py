"""ViT-L/16 @384 fine-tune in a Kubernetes pod that was given GPU 0 of a g5.12xlarge node: another team's pod on
the same node requests no GPU at all, but its image is built FROM a CUDA base image (NVIDIA_VISIBLE_DEVICES=all),
so the nvidia runtime hands it every GPU of the node and its embedding service runs on cuda:0 -- this pod's GPU.

The real code (train_products_vitl.py, Kubernetes Job requesting nvidia.com/gpu: 1):

    model = timm.create_model("vit_large_patch16_384", pretrained=True, num_classes=2300).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
    for images, labels in loader:                       # batch 28 (the largest that fit on the dev node)
        images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The neighbour: the "caption-embedder" Deployment (bge-large-en-v1.5 behind FastAPI) has no GPU request -- its
manifest says CPU only -- but `device = "cuda" if torch.cuda.is_available() else "cpu"` finds four GPUs, because
its base image pytorch/pytorch:2.3.1-cuda12.1-cudnn8-runtime sets NVIDIA_VISIBLE_DEVICES=all and the node's default
runtime is nvidia.  It loaded its model and cached its batch buffers on node GPU 0: ~7.2 GiB, held all day.  In
this pod, nvidia-smi shows 7.2 GiB used before training starts and lists no process (another container's pid
namespace); the device plugin reports GPU 0 as allocated to this pod alone.

The arithmetic (A10G, 23028 MiB):
  the other container                    ~7.2 GiB
  this pod's CUDA context                 0.5 GiB
  ViT-L/16 fp32 weights, 304M params      1.13 GiB
  batch-28 activations (577 tokens, bf16 matmul outputs, fp32 residual stream, SDPA attention:
  24 blocks x ~0.62 GiB)                  ~14.9 GiB
  -> 7.2 + 0.5 + 1.13 + 14.9 = 23.7 GiB > 22.5: the first forward pass fails in block 21 of 24 (a 126 MiB
  MLP activation with 99 MiB free).
  On a dedicated g5 dev node the same job ran at ~20 GiB (with AdamW's 2.3 GiB and the gradients):
  batch 28 was the largest that fit there, so nothing is left for a neighbour.

What an expert says first: 7.2 GiB of this GPU belong to another process that is not this job (not visible in
this pid namespace): find it (node-level nvidia-smi / DCGM pod attribution), and keep CPU-only pods off the GPUs
(NVIDIA_VISIBLE_DEVICES=void or CUDA_VISIBLE_DEVICES="" in that Deployment, or a device-plugin / runtime setup that
ignores the env var for unprivileged containers).  Only then, if needed, trim this job (smaller batch with
accumulation, gradient checkpointing).
Wrong advice: expandable_segments / empty_cache (nothing is cached or fragmented: the first step), inference mode,
quantization, restarting this pod (the neighbour keeps its memory), a 'leak' in the training loop.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

IMG_SIZE = 384
PATCH = 16
EMBED_DIM, DEPTH, HEADS, MLP_RATIO = 1024, 24, 16, 4
NUM_CLASSES = 2300
BATCH_SIZE = 28
EPOCHS = 10
TOKENS = (IMG_SIZE // PATCH) ** 2 + 1


def _param(n_elems):
    return nn.Parameter(torch.empty(n_elems * 4, device="cuda"))     # fp32 weights


def _act(n_elems, saved_from, dtype=torch.bfloat16):
    t = torch.empty(n_elems * torch._ITEMSIZE[dtype], device="cuda")
    t._dtype = dtype
    t._saved = saved_from
    return t


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = _param(dim)
        self.bias = _param(dim)

    def forward(self, x):
        w, b = self.weight, self.bias
        # LayerNorm runs in fp32 under autocast; the next matmul reads (and saves) its bf16 output
        return _act(x.nbytes // 4, x)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.qkv_weight = _param(dim * dim * 3)
        self.qkv_bias = _param(dim * 3)
        self.proj_weight = _param(dim * dim)
        self.proj_bias = _param(dim)

    def forward(self, x):
        n_tok = x.nbytes // (EMBED_DIM * 2)
        w = self.qkv_weight, self.qkv_bias, self.proj_weight, self.proj_bias
        qkv = _act(n_tok * EMBED_DIM * 3, x)                 # bf16 q, k, v (saved by SDPA)
        lse = _act(n_tok * self.num_heads, qkv, torch.float32)   # flash/mem-efficient SDPA's logsumexp
        attn_out = _act(n_tok * EMBED_DIM, lse)
        return _act(n_tok * EMBED_DIM, attn_out)             # proj output


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        nn.Module.__init__(self)
        self.fc1_weight, self.fc1_bias = _param(dim * hidden), _param(hidden)
        self.fc2_weight, self.fc2_bias = _param(hidden * dim), _param(dim)
        self.hidden = hidden

    def forward(self, x):
        n_tok = x.nbytes // (EMBED_DIM * 2)
        w = self.fc1_weight, self.fc1_bias, self.fc2_weight, self.fc2_bias
        h = _act(n_tok * self.hidden, x)                     # fc1 out
        h = _act(n_tok * self.hidden, h)                     # GELU out
        return _act(n_tok * EMBED_DIM, h)                    # fc2 out


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, dim * mlp_ratio)

    def forward(self, x):
        n_tok = x.nbytes // (EMBED_DIM * 4)
        x = _act(n_tok * EMBED_DIM, self.attn(self.norm1(x)), torch.float32)   # x + attn(norm1(x)), fp32
        x = _act(n_tok * EMBED_DIM, self.mlp(self.norm2(x)), torch.float32)    # x + mlp(norm2(x))
        return x


class Sequential(nn.Module):
    """nn.Sequential(*blocks): children stored under "0" ... "23"."""

    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def forward(self, x):
        for m in self._modules.values():
            x = m(x)
        return x


class VisionTransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embed = _param(3 * PATCH * PATCH * EMBED_DIM + EMBED_DIM)
        self.cls_token = _param(EMBED_DIM)
        self.pos_embed = _param(TOKENS * EMBED_DIM)
        self.blocks = Sequential([Block(EMBED_DIM, HEADS, MLP_RATIO) for _ in range(DEPTH)])
        self.norm = LayerNorm(EMBED_DIM)
        self.head = _param(EMBED_DIM * NUM_CLASSES + NUM_CLASSES)

    def forward(self, images):
        batch = images.nbytes // (3 * IMG_SIZE * IMG_SIZE * 4)
        w = self.patch_embed, self.cls_token, self.pos_embed
        x = _act(batch * TOKENS * EMBED_DIM, images, torch.float32)
        x = self.blocks(x)
        x = self.norm(x)
        head = self.head
        return _act(batch * NUM_CLASSES, x, torch.float32)


class ProductImages(object):
    """DataLoader(ImageFolder("/data/products", RandAugment, 384px), batch_size=32, num_workers=8, pin_memory=True)."""

    def __iter__(self):
        for _ in range(5000):
            yield (torch.empty(BATCH_SIZE * 3 * IMG_SIZE * IMG_SIZE * 4, device="cuda"),
                   torch.empty(BATCH_SIZE * 8, device="cuda"))


def train_one_epoch(model, optimizer, loader, epoch):
    model.train()
    for step, (images, labels) in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels)
        scen_truth.backward(loss)                # loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print("epoch %d step %d" % (epoch, step), flush=True)


def main():
    model = VisionTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
    loader = ProductImages()
    free, total = torch.cuda.mem_get_info()
    print("GPU 0: %.1f GiB free of %.1f GiB" % (free / 2**30, total / 2**30), flush=True)
    for epoch in range(EPOCHS):
        train_one_epoch(model, optimizer, loader, epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
