"""train_lcm_distill_sdxl.py -- a product-photo studio wants 4-step SDXL for its catalogue renderer and
runs latent consistency distillation of its own SDXL fine-tune (diffusers' train_lcm_distill_sdxl_wds.py,
the full-UNet variant, not the LoRA one) on the one RTX A6000 (48 GB, 47.5 GiB usable) of its render box:

    accelerate launch train_lcm_distill_sdxl_wds.py --pretrained_teacher_model=./sdxl-studio-ft \
        --mixed_precision=fp16 --resolution=1024 --train_batch_size=4 --gradient_checkpointing \
        --learning_rate=1e-6 --ema_decay=0.95 ...            (no --use_8bit_adam)

The script holds, for the whole run: the frozen teacher UNet in fp16 (4.8 GiB), the student UNet in
float32 (trainable, 9.6 GiB), the target UNet -- the EMA of the student that gives the consistency
targets -- in float32 (9.6 GiB), both text encoders in fp16 (1.5 GiB) and the VAE in float32 (0.3 GiB):
26 GiB before the first batch.  Step 1 encodes the images, runs the student with autograd (checkpointed),
the teacher twice (cond/uncond, under no_grad) for the guided ODE step, the target under no_grad,
backward: the student's float32 gradients (9.6 GiB) bring it to 36 GiB (peak 38), activations are gone.  Then
optimizer.step() (torch.optim.AdamW) creates exp_avg and exp_avg_sq for 2.6B parameters, 19.1 GiB,
and fails some 60% of the way (the 0.9 GiB cached in pieces then, left by freed activations, is no
fragmentation: 7.8 GiB of moments are still to come).

An expert: the failing phase decides it -- the first optimizer step creating AdamW's two float32
moments, after forward and backward fitted.  First: an 8-bit AdamW (the script's --use_8bit_adam:
bitsandbytes, 4.8 GiB of state instead of 19.1), or distil a LoRA (train_lcm_distill_lora_sdxl_wds.py,
LCM-LoRA: the trainable part becomes ~200M parameters), or offload the optimizer state to the CPU
(DeepSpeed ZeRO-Offload) if the full UNet must be trained.  Wrong first advice: a smaller batch or
gradient checkpointing (activations are freed by then; checkpointing is already on), mixed precision
(on), running the teacher under no_grad (it is), inference_mode (this is training), moving the EMA
target to the CPU (it runs a forward every step), expandable_segments or empty_cache (the moments are
live memory), a bigger GPU first.
"""
import sys

import torch
from torch.autograd import _graph

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
BATCH = 4
LATENT = 128                                   # 1024 px / 8


# --------------------------------------------------------------------------------------------------
# stand-in gap: diffusers and transformers are not here; the modules below have SDXL's parameter sizes
# (grouped per attention/feed-forward/resnet) and make the activations their forward passes make.
def _param(numel, dtype, requires_grad=True):
    return torch.nn.Parameter(torch.empty(numel, dtype=dtype, device="cuda"), requires_grad=requires_grad)


class _Block(torch.nn.Module):
    """A group of SDXL UNet weights (a transformer layer's attention and GEGLU feed-forward, or a
    ResnetBlock2D) at one resolution: its forward makes `work` bytes of temporaries and an output of
    `out` bytes; with gradient checkpointing only the block's input is kept for backward."""

    def __init__(self, sizes, dtype, out, work):
        torch.nn.Module.__init__(self)
        for i, n in enumerate(sizes):
            setattr(self, "w%d" % i, _param(n, dtype))
        self.out, self.work = out, work
        self.gradient_checkpointing = False

    def forward(self, h):
        tmp = torch.empty(self.work, device="cuda")
        y = torch.empty(self.out, device="cuda")
        del tmp
        if torch.is_grad_enabled():
            y._saved = h                       # checkpointed: the input, recomputed in backward
        return y


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        bs = []
        s320, s640, s1280 = (BATCH * LATENT * LATENT * 320 * 2, BATCH * 64 * 64 * 640 * 2,
                             BATCH * 32 * 32 * 1280 * 2)
        bs.append(_Block([320 * 4 * 9, 1_300_000], dtype, s320, 2 * s320))              # conv_in, time/add embedding
        for _ in range(6):
            bs.append(_Block([320 * 320 * 9, 320 * 320 * 9, 400_000], dtype, s320, 3 * s320))   # down 0 resnets
        for _ in range(4):
            bs.append(_Block([640 * 640 * 9, 640 * 640 * 9, 800_000], dtype, s640, 3 * s640))   # down 1 resnets
        for _ in range(10):                                                                   # down 1 transformers
            bs.append(_Block([4 * 640 * 640, 2 * 640 * 640 + 2 * 2048 * 640, 640 * 5120, 2560 * 640], dtype,
                             s640, 6 * s640))
        for _ in range(5):
            bs.append(_Block([1280 * 1280 * 9, 1280 * 1280 * 9, 1_600_000], dtype, s1280, 3 * s1280))  # 1280 resnets
        for _ in range(60):                                                                  # 1280 transformers
            bs.append(_Block([4 * 1280 * 1280, 2 * 1280 * 1280 + 2 * 2048 * 1280, 1280 * 10240, 5120 * 1280],
                             dtype, s1280, 6 * s1280))
        for _ in range(3):
            bs.append(_Block([1920 * 1280 * 9, 1280 * 1280 * 9, 1_600_000], dtype, s1280, 3 * s1280))  # up 0 resnets
        for _ in range(6):
            bs.append(_Block([1280 * 640 * 9, 640 * 640 * 9, 800_000], dtype, s640, 3 * s640))   # up 1 resnets
        for _ in range(6):
            bs.append(_Block([960 * 320 * 9, 320 * 320 * 9, 400_000], dtype, s320, 3 * s320))    # up 2 resnets
        self.blocks = torch.nn.Module()
        for i, b in enumerate(bs):
            setattr(self.blocks, str(i), b)
        self.conv_out = _Block([320 * 4 * 9], dtype, BATCH * LATENT * LATENT * 4 * 4, s320)

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=torch.float32):
        return cls(torch_dtype)

    def enable_gradient_checkpointing(self):
        for b in self.blocks._modules.values():
            b.gradient_checkpointing = True

    def forward(self, sample, timestep, encoder_hidden_states, added_cond_kwargs=None,
                timestep_cond=None, return_dict=False):
        h = sample
        for b in self.blocks._modules.values():
            h = b(h)
        return (self.conv_out(h),)


class AutoencoderKL(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = _Block([34_000_000], torch.float32, BATCH * LATENT * LATENT * 8 * 4,
                              2 * BATCH * 128 * 1024 * 1024 * 4)
        self.decoder = _Block([49_700_000], torch.float32, BATCH * 3 * 1024 * 1024 * 4, 0)

    def encode(self, pixel_values):
        return self.encoder(pixel_values)


class CLIPTextModel(torch.nn.Module):
    def __init__(self, numel, width):
        torch.nn.Module.__init__(self)
        self.enc = _Block([numel], torch.float16, BATCH * 77 * width * 2, 8 * BATCH * 77 * width * 2)

    def forward(self, ids):
        return self.enc(ids)


def update_ema(target_params, source_params, rate=0.99):
    for targ, src in zip(target_params, source_params):
        pass                                               # targ.detach().mul_(rate).add_(src, alpha=1 - rate)
# --------------------------------------------------------------------------------------------------


def main():
    teacher = "./sdxl-studio-ft"
    weight_dtype = torch.float16                           # --mixed_precision=fp16
    vae = AutoencoderKL()                                  # float32: SDXL's VAE overflows in fp16
    text_encoder_one = CLIPTextModel(123_000_000, 768)
    text_encoder_two = CLIPTextModel(695_000_000, 1280)
    teacher_unet = UNet2DConditionModel.from_pretrained(teacher, subfolder="unet", torch_dtype=weight_dtype)
    for m in (vae, text_encoder_one, text_encoder_two, teacher_unet):
        for p in m.parameters():
            p.requires_grad_(False)
    unet = UNet2DConditionModel.from_pretrained(teacher, subfolder="unet")          # the student, float32
    unet.train()
    target_unet = UNet2DConditionModel.from_pretrained(teacher, subfolder="unet")   # EMA of the student
    for p in target_unet.parameters():
        p.requires_grad_(False)
    unet.enable_gradient_checkpointing()
    print("models on the GPU: %.1f GiB" % (torch.cuda.memory_allocated() / 2**30))

    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-6, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)

    for step in range(1, 20001):
        pixel_values = torch.empty(BATCH * 3 * 1024 * 1024 * 4, device="cuda")
        ids = torch.empty(2 * BATCH * 77 * 8, device="cuda")
        with torch.no_grad():
            latents = vae.encode(pixel_values)
            prompt_embeds = (text_encoder_one(ids), text_encoder_two(ids))
        del pixel_values
        noise = torch.empty(latents.nbytes, device="cuda")
        noisy_model_input = torch.empty(latents.nbytes, device="cuda")

        with torch.autocast("cuda", dtype=weight_dtype):
            noise_pred = unet(noisy_model_input, 999, prompt_embeds)[0]
            model_pred = _graph.derive(torch.empty(noise_pred.nbytes, device="cuda"), noise_pred)
            model_pred._saved = noise_pred

            with torch.no_grad():
                cond_teacher_output = teacher_unet(noisy_model_input, 999, prompt_embeds)[0]
                uncond_teacher_output = teacher_unet(noisy_model_input, 999, prompt_embeds)[0]
                x_prev = torch.empty(latents.nbytes, device="cuda")      # DDIM step with guidance w
                del cond_teacher_output, uncond_teacher_output
                target_noise_pred = target_unet(x_prev, 759, prompt_embeds)[0]
                target = torch.empty(latents.nbytes, device="cuda")
                del target_noise_pred

        loss = _graph.derive(torch.empty(512, device="cuda"), model_pred, target)     # Huber loss
        loss._saved = model_pred
        del noise_pred, model_pred
        scen_truth.backward(loss)                          # accelerator.backward(loss)
        print("step %d after backward: allocated %.1f GiB, peak %.1f GiB"
              % (step, torch.cuda.memory_allocated() / 2**30, torch.cuda.max_memory_allocated() / 2**30))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        update_ema(target_unet.parameters(), unet.parameters(), 0.95)
        del loss, latents, noise, noisy_model_input, x_prev, target


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
