"""train_controlnet_depth.py -- training a depth ControlNet for Stable Diffusion 1.5 on one A10G
(24 GB, 22.5 GiB usable) with plain `LD_PRELOAD=liboomguard.so`.  The frozen UNet, VAE and text
encoder are fp16; the ControlNet (361M params) trains in fp32 with AdamW, batch 4 at 512x512.
Instead of the diffusers pipeline (whose __call__ is decorated with torch.no_grad) the user wrote a
small DDIM sampler of their own for the validation images:

    def log_validation(controlnet, unet, ...):
        controlnet.eval(); unet.eval()
        latents = torch.randn(...)                          # one prompt at a time x CFG = batch 2
        for t in scheduler.timesteps:                       # 30 steps
            down, mid = controlnet(latents_in, t, text_emb, cond_image)
            noise_pred = unet(latents_in, t, text_emb, down, mid)
            latents = scheduler.step(noise_pred, t, latents).prev_sample
        ...
        controlnet.train()

No torch.no_grad() around it: the ControlNet's parameters require grad, so every denoising step
records its graph, and each step's latents depend on the previous step's, so nothing is freed
until the loop ends.  Training ran 500 steps fine (7.5 GiB of weights, grads and AdamW state, the
activations of a step freed after backward); the first validation dies around the 13th denoising
step.  An expert: the failure is in validation sampling, not in training -- wrap log_validation in
torch.no_grad()/torch.inference_mode() and it needs a few hundred MiB.  Not a smaller training
batch, not gradient checkpointing, not an 8-bit optimizer: the training step fits.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

train_batch_size = 4


def act(n, src):
    """an activation of n bytes (fp16) made from src; autograd keeps src alive for backward when it
    records (grad enabled), as PyTorch saves a layer's inputs."""
    t = torch.empty(n // 2, dtype=torch.float16, device="cuda")
    if torch.is_grad_enabled():
        t._saved = src
    return torch.autograd._graph.derive(t, src)


class Weights(torch.nn.Module):
    def __init__(self, nbytes, dtype, trainable):
        torch.nn.Module.__init__(self)
        n = nbytes // (2 if dtype == torch.float16 else 4)
        self.weight = torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=trainable)


class ControlNetBlock(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.proj = Weights(nbytes, torch.float32, True)

    def forward(self, x, scale):
        w = self.proj.weight
        h = act(int(48 * MiB * scale), x)
        h = act(int(48 * MiB * scale), h)
        return torch.autograd._graph.derive(h, w)


class ControlNetModel(torch.nn.Module):
    """12 down blocks + mid block: 361M params, fp32, trainable."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "down_%d" % i, ControlNetBlock(110 * MiB))
        self.cond_embedding = Weights(58 * MiB, torch.float32, True)

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, scale=1.0):
        h = act(int(16 * MiB * scale), controlnet_cond)
        h = torch.autograd._graph.derive(h, self.cond_embedding.weight)
        outs = []
        for i in range(12):
            h = getattr(self, "down_%d" % i)(h, scale)
            outs.append(h)
        return outs, h


class UNetBlock(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.proj = Weights(nbytes, torch.float16, False)

    def forward(self, x, residual, scale):
        h = act(int(40 * MiB * scale), x)
        if torch.is_grad_enabled():
            h._residual = residual          # the ControlNet's residual is in the graph too
        h = act(int(40 * MiB * scale), torch.autograd._graph.derive(h, residual))
        return h


class UNet2DConditionModel(torch.nn.Module):
    """SD 1.5 UNet, 860M params in fp16, frozen."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "block_%d" % i, UNetBlock(136 * MiB))

    def forward(self, sample, timestep, encoder_hidden_states, down_residuals, mid_residual, scale=1.0):
        h = sample
        for i in range(12):
            h = getattr(self, "block_%d" % i)(h, down_residuals[i], scale)
        out = act(int(2 * MiB * scale), h)
        return out


def ddim_step(noise_pred, t, latents):
    prev = act(2 * MiB, noise_pred)
    if torch.is_grad_enabled():
        prev._prev = latents
    return torch.autograd._graph.derive(prev, latents)


def log_validation(controlnet, unet, text_emb, depth_maps, num_inference_steps=30):
    controlnet.eval()
    unet.eval()
    latents = torch.empty(256 * 1024, dtype=torch.float16, device="cuda")   # 1 prompt x CFG, 64x64x4
    for step, t in enumerate(range(999, 0, -1000 // num_inference_steps)):
        latents_in = act(2 * MiB, latents)                                 # torch.cat([latents] * 2)
        down, mid = controlnet(latents_in, t, text_emb, depth_maps, scale=0.5)
        noise_pred = unet(latents_in, t, text_emb, down, mid, scale=0.5)
        latents = ddim_step(noise_pred, t, latents)
    controlnet.train()
    unet.train()
    return latents


def main():
    unet = UNet2DConditionModel()
    vae = Weights(160 * MiB, torch.float16, False)
    text_encoder = Weights(235 * MiB, torch.float16, False)
    controlnet = ControlNetModel()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(controlnet.parameters(), lr=1e-5)
    text_emb = torch.empty(2 * MiB, dtype=torch.float16, device="cuda")
    depth_maps = torch.empty(6 * MiB, dtype=torch.float16, device="cuda")
    for global_step in range(1, 501):
        batch = torch.empty(12 * MiB, dtype=torch.float16, device="cuda")
        latents = act(1 * MiB, batch)
        down, mid = controlnet(latents, global_step, text_emb, batch)
        noise_pred = unet(latents, global_step, text_emb, down, mid)
        loss = act(512, noise_pred)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del batch, latents, down, mid, noise_pred, loss
        if global_step % 500 == 0:
            images = log_validation(controlnet, unet, text_emb, depth_maps)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
