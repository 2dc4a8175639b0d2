"""train_vqgan.py -- the autoencoder stage of an in-house latent-diffusion project: a VQGAN (f=8, 4 levels,
128 base channels, 68M parameters) trained from scratch at 256 px, batch 12, fp32, AdamW, on an AWS
g5.xlarge (A10G, 22.5 GiB).  The loss follows taming-transformers: L1 + LPIPS (frozen VGG16) from step 0,
and a PatchGAN discriminator with a hinge loss that only joins at `disc_start = 50001` -- the user's own
loop does not even run the discriminator before that:

    for step, x in enumerate(loader, start=resume_step):
        xrec, qloss = vqgan(x)
        loss = l1(x, xrec) + lpips(x, xrec) + qloss
        if step >= disc_start:
            g_loss = -disc(xrec).mean()                 # graph through the discriminator into the decoder
            loss = loss + adaptive_weight(loss, g_loss) * g_loss
        opt_g.zero_grad(); loss.backward(); opt_g.step()
        if step >= disc_start:
            d_loss = hinge(disc(x), disc(xrec.detach())); opt_d.zero_grad(); d_loss.backward(); opt_d.step()

For 50,000 steps the job sat flat at ~20 GiB at each step's peak (the decoder's full-resolution
activations are most of it) and `nvidia-smi` showed 21.9 GiB reserved: "plenty of headroom, it has run
for two days".  At step 50001 the generator step keeps, in addition, the discriminator's activations on
the reconstruction for backward; the first discriminator forward dies a few layers in.

What the user says: "it ran two days without growing, then OOM exactly at 50001 -- a leak in the GAN
code?"  What an expert says first: not a leak, a phase change: the adversarial phase needs ~2.5 GiB more
at its peak than the reconstruction phase; size the run for the GAN phase -- bf16 autocast on this
Ampere card (halves the activations), or a smaller batch with accumulation, or checkpoint the decoder.
Wrong advice: release references / empty_cache / expandable_segments (nothing leaks, nothing useful is
cached), restarting, other processes.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
GiB = 1 << 30
batch_size = 12


class Block(nn.Module):
    """A resnet/attention block: `pbytes` of weights, `abytes` of activations saved for backward."""

    def __init__(self, pbytes, abytes, frozen=False):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(pbytes, device="cuda"), requires_grad=not frozen)
        self.abytes = abytes

    def forward(self, h):
        out = torch.empty(self.abytes, device="cuda")
        out._saved = h
        return out


class VQModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = nn.Module()
        self.decoder = nn.Module()
        for i in range(8):
            setattr(self.encoder, "down%d" % i, Block(14 * MiB, 640 * MiB))
        for i in range(12):
            setattr(self.decoder, "up%d" % i, Block(14 * MiB, 1000 * MiB))
        self.quantize = Block(8 * MiB, 48 * MiB)

    def forward(self, x):
        h = x
        for i in range(8):
            h = getattr(self.encoder, "down%d" % i)(h)
        h = self.quantize(h)
        for i in range(12):
            h = getattr(self.decoder, "up%d" % i)(h)
        return h, torch.empty(512, device="cuda")


class LPIPS(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(5):
            setattr(self, "vgg%d" % i, Block(11 * MiB + 600 * 1024, 420 * MiB, frozen=True))

    def forward(self, x, xrec):
        h = xrec
        for i in range(5):
            h = getattr(self, "vgg%d" % i)(h)
        return h


class NLayerDiscriminator(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(5):
            setattr(self, "main%d" % i, Block(2 * MiB + 700 * 1024, 560 * MiB))

    def forward(self, x):
        h = x
        for i in range(5):
            h = getattr(self, "main%d" % i)(h)
        return h


disc_start = 50001
num_steps = 400000


def train(vqgan, lpips, disc, opt_g, opt_d, resume_step):
    for step in range(resume_step, num_steps):
        x = torch.empty(batch_size * 3 * 256 * 256 * 4, device="cuda")
        xrec, qloss = vqgan(x)
        rec = lpips(x, xrec)
        loss = torch.empty(512, device="cuda")
        loss._saved = rec
        loss = torch._derive(loss, rec, qloss)
        if step >= disc_start:
            logits_fake = disc(xrec)                    # the generator's adversarial term
            g_loss = torch.empty(512, device="cuda")
            g_loss._saved = logits_fake
            loss = torch._derive(g_loss, logits_fake, loss)
            loss._saved = (logits_fake, rec)
        opt_g.zero_grad()
        scen_truth.backward(loss)
        opt_g.step()
        del loss, rec, qloss
        if step >= disc_start:
            logits_real = disc(x)
            logits_fake = disc(xrec.detach())
            d_loss = torch._derive(torch.empty(512, device="cuda"), logits_real, logits_fake)
            opt_d.zero_grad()
            scen_truth.backward(d_loss)
            opt_d.step()
        del xrec, x
        if step % 1000 == 0:
            print("step %d" % step)


try:
    vqgan = VQModel()
    lpips = LPIPS()
    disc = NLayerDiscriminator()
    opt_g = torch.optim.AdamW(vqgan.parameters(), lr=4.5e-6, betas=(0.5, 0.9))
    opt_d = torch.optim.AdamW(disc.parameters(), lr=4.5e-6, betas=(0.5, 0.9))
    train(vqgan, lpips, disc, opt_g, opt_d, resume_step=49980)   # (the stand-in resumes just before the switch)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
