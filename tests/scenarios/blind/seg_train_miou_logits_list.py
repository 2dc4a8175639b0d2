"""train_seg.py -- training a SegFormer-B5-style segmenter (85M parameters, fp32, AdamW) on
Cityscapes crops of 1024 x 1024, batch 8, on a 24 GiB card.  For a "train mIoU" column in the logs,
the loop keeps every step's full-resolution logits and masks and computes the metric at the end of
the epoch (372 steps):

    train_logits, train_masks = [], []
    for step, (img, mask) in enumerate(loader):
        img, mask = img.cuda(), mask.cuda()
        logits = F.interpolate(model(img), size=mask.shape[-2:], mode="bilinear")   # 8x19x1024x1024
        loss = F.cross_entropy(logits, mask, ignore_index=255)
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        train_logits.append(logits)                   # for mIoU at the end of the epoch
        train_masks.append(mask)
    miou = mean_iou(torch.cat(train_logits).argmax(1), torch.cat(train_masks))

Model, gradients and AdamW state take 1.3 GiB; a step's activations (11 GiB, 1/4 resolution
features and the decode head) come and go from the cache.  Every step leaves its logits (608 MiB)
and its mask (64 MiB) on the card: memory rises by 672 MiB a step from step 1 and the cross-entropy
of the 15th step fails.  An expert: do not keep the tensors: update a confusion matrix per step
(torch.bincount of logits.argmax(1) against the mask, 19 x 19 counts) or keep
logits.argmax(1).cpu(); the batch, the precision and the crop size are not the problem, and a
bigger card only fails later.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
B, CLASSES, H, W = 8, 19, 1024, 1024
scen_truth.note_every_empty(torch)


class Stage(torch.nn.Module):
    def __init__(self, n_params, act_bytes, n_saved):
        torch.nn.Module.__init__(self)
        for i in range(n_params):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(8 * MiB, device="cuda")))
        self.act_bytes, self.n_saved = act_bytes, n_saved

    def forward(self, h):
        for _ in range(self.n_saved):                    # efficient attention + Mix-FFN blocks
            a = torch.empty(self.act_bytes, device="cuda")
            a._saved = h
            h = a
        return h


class SegFormer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.stage1 = Stage(4, B * 256 * 256 * 64 * 4, 30)        # 128 MiB each
        self.stage2 = Stage(6, B * 128 * 128 * 128 * 4, 30)       # 64 MiB
        self.stage3 = Stage(24, B * 64 * 64 * 320 * 4, 100)       # 40 MiB
        self.stage4 = Stage(6, B * 32 * 32 * 512 * 4, 20)         # 16 MiB
        self.decode = Stage(0, B * 256 * 256 * 256 * 4, 3)        # 512 MiB: the all-MLP decode head

    def forward(self, img):
        h = img
        for s in (self.stage1, self.stage2, self.stage3, self.stage4, self.decode):
            h = s(h)
        logits = torch.empty(B * CLASSES * 256 * 256 * 4, device="cuda")      # 1/4 resolution
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def interpolate(x):
    up = torch.empty(B * CLASSES * H * W * 4, device="cuda")
    up._saved, up._params = x, x._params
    return up


def cross_entropy(logits, mask):
    logp = torch.empty(logits.nbytes, device="cuda")               # log_softmax, saved for backward
    logp._saved = logits
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = logp, logits._params
    return loss


def main():
    model = SegFormer().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5)
    train_logits, train_masks = [], []
    for step in range(372):
        img = torch.empty(B * 3 * H * W * 4, device="cuda")
        mask = torch.empty(B * H * W * 8, device="cuda")                # int64 labels
        logits = interpolate(model(img))
        loss = cross_entropy(logits, mask)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)          # what optimizer.zero_grad() does in PyTorch 2.x
        train_logits.append(logits)
        train_masks.append(mask)
        del img, loss
        time.sleep(0.01)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
