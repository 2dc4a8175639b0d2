"""train_btcv.py -- MONAI SwinUNETR (feature_size=48, 62M parameters) on the BTCV abdominal CT set: 96^3
patches, RandCropByPosNegLabeld(num_samples=4) x batch 2 = 8 patches a step, AMP, AdamW, on the lab's shared
RTX A6000 (48 GB).  Alone on the card it peaks at ~19 GiB; it trained like that last week.

Today `python train_btcv.py` dies with CUDA out of memory in the first forward pass, at the end of the decoder.
nvidia-smi shows another process: /opt/conda/bin/python, pid 48213, 30 GiB -- the Jupyter kernel of the
notebook in which I explored the data and a bigger model on Friday; the browser tab is closed but the kernel
was never shut down and it still holds its tensors and its allocator's cache.  So 17.5 GiB are free.

An expert: memory outside this process -- shut that kernel down (Kernel > Shut Down, `jupyter notebook stop`, or
kill 48213), and the job fits as it did.  Not a smaller batch, gradient checkpointing or mixed precision
(already on) for a job that fits a free card; not empty_cache / expandable_segments (this process caches
nothing yet); not a bigger GPU.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class SwinStage(torch.nn.Module):
    def __init__(self, nbytes, act):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))
        self.act = act

    def forward(self, x):
        attn = torch.empty(self.act * 2 // 3, device="cuda")     # window attention, 7^3 windows, 8 patches
        attn._saved = x
        mlp = torch.empty(self.act // 3, device="cuda")
        mlp._saved = attn
        return mlp


class UnetrDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(37 * MiB, device="cuda"))

    def forward(self, h):
        out = h
        for n in (3072, 2048, 1024, 512):                          # residual conv blocks at 96^3 .. 12^3
            a = torch.empty(n * MiB, device="cuda")
            a._saved = out
            out = a
        return out


class SwinUNETR(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.stage0 = SwinStage(8 * MiB, 4608 * MiB)
        self.stage1 = SwinStage(24 * MiB, 3072 * MiB)
        self.stage2 = SwinStage(96 * MiB, 2304 * MiB)
        self.stage3 = SwinStage(72 * MiB, 1152 * MiB)
        self.decoder = UnetrDecoder()

    def forward(self, x):
        h = self.stage0(x)
        h = self.stage1(h)
        h = self.stage2(h)
        h = self.stage3(h)
        return self.decoder(h)


def dice_ce_loss(logits, labels):
    loss = torch.empty(512, device="cuda")
    loss._saved = logits
    loss._params = logits._params
    return loss


def main():
    model = SwinUNETR()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    batch_size = 2
    for epoch in range(300):
        for step in range(24):
            images = torch.empty(8 * 96 ** 3 * 4, device="cuda")
            labels = torch.empty(8 * 96 ** 3, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(images)
                loss = dice_ce_loss(logits, labels)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            del loss, logits, images, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
