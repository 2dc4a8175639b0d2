"""train_text_to_image.py (diffusers' example, my copy) -- full fine-tuning of the Stable Diffusion 1.5 UNet
(860M parameters, float32 master weights 3.2 GiB) on 512 px product photos, batch 4, fp16 autocast with
GradScaler, plain torch.optim.AdamW, on one RTX 4090 (24 GB), run with --use_ema:

    unet = UNet2DConditionModel.from_pretrained(MODEL, subfolder="unet")           # fp32, trained
    vae.to("cuda", dtype=torch.float16); text_encoder.to("cuda", dtype=torch.float16)  # frozen
    ema_unet = EMAModel(unet.parameters())      # shadow_params = [p.clone().detach() for p in ...]
    ema_unet.to("cuda")
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5)
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(unet(noisy_latents, t, text_emb).sample, noise)
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update()
        optimizer.zero_grad(); ema_unet.step(unet.parameters())

Without --use_ema this trains.  With it, the first step goes through, and the second step's backward dies with
CUDA out of memory: weights 3.2 + EMA shadow 3.2 + AdamW moments 6.4 + gradients 3.2 GiB + the frozen VAE and
text encoder, next to ~8.5 GiB of the UNet's activations, is 1.4 GiB more than the card has.  (The first step
fit only because AdamW's moments are made by the first optimizer.step(), after its backward.)

An expert: the EMA copy of the UNet is the 3.2 GiB a 24 GB card cannot spare -- keep it in CPU memory
(diffusers' --offload_ema, or update it every N steps from a CPU copy); alternatively bitsandbytes'
8-bit AdamW (the moments drop from 6.4 to 1.6 GiB) or --gradient_checkpointing.  Mixed precision is already
on; the EMA update itself is in place and is not what fails; nothing is cached or leaked.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class ResnetAttnBlock(torch.nn.Module):
    def __init__(self, nbytes, saves):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))
        self.saves = saves

    def forward(self, x):
        h = x
        for _ in range(self.saves):                           # conv + attention activations saved for backward
            a = torch.empty(204 * MiB, device="cuda")
            a._saved = h
            h = a
        return h


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = [ResnetAttnBlock(204 * MiB, 3 if i < 11 else 2) for i in range(16)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, sample, timestep, encoder_hidden_states):
        h = sample
        for b in self.blocks:
            h = b(h)
        return h


class FrozenFp16(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"), requires_grad=False)

    def forward(self, x):
        return torch.empty(1 * MiB, device="cuda")


class EMAModel(object):
    """diffusers.training_utils.EMAModel, as far as memory goes."""

    def __init__(self, parameters, decay=0.9999):
        self.decay = decay
        self.shadow_params = [p.clone().detach() for p in parameters]

    def to(self, device=None):
        return self

    def step(self, parameters):
        pass                                                    # s_param.sub_(one_minus_decay * (s_param - param))


def mse_loss(pred, target):
    loss = torch.empty(512, device="cuda")
    loss._saved = pred
    loss._params = pred._params
    return loss


def main():
    unet = UNet2DConditionModel()
    vae = FrozenFp16(160 * MiB)
    text_encoder = FrozenFp16(235 * MiB)
    ema_unet = EMAModel(unet.parameters())
    ema_unet.to("cuda")
    unet.train()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5)
    for step in range(10000):
        pixels = torch.empty(4 * 3 * 512 * 512 * 2, device="cuda")
        with torch.no_grad():
            latents = vae(pixels)
            text_emb = text_encoder(None)
        noise = torch.empty(latents.nbytes, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            model_pred = unet(latents, step, text_emb)
            loss = mse_loss(model_pred, noise)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        ema_unet.step(unet.parameters())
        del loss, model_pred, latents, text_emb, noise, pixels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
