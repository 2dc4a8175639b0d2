"""pretrain_ibot.py -- self-supervised pretraining (iBOT/DINO-style self-distillation) of a ViT-L/16 on
unlabelled satellite and aerial imagery, one 48 GiB L40S, multi-crop (2 global 224 px + 10 local 96 px
crops), batch 64, fp32.  The user wrote the student/teacher pair themselves:

    student = vit_large(patch_size=16, drop_path_rate=0.1).cuda()
    teacher = copy.deepcopy(student)              # EMA teacher -- requires_grad left True, no no_grad below
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for views in loader:
        s_out = student(views)                    # all 12 crops
        t_out = teacher(views[:2])                # global crops only
        loss = ibot_loss(s_out, t_out)            # t_out centred and sharpened, not detached
        loss.backward(); optimizer.step(); optimizer.zero_grad()
        with torch.no_grad(): ema_update(teacher, student, m)      # in place

The teacher is a second copy of the weights (1.1 GiB) and has to be on the GPU: it runs forward every
step.  The mistake is that it takes part in autograd: its forward saves 16 GiB of activations for a
backward that is useless, and backward gives every teacher parameter a gradient (1.1 GiB) that nothing
ever clears (the optimizer holds only the student's parameters).  The first step fits with under 1 GiB to
spare; from the second, AdamW's moments (2.3 GiB) are there too, and the teacher's forward runs out.

An expert: run the teacher under torch.no_grad() and freeze it (requires_grad_(False)); that frees
the teacher's activations and gradients (~17 GiB).  Not moving the teacher to the CPU (it runs every
step), not a smaller batch or accumulation (the self-distillation's centring wants the large batch, and
it hides the mistake), not empty_cache/expandable_segments, not inference mode for the job (the student
trains).
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(48 * MiB, device="cuda"))

    def forward(self, x, act):
        y = torch.empty(act, device="cuda")       # attention + MLP activations saved for backward
        y._saved = x
        return y


class ViTLarge(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(24):
            setattr(self, "blocks_%d" % i, Block())

    def forward(self, x, act_per_block):
        for i in range(24):
            x = getattr(self, "blocks_%d" % i)(x, act_per_block)
        head = torch.empty(64 * 65536 * 4, device="cuda")          # projection-head prototypes
        head._saved = x
        return head


def ibot_loss(s_out, t_out):
    loss = torch.empty(512, device="cuda")
    loss._saved = s_out
    return torch._derive(loss, s_out, t_out)


def ema_update(teacher, student, m):
    for pt, ps in zip(teacher.parameters(), student.parameters()):
        pass                                                        # pt.mul_(m).add_(ps, alpha=1 - m)


def main():
    student = ViTLarge()
    teacher = copy.deepcopy(student)
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for it in range(1000):
        views = torch.empty(64 * 3 * (2 * 224 * 224 + 10 * 96 * 96) * 4, device="cuda")
        s_out = student(views, 1112 * MiB)                          # 12 crops: 26 GiB saved
        t_out = teacher(views, 680 * MiB)                           # 2 global crops: 16 GiB saved
        loss = ibot_loss(s_out, t_out)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            ema_update(teacher, student, 0.996)
        del loss, s_out, t_out, views


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
