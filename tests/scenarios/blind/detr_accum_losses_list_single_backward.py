"""train_detr.py -- fine-tuning a DETR-style detector (ResNet-50 backbone + 6/6-layer transformer,
41M parameters, fp32, AdamW) on a custom dataset of shelf photos at 800 x 1333, on a 24 GiB card.
Only 4 images fit per forward, so the author accumulates 16 micro-batches for an effective batch
of 64, keeping the losses in a list and calling backward once on their mean:

    for step, (images, targets) in enumerate(loader):             # 64 images per step
        losses = []
        for imgs, tgts in zip(images.cuda().split(4), chunk(targets, 4)):
            outputs = model(imgs)
            loss_dict = criterion(outputs, tgts)
            losses.append(sum(loss_dict[k] * weight_dict[k] for k in loss_dict))
        torch.stack(losses).mean().backward()                     # one backward for 16 graphs
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Every micro-batch's forward saves ~2.6 GiB of activations (the backbone at 800 x 1333 is most of
it) that stay alive through the losses list until the single backward; the ninth micro-batch of
the very first step does not fit.  The model and its optimizer are small (0.6 GiB); nothing leaks
across steps, nothing is cached, nothing else is on the card.  An expert: call backward on each
micro-batch's loss ((loss / 16).backward() inside the loop, optimizer.step() after the 16th), so only
one micro-batch's graph is alive at a time; a smaller micro-batch, checkpointing or a bigger card only
move the failure.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
ACCUM, MICRO = 16, 4


class Stage(torch.nn.Module):
    def __init__(self, mib, act_mib, n_act):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, device="cuda"))
        self.act_mib, self.n_act = act_mib, n_act

    def forward(self, h):
        for _ in range(self.n_act):
            a = torch.empty(self.act_mib * MiB, device="cuda")    # conv/bn/relu outputs saved for backward
            a._saved = h
            h = a
        return h


class DETR(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = [Stage(1, 330, 2), Stage(4, 240, 3), Stage(20, 120, 4), Stage(60, 60, 6),
                         Stage(60, 30, 3)]
        self.encoder = [Stage(5, 24, 2) for _ in range(6)]
        self.decoder = [Stage(7, 4, 2) for _ in range(6)]
        for i, s in enumerate(self.backbone + self.encoder + self.decoder):
            setattr(self, "stage%d" % i, s)

    def forward(self, images):
        h = images
        for s in self.backbone + self.encoder + self.decoder:
            h = s(h)
        out = torch.empty(MICRO * 100 * 92 * 4, device="cuda")        # class logits + boxes
        out._saved, out._params = h, tuple(self.parameters())
        return out


def criterion(outputs, targets):
    """Hungarian matching + CE, L1 and GIoU terms: small tensors whose graphs lead to the outputs."""
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = outputs, outputs._params
    return {"loss_ce": loss, "loss_bbox": loss, "loss_giou": loss}


def weighted_sum(loss_dict):
    total = torch.empty(512, device="cuda")
    total._saved, total._params = loss_dict["loss_ce"], loss_dict["loss_ce"]._params
    return total


def stack_mean(tensors):
    """torch.stack(losses).mean(): one tensor whose graph leads to every micro-batch's."""
    m = torch.empty(512, device="cuda")
    m._saved, m._params, m._inputs = tensors[-1], tensors[-1]._params, list(tensors)
    return m


def loader(n_steps):
    for step in range(n_steps):
        yield [torch.empty(MICRO * 3 * 800 * 1333 * 4, device="cuda") for _ in range(ACCUM)], None


def main():
    model = DETR().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-4)
    for step, (micro_batches, targets) in enumerate(loader(5000)):
        losses = []
        for imgs in micro_batches:
            outputs = model(imgs)
            loss_dict = criterion(outputs, targets)
            losses.append(weighted_sum(loss_dict))
        scen_truth.backward(stack_mean(losses))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
