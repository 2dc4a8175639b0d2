"""finetune_sd21.py -- full fine-tune of the Stable Diffusion 2.1 UNet (865.9M params) on an in-house
illustration data set, one V100 32 GB on a p3dn node, fp16 autocast (V100: no bf16), AdamW, batch 16,
xformers attention, no gradient checkpointing.  The training recipe has two resolution stages, as SD 2's
own training did:

    STAGES = [dict(until_step=400, resolution=512), dict(until_step=8000, resolution=768)]
    for step, batch in enumerate(loader):
        res = stage_for(step)["resolution"]              # the loader re-buckets images to res
        with torch.autocast("cuda", dtype=torch.float16):
            latents = vae.encode(batch["pixels"]).latent_dist.sample() * 0.18215
            ...
            pred = unet(noisy_latents, t, text_encoder(batch["ids"])[0]).sample
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The user: "it ran for 400 steps at a rock-flat 27 GB -- memory never moved -- and then died at step
401.  Something must leak; is it the data loader?"

What fills the memory: nothing leaks.  The fp32 UNet (3.2 GiB), its AdamW state (6.5 GiB) and, during
backward, its gradients (3.2 GiB), with the fp16 text encoder (OpenCLIP-H, 0.66 GiB) and VAE, are the
same at both stages.  What changes at step 401 is the resolution: 768 px means 96 x 96 latents instead of
64 x 64, 2.25x the tokens per image, so the saved activations of the forward pass grow from ~11 GiB to
~25 GiB at batch 16.  The very first 768 px forward runs out, part way through the UNet.  A one-off step
to a new steady state, not a build-up.  At the failure ~2 GiB of the 512 px stage's blocks sit cached
and split, too small for the 768 px activations; with them the pass would get a few layers further, still
~6 GiB short of its forward and backward.

An expert says first: turn on gradient checkpointing for the UNet (unet.enable_gradient_checkpointing():
the activations drop to a third at ~+30% time), or lower the per-step batch for the 768 stage (16 -> 6)
with gradient accumulation to keep the effective batch.  Wrong advice: looking for a leak / releasing
references (the run was flat), empty_cache or expandable_segments (the activations are live), mixed
precision (already fp16 autocast), other processes (there are none), inference_mode (this is training).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

train_batch_size = 16
STAGES = [dict(until_step=400, resolution=512), dict(until_step=8000, resolution=768)]


def stage_for(step):
    for s in STAGES:
        if step < s["until_step"]:
            return s
    return STAGES[-1]


def _weights(module, n_params, n_tensors, dtype, trainable):
    for i in range(n_tensors):
        setattr(module, "w%03d" % i, nn.Parameter(torch.empty(n_params // n_tensors, dtype=dtype, device="cuda"),
                                                 requires_grad=trainable))


def act(nbytes, src):
    t = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    if torch.is_grad_enabled():
        t._saved = src
    return torch.autograd._graph.derive(t, src)


class Transformer2DModel(nn.Module):
    def __init__(self, n_params):
        nn.Module.__init__(self)
        _weights(self, n_params, 4, torch.float32, True)

    def forward(self, h, tokens_scale):
        for _ in range(6):                                   # norms, q/k/v/out, GEGLU feed-forward
            h = act(int(96 * MiB * tokens_scale), h)
        return h


class UNet2DConditionModel(nn.Module):
    """SD 2.1 UNet: 16 transformer blocks at 4 resolutions, plus ResNet blocks (865.9M params, fp32)."""

    def __init__(self):
        nn.Module.__init__(self)
        for i in range(16):
            setattr(self, "attn_%02d" % i, Transformer2DModel(35_000_000))
        _weights(self, 865_910_000 - 16 * 35_000_000, 24, torch.float32, True)

    def forward(self, sample, timestep, encoder_hidden_states, resolution):
        tokens_scale = (resolution / 512.0) ** 2
        h = torch.autograd._graph.derive(act(int(32 * MiB * tokens_scale), sample), encoder_hidden_states)
        for i in range(16):
            h = act(int(120 * MiB * tokens_scale), h)        # ResnetBlock2D
            h = getattr(self, "attn_%02d" % i)(h, tokens_scale)
        for p in self._parameters.values():
            h = torch.autograd._graph.derive(h, p)
        return act(int(8 * MiB * tokens_scale), h)


class FrozenOpenCLIPEmbedder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 354_000_000, 24, torch.float16, False)

    def forward(self, ids):
        return torch.empty(train_batch_size * 77 * 1024 * 2, dtype=torch.uint8, device="cuda")


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 83_650_000, 8, torch.float16, False)

    def encode(self, pixels, resolution):
        with torch.no_grad():
            tmp = torch.empty(train_batch_size * 128 * resolution * resolution * 2 // 4, dtype=torch.uint8,
                              device="cuda")
            del tmp
            return torch.empty(train_batch_size * 4 * (resolution // 8) ** 2 * 2, dtype=torch.uint8, device="cuda")


def main():
    unet = UNet2DConditionModel()
    text_encoder = FrozenOpenCLIPEmbedder()
    vae = AutoencoderKL()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5, weight_decay=1e-2)
    for step in range(8000):
        res = stage_for(step)["resolution"]
        pixels = torch.empty(train_batch_size * 3 * res * res * 2, dtype=torch.uint8, device="cuda")
        ids = torch.empty(train_batch_size * 77 * 8, dtype=torch.uint8, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            latents = vae.encode(pixels, res)
            noisy_latents = torch.empty(latents.nbytes, dtype=torch.uint8, device="cuda")
            encoder_hidden_states = text_encoder(ids)
            pred = unet(noisy_latents, step, encoder_hidden_states, res)
            loss = act(512, pred)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del pixels, ids, latents, noisy_latents, encoder_hidden_states, pred, loss
        if step % 100 == 0:
            print("step", step, "res", res, "reserved %.1f GiB" % (torch.cuda.memory_reserved() / 2.0 ** 30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
