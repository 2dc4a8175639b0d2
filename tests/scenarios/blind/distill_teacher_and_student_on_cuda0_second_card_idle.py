"""distill_vit.py -- distilling a frozen ViT-g teacher (1.1B parameters, fp32) into a ViT-L student on a
workstation with two 24 GB cards, with plain `LD_PRELOAD=liboomguard.so`:

    device = torch.device("cuda")                          # = cuda:0
    teacher = vit_giant(pretrained=True).to(device).eval() # frozen, 4.1 GiB
    student = vit_large().to(device)                       # 1.1 GiB + grads + AdamW
    knn_bank = FeatureBank(1_281_167, 256, device="cuda:1")  # the kNN monitor, per the repo's README
    for images, _ in loader:                               # batch 128, 224 px
        with torch.no_grad():
            t = teacher(images)
        s = student(images)
        loss = distill_loss(s, t); loss.backward(); optimizer.step(); optimizer.zero_grad()

The user meant to put the teacher on the second card (the repo's config has TEACHER_DEVICE, which
this script never reads): everything lands on cuda:0 and the second card holds only the kNN bank
(625 MiB).  The teacher runs properly under no_grad; the student's forward keeps 800 MiB of
activations per block for backward (batch 128, 24 blocks) and runs out in its 24th block on cuda:0,
with 23 GiB free on cuda:1.

An expert: the second card is idle -- put the frozen teacher there (teacher.to("cuda:1"), its
features moved back with .to("cuda:0"): 4.1 GiB off cuda:0, and the student's step then fits).  Not
a bigger card, not teacher-under-no_grad (it already is), not quantization; a smaller batch would
work but changes the recipe while half the machine is unused.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

DEVICE = "cuda"                    # cuda:0
KNN_BANK_DEVICE = "cuda:1"
TEACHER_DEVICE = "cuda:1"          # from the repo's config; never read below
batch_size = 128


class ViTBlock(torch.nn.Module):
    def __init__(self, param_bytes, act_bytes, device):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(param_bytes // 3, device=device))
        self.mlp = torch.nn.Parameter(torch.empty(param_bytes - param_bytes // 3, device=device))
        self.act_bytes = act_bytes
        self.device = device

    def forward(self, x):
        if torch.is_grad_enabled():
            # saved for backward: attention maps, MLP inputs, GELU outputs
            h = torch.empty(self.act_bytes // 2, device=self.device)
            h._saved = x
            out = torch.empty(self.act_bytes - self.act_bytes // 2, device=self.device)
            out._saved = h
            return out
        out = torch.empty(96 * MiB, device=self.device)     # no_grad: only the running tokens
        return out


class VisionTransformer(torch.nn.Module):
    def __init__(self, depth, block_bytes, act_bytes, device):
        torch.nn.Module.__init__(self)
        self.blocks = []
        for i in range(depth):
            b = ViTBlock(block_bytes, act_bytes, device)
            setattr(self, "block%d" % i, b)
            self.blocks.append(b)

    def forward(self, images):
        x = images
        for b in self.blocks:
            x = b(x)
        return x


def vit_giant(pretrained=True, device=DEVICE):
    m = VisionTransformer(40, 105 * MiB, 0, device)
    for p in m.parameters():
        p.requires_grad_(False)
    return m


def vit_large(device=DEVICE):
    return VisionTransformer(24, 48 * MiB, 800 * MiB, device)


class FeatureBank(object):
    def __init__(self, n, dim, device):
        self.features = torch.empty(n * dim * 2, device=device)      # fp16


def distill_loss(s, t):
    loss = torch.empty(512, device=DEVICE)
    loss._saved = s
    loss._params = s._params
    return loss


def loader():
    while True:
        yield torch.empty(batch_size * 3 * 224 * 224 * 4, device=DEVICE), None


def main():
    teacher = vit_giant(pretrained=True, device=DEVICE).eval()
    student = vit_large(device=DEVICE)
    knn_bank = FeatureBank(1281167, 256, device=KNN_BANK_DEVICE)
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for step, (images, _) in enumerate(loader()):
        with torch.no_grad():
            t = teacher(images)
        s = student(images)
        loss = distill_loss(s, t)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 3:
            break
    return knn_bank


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
