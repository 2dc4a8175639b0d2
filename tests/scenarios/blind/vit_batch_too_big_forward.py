"""train_vit.py -- fine-tuning ViT-L/16 at 384 px for classification, fp32 (no autocast), batch 128,
on a 24 GiB card:

    model = vit_large_patch16_384(num_classes=1000).cuda()          # 1.2 GiB of fp32 weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for images, labels in loader:                                    # 128 x 3 x 384 x 384
        loss = criterion(model(images), labels)
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Each of the 24 blocks saves ~1.2 GiB of activations for backward at this batch size (576 tokens x
128 images, attention scores included); the very first forward pass fails in block 19 of 24.
Nothing else is on the card, nothing was freed or cached yet, nothing grows: the batch is simply
too big for fp32 activations.  An expert: the textbook answer -- a smaller batch with gradient
accumulation, autocast bf16, or gradient checkpointing of the blocks.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))    # qkv + proj
        self.mlp = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))     # fc1 + fc2

    def forward(self, x):
        scores = torch.empty(400 * MiB, device="cuda")     # attention probabilities, saved
        hidden = torch.empty(400 * MiB, device="cuda")     # MLP hidden (GELU input), saved
        out = torch.empty(400 * MiB, device="cuda")
        out._saved = (x, scores, hidden)                   # autograd keeps them until backward
        return out


class ViT(torch.nn.Module):
    def __init__(self, depth=24):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.blocks = [Block() for _ in range(depth)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, images):
        x = images
        for blk in self.blocks:
            x = blk(x)
        return x


def main():
    model = ViT().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(1000):
        images = torch.empty(216 * MiB, device="cuda")     # 128 x 3 x 384 x 384 fp32
        logits = model(images)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = logits._params, logits
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
