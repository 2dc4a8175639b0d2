"""app.py -- our image API on one L4 (22.5 GiB): text-to-image, image-to-image and inpainting, all
from SDXL base 1.0 in fp16 (with the fp16-fix VAE: 6.5 GiB of weights), one pipeline per endpoint,
built at start-up:

    BASE = "stabilityai/stable-diffusion-xl-base-1.0"
    kw = dict(torch_dtype=torch.float16, variant="fp16", vae=vae_fp16_fix)
    txt2img = StableDiffusionXLPipeline.from_pretrained(BASE, **kw).to("cuda")
    img2img = StableDiffusionXLImg2ImgPipeline.from_pretrained(BASE, **kw).to("cuda")
    inpaint = StableDiffusionXLInpaintPipeline.from_pretrained(BASE, **kw).to("cuda")

    @app.post("/txt2img")
    def gen(req):
        with torch.inference_mode():
            return txt2img(req.prompt, num_images_per_prompt=req.n, height=1024, width=1024).images

Start-up goes through (19.4 GiB of weights, 19.9 GiB with the CUDA context), but the very first
request (4 images at 1024x1024, CFG on: a batch of 8 in the UNet) fails in the UNet's first attention
block, where the 2.5 GiB of attention scores meet 2.4 GiB free.  The three pipelines are built from the
same checkpoint, and each from_pretrained loads its own UNet, both text encoders and a VAE: three
identical copies of every weight (19.4 GiB), where one (6.5 GiB) would serve all three endpoints.

An expert: build the other two pipelines from the first one's components
(`StableDiffusionXLImg2ImgPipeline(**txt2img.components)`, or `AutoPipelineForImage2Image.from_pipe(txt2img)`)
-- one set of weights, 13 GiB back.  Not quantization, a smaller batch, fused attention or a bigger
card (one pipeline and its request fit with room to spare), not a dtype change (already fp16), not
map_location (nothing goes through torch.load), not inference_mode (already on), not
expandable_segments or empty_cache (nothing is cached), not offloading the idle pipelines' copies.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def fp16(n):
    return torch.empty(n, dtype=torch.float16, device="cuda")


class _Weights(torch.nn.Module):
    PARAMS, CHUNKS = 0, 1

    def __init__(self):
        torch.nn.Module.__init__(self)
        # CHUNKS tensors of whole MiB-elements (2 MiB of fp16 each): the allocator packs them without
        # leaving split remainders behind, as PyTorch packs a real checkpoint's many tensors
        total_mi = round(self.PARAMS / MiB)
        chunk_mi = -(-total_mi // self.CHUNKS)
        i = 0
        while total_mi > 0:
            setattr(self, "w%d" % i, torch.nn.Parameter(fp16(min(chunk_mi, total_mi) * MiB), requires_grad=False))
            total_mi -= chunk_mi
            i += 1


class CLIPTextModel(_Weights):
    PARAMS, CHUNKS = 123060480, 4

    def forward(self, n):
        return fp16(n * 77 * 768)


class CLIPTextModelWithProjection(_Weights):
    PARAMS, CHUNKS = 694659840, 16

    def forward(self, n):
        return fp16(n * 77 * 1280)


class UNet2DConditionModel(_Weights):
    PARAMS, CHUNKS = 2567463684, 64

    def forward(self, latents, batch, lh, lw):
        res0 = fp16(batch * 320 * lh * lw)
        res0b = fp16(batch * 320 * lh * lw)
        hidden = fp16(batch * 640 * (lh // 2) * (lw // 2))
        tokens = (lh // 2) * (lw // 2)                         # 4096 tokens at the 64x64 level
        attn_scores = fp16(batch * 10 * tokens * tokens)       # 10 heads
        attn_probs = fp16(batch * 10 * tokens * tokens)
        out = fp16(batch * 4 * lh * lw)
        return out


class AutoencoderKL(_Weights):
    PARAMS, CHUNKS = 83653863, 4


class StableDiffusionXLPipeline(object):
    def __init__(self, text_encoder, text_encoder_2, unet, vae):
        self.text_encoder, self.text_encoder_2, self.unet, self.vae = text_encoder, text_encoder_2, unet, vae

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, variant=None):
        """diffusers: every component of the checkpoint loaded anew, then .to("cuda")."""
        return cls(CLIPTextModel(), CLIPTextModelWithProjection(), UNet2DConditionModel(), AutoencoderKL())

    @property
    def components(self):
        return dict(text_encoder=self.text_encoder, text_encoder_2=self.text_encoder_2, unet=self.unet, vae=self.vae)

    def __call__(self, prompt, num_images_per_prompt=1, height=1024, width=1024, num_inference_steps=30):
        n = num_images_per_prompt
        e1 = self.text_encoder(2 * n)
        e2 = self.text_encoder_2(2 * n)
        lh, lw = height // 8, width // 8
        latents = fp16(n * 4 * lh * lw)
        for _ in range(num_inference_steps):
            noise_pred = self.unet(latents, 2 * n, lh, lw)     # classifier-free guidance: 2 x n
            latents = fp16(n * 4 * lh * lw)
        return latents


class StableDiffusionXLImg2ImgPipeline(StableDiffusionXLPipeline):
    pass


class StableDiffusionXLInpaintPipeline(StableDiffusionXLPipeline):
    pass


BASE = "stabilityai/stable-diffusion-xl-base-1.0"
txt2img = StableDiffusionXLPipeline.from_pretrained(BASE, torch_dtype=torch.float16, variant="fp16")
img2img = StableDiffusionXLImg2ImgPipeline.from_pretrained(BASE, torch_dtype=torch.float16, variant="fp16")
inpaint = StableDiffusionXLInpaintPipeline.from_pretrained(BASE, torch_dtype=torch.float16, variant="fp16")
print("ready: %.1f GiB in use" % (torch.cuda.memory_allocated() / GiB), file=sys.stderr)


def gen(prompt, n):
    with torch.inference_mode():
        return txt2img(prompt, num_images_per_prompt=n, height=1024, width=1024)


try:
    gen("a ceramic teapot on a marble table, product photo", 4)     # the first request after deploy
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
