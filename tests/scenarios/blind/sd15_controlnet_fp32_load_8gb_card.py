"""gen_canny.py -- product shots from sketches: Stable Diffusion 1.5 + the canny ControlNet with diffusers,
on my desktop's RTX 3070 (8 GB, I ssh into it, no display running):

    controlnet = ControlNetModel.from_pretrained("lllyasviel/sd-controlnet-canny")
    pipe = StableDiffusionControlNetPipeline.from_pretrained(
        "runwayml/stable-diffusion-v1-5", controlnet=controlnet)          # no torch_dtype
    pipe = pipe.to("cuda")
    images = pipe(prompt, image=canny, height=768, width=768,
                  num_images_per_prompt=4, num_inference_steps=30).images

The model loads fine, then the very first denoising step fails with CUDA out of memory.  Everyone
online runs this on 6-8 GB cards, so I don't get it.

What an expert sees: without torch_dtype the pipeline is loaded in float32 -- UNet 3.2 GiB, ControlNet
1.35 GiB, text encoder 0.46 GiB, VAE 0.31 GiB and the default safety checker 1.13 GiB: 6.45 GiB of weights
on an 8 GiB card before a single activation, leaving ~1 GiB for a batch of 8 (4 images x classifier-free
guidance) at 768 px.  The checkpoints are published in fp16 and the model runs in fp16: load with
torch_dtype=torch.float16 (variant="fp16"), which halves the weights (3.2 GiB) and every activation, and
this fits.  On top, if needed: enable_model_cpu_offload(), attention slicing / VAE tiling,
safety_checker=None, or one image per prompt.  Not a training problem (no optimizer, no backward: no
gradient checkpointing, 8-bit optimizer, LoRA); the pipeline already runs under no_grad, so
inference_mode saves nothing; not the cache, fragmentation or other processes (there are none).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def _weights(module, n_params, n_tensors, dtype=None):
    """from_pretrained: the checkpoint's tensors, in torch_dtype (None: float32, PyTorch's default)."""
    itemsize = 2 if dtype in (torch.float16, torch.bfloat16) else 4
    per = n_params // n_tensors
    for i in range(n_tensors):
        setattr(module, "w%03d" % i, nn.Parameter(torch.empty(per, dtype=dtype or torch.float32, device="cuda"),
                                                 requires_grad=False))
    module.itemsize = itemsize


class FeedForward(nn.Module):
    """diffusers' FeedForward with GEGLU: proj to 2 x 4 x dim, gate, then back to dim."""

    def __init__(self, dim, dtype):
        nn.Module.__init__(self)
        _weights(self, dim * dim * 8 + dim * dim * 4, 2, dtype)
        self.dim = dim

    def forward(self, hidden, batch, tokens):
        proj = torch.empty(batch * tokens * self.dim * 8 * self.itemsize, device="cuda")     # GEGLU proj
        gated = torch.empty(batch * tokens * self.dim * 4 * self.itemsize, device="cuda")
        del proj
        return torch.empty(batch * tokens * self.dim * self.itemsize, device="cuda")


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, dtype):
        nn.Module.__init__(self)
        _weights(self, dim * dim * 8, 8, dtype)       # self- and cross-attention projections
        self.ff = FeedForward(dim, dtype)
        self.dim = dim

    def forward(self, hidden, batch, tokens):
        attn = torch.empty(batch * tokens * self.dim * 4 * self.itemsize, device="cuda")   # q, k, v, out (SDPA)
        out = self.ff(attn, batch, tokens)
        del attn
        return out


class ResnetBlock2D(nn.Module):
    def __init__(self, ch, dtype):
        nn.Module.__init__(self)
        _weights(self, ch * ch * 9 * 2, 2, dtype)
        self.ch = ch

    def forward(self, hidden, batch, pixels):
        h = torch.empty(batch * pixels * self.ch * self.itemsize, device="cuda")
        return torch.empty(batch * pixels * self.ch * self.itemsize, device="cuda")


class _Denoiser(nn.Module):
    """The down path of a UNet (ControlNet is a copy of it): at 768 px the latent is 96 x 96."""

    def __init__(self, n_params, dtype):
        nn.Module.__init__(self)
        self.res0 = ResnetBlock2D(320, dtype)
        self.attn0 = BasicTransformerBlock(320, dtype)
        self.res1 = ResnetBlock2D(640, dtype)
        self.attn1 = BasicTransformerBlock(640, dtype)
        _weights(self, n_params - sum(p.nbytes // self.res0.itemsize for p in self.parameters()), 40, dtype)

    def forward(self, latents, batch, encoder_hidden_states, residuals=None):
        pixels = 96 * 96
        keep = []
        h = self.res0(latents, batch, pixels)
        keep.append(h)
        h = self.attn0(h, batch, pixels)
        keep.append(h)
        h = self.res1(h, batch, pixels // 4)
        keep.append(h)
        h = self.attn1(h, batch, pixels // 4)
        keep.append(h)
        return keep


class ControlNetModel(_Denoiser):
    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls(361_300_000, torch_dtype)


class UNet2DConditionModel(_Denoiser):
    pass


class CLIPTextModel(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        _weights(self, 123_100_000, 30, dtype)

    def forward(self, ids, batch):
        return torch.empty(batch * 77 * 768 * self.itemsize, device="cuda")


class AutoencoderKL(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        _weights(self, 83_650_000, 30, dtype)


class StableDiffusionSafetyChecker(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        _weights(self, 304_300_000, 30, dtype)


class StableDiffusionControlNetPipeline(object):
    @classmethod
    def from_pretrained(cls, name, controlnet=None, torch_dtype=None, safety_checker="default"):
        p = cls()
        p.text_encoder = CLIPTextModel(torch_dtype)
        p.unet = UNet2DConditionModel(859_520_000, torch_dtype)
        p.vae = AutoencoderKL(torch_dtype)
        p.safety_checker = StableDiffusionSafetyChecker(torch_dtype) if safety_checker == "default" else None
        p.controlnet = controlnet
        return p

    def to(self, device):
        return self

    def __call__(self, prompt, image=None, height=512, width=512, num_images_per_prompt=1, num_inference_steps=50,
                 guidance_scale=7.5):
        with torch.no_grad():                       # diffusers decorates __call__ with @torch.no_grad()
            batch = len(prompt) * num_images_per_prompt * (2 if guidance_scale > 1 else 1)
            prompt_embeds = self.text_encoder(None, batch)
            latents = torch.empty(batch * 4 * (height // 8) * (width // 8) * 4, device="cuda")
            control = torch.empty(batch * 3 * height * width * self.unet.res0.itemsize, device="cuda")
            for t in range(num_inference_steps):
                down_res = self.controlnet(latents, batch, prompt_embeds)
                noise_pred = self.unet(latents, batch, prompt_embeds, residuals=down_res)
                del down_res, noise_pred
        return latents


def main():
    controlnet = ControlNetModel.from_pretrained("lllyasviel/sd-controlnet-canny")
    pipe = StableDiffusionControlNetPipeline.from_pretrained("runwayml/stable-diffusion-v1-5",
                                                             controlnet=controlnet)
    pipe = pipe.to("cuda")
    prompt = ["a ceramic teapot, studio lighting, product photo"]
    images = pipe(prompt, image="canny.png", height=768, width=768, num_images_per_prompt=4,
                  num_inference_steps=30)
    return images


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
