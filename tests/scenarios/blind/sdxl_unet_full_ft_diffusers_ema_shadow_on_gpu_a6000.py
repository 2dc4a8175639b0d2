"""train_text_to_image_sdxl.py -- diffusers' SDXL full fine-tuning example on one RTX A6000 (48 GB,
44.5 GiB usable), run as

    accelerate launch train_text_to_image_sdxl.py --use_ema --mixed_precision fp16 \\
        --gradient_checkpointing --train_batch_size 2 --resolution 1024 ...

with plain `LD_PRELOAD=liboomguard.so`.  The UNet (2.57B params) trains in fp32 master weights (9.6
GiB) with torch.optim.AdamW; the text encoders are fp16, the VAE fp32.  --use_ema makes diffusers'
EMAModel(unet.parameters()), whose shadow_params are fp32 clones of every UNet weight, on the GPU
beside the UNet (another 9.6 GiB); the script's --offload_ema (keep the shadow in pinned CPU memory
and update it there, or on the GPU a chunk at a time) is not given.  The first forward and backward
fit (activations ~6 GiB with checkpointing, freed after backward; the gradients 9.6 GiB); the first
optimizer.step() creates AdamW's two fp32 moments (19.2 GiB) and runs out half way.  Without the EMA
on the GPU the job needs ~41 GiB and fits.  An expert: the EMA shadow is a full second copy of the
weights that is only read once per step -- offload it (--offload_ema, or EMA every N steps on the
CPU); an 8-bit AdamW would also make room.  Not a smaller batch or checkpointing (activations are
gone at the step, checkpointing is on), not mixed precision (already), not inference.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

train_batch_size = 2


class ResnetAttnBlock(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))

    def forward(self, x):
        h = torch.empty(75 * MiB, dtype=torch.float16, device="cuda")     # checkpointed block input (150 MiB)
        h._saved = x
        return torch.autograd._graph.derive(h, x, self.weight)


class UNet2DConditionModel(torch.nn.Module):
    """2.57B params fp32: 40 blocks of 245 MiB."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(40):
            setattr(self, "block_%d" % i, ResnetAttnBlock(245 * MiB))
        self.gradient_checkpointing = False

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, sample, timestep, encoder_hidden_states, added_cond_kwargs=None):
        h = sample
        for i in range(40):
            h = getattr(self, "block_%d" % i)(h)
        return h


class FrozenModel(torch.nn.Module):
    def __init__(self, nbytes, dtype):
        torch.nn.Module.__init__(self)
        n = nbytes // (2 if dtype == torch.float16 else 4)
        self.weight = torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False)


class EMAModel(object):
    """diffusers.training_utils.EMAModel: shadow_params, clones of the parameters on their device."""

    def __init__(self, parameters, decay=0.9999, foreach=False):
        self.decay = decay
        self.shadow_params = [p.clone().detach() for p in parameters]
        self.optimization_step = 0

    def step(self, parameters):
        self.optimization_step += 1


def main():
    text_encoder_one = FrozenModel(235 * MiB, torch.float16)
    text_encoder_two = FrozenModel(1325 * MiB, torch.float16)
    vae = FrozenModel(320 * MiB, torch.float32)
    unet = UNet2DConditionModel()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    ema_unet = EMAModel(unet.parameters())
    unet.enable_gradient_checkpointing()
    unet.train()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-6, weight_decay=1e-2)
    for step in range(10000):
        latents = torch.empty(2 * 4 * 128 * 128, dtype=torch.float16, device="cuda")
        prompt_embeds = torch.empty(2 * 77 * 2048, dtype=torch.float16, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            model_pred = unet(latents, step, prompt_embeds)
            loss = torch.empty(512, device="cuda")
            loss._saved = model_pred
            loss = torch.autograd._graph.derive(loss, model_pred)
        scen_truth.backward(loss)
        del model_pred
        optimizer.step()
        ema_unet.step(unet.parameters())
        optimizer.zero_grad(set_to_none=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
