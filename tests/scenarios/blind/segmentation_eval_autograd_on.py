"""train_seg.py -- semantic segmentation (an 85M-parameter transformer segmenter, fp32, AdamW) at
1024 px, batch 8 with activation checkpointing in training, evaluated every 50 steps with a
larger batch "because evaluation needs no backward":

    for step, (img, mask) in enumerate(train_loader, 1):
        loss = criterion(model(img), mask); loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            model.eval()
            for img, mask in val_loader:                  # batch 32, and no torch.no_grad()
                metric.update(model(img).argmax(1), mask)
            model.train()

In training the checkpointed blocks keep ~2.5 GiB; in evaluation model.eval() turns checkpointing
off and autograd is still on, so every block of the batch-32 forward saves its activations for a
backward that never comes (~36 GiB).  The first evaluation, after 50 good steps, fails in its
first forward.  An expert: wrap evaluation in torch.no_grad() / torch.inference_mode() (then it
needs ~2 GiB); not a smaller model, not a restart.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Segmenter(torch.nn.Module):
    def __init__(self, depth=24):
        torch.nn.Module.__init__(self)
        for i in range(depth):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(14 * MiB, device="cuda")))
        self.depth = depth

    def forward(self, img, batch):
        h = img
        per_block = 48 * MiB * batch             # attention + MLP activations of one block
        for i in range(self.depth):
            if self.training:
                # checkpointed: only the block's input is kept; the inside is recomputed in backward
                inner = torch.empty(per_block, device="cuda")
                del inner
                a = torch.empty(per_block // 4, device="cuda")
            elif torch.is_grad_enabled():
                a = torch.empty(per_block, device="cuda")     # everything saved for backward
            else:
                a = torch.empty(per_block // 4, device="cuda")
                h = None
            a._saved = h
            h = a
        logits = torch.empty(batch * 19 * 256 * 256 * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def main():
    model = Segmenter().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5)
    for step in range(1, 2001):
        img = torch.empty(8 * 3 * 1024 * 1024 * 4, device="cuda")
        out = model(img, 8)
        scen_truth.backward(out)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del out, img
        if step % 50 == 0:
            model.eval()
            for _ in range(125):                               # 4000 validation images
                vimg = torch.empty(32 * 3 * 1024 * 1024 * 4, device="cuda")
                pred = model(vimg, 32)
                del pred, vimg
            model.train()
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
