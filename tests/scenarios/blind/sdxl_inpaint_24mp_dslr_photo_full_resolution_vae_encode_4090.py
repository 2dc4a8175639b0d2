"""declutter_worker.py -- a real-estate photo service: agents upload listing photos, draw a mask over the
clutter (a laundry basket, cables, a parked car), and an SDXL inpainting model fills it in ("empty
hardwood floor, clean white wall").  One RTX 4090 (24 GB) per worker, the pipeline loaded once in fp16:

    pipe = AutoPipelineForInpainting.from_pretrained(
        "diffusers/stable-diffusion-xl-1.0-inpainting-0.1", torch_dtype=torch.float16, variant="fp16"
    ).to("cuda")

    def declutter(job):
        image = load_image(job.photo_path)            # the agent's original
        mask = load_image(job.mask_path)              # same size, white = remove
        result = pipe(prompt=job.prompt, negative_prompt="furniture, objects, people, text",
                      image=image, mask_image=mask,
                      height=image.height, width=image.width,      # added in v1.3: keep the aspect ratio
                      strength=0.99, guidance_scale=7.0, num_inference_steps=30).images[0]
        return result

Through beta the uploads were phone pictures resized by the web client to at most 1024 px, and v1.3
added height/width because the pipeline's default (1024x1024) squashed 4:3 photos.  Since the launch the
client uploads originals: the first photographer's job is a 6000x4000 JPEG from a Sony A7 III, and the
worker dies inside the pipeline: prepare_latents encodes the photo with the VAE, which diffusers upcasts
to float32 for SDXL (force_upcast); the VAE encoder's first convolution makes 128 channels at full
resolution, 1 x 128 x 4000 x 6000 float32 = 11.4 GiB, and its first ResNet block's GroupNorm wants
another 11.4 GiB with 4.7 GiB free.  The pipeline (UNet 2.57B, both text encoders, VAE: 6.5 GiB) is not
the problem; the photo is 23x the pixels SDXL works at.

An expert: do not run SDXL at 24 megapixels; inpaint only the region around the mask at the model's
resolution and paste it back into the untouched original: diffusers' `padding_mask_crop=32` does exactly
that (crops the mask's bounding box with a margin, resizes it to height x width, e.g. 1024, inpaints,
and composites into the full-size image), or crop/downscale by hand.  Memory then is what it was in
beta, and the rest of the photo keeps its original pixels.  Wrong advice: a smaller batch (batch 1),
fp16 VAE (sdxl-vae-fp16-fix: 5.7 GiB tensors, still several at once, and the UNet still at 500x750
latents), enable_model_cpu_offload / sequential offload or quantization (the weights are 6.5 GiB of
24), gradient checkpointing or inference_mode (the pipeline already runs under no_grad),
expandable_segments / empty_cache (nothing is cached; one tensor is half the card), VAE tiling or
slicing first (the VAE passes, then the UNet denoises 24 MP for 30 steps: 20x slower, and SDXL
composes badly far from its training size), a 48/80 GB card.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"


class Image(object):
    """PIL.Image.Image, as far as the worker reads it (host memory)."""

    def __init__(self, width, height, mode="RGB"):
        self.width, self.height, self.mode = width, height, mode
        self.size = (width, height)


def load_image(path):
    """diffusers.utils.load_image: PIL, RGB."""
    if "mask" in path:
        return Image(6000, 4000, "L")
    return Image(6000, 4000)


class Weights(torch.nn.Module):
    """A block of a model's weights; .to(dtype=...) converts each tensor in turn (Module._apply: the new
    tensor is made, then the old one released), as module.to(torch.float32) does."""

    def __init__(self, numels, dtype):
        torch.nn.Module.__init__(self)
        self.numels = list(numels)
        self.dtype = dtype
        for i, n in enumerate(self.numels):
            self._parameters["p%d" % i] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=DEVICE),
                                                             requires_grad=False)

    def to(self, device=None, dtype=None):
        if dtype is not None and dtype != self.dtype:
            for i, n in enumerate(self.numels):
                self._parameters["p%d" % i] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=DEVICE),
                                                                 requires_grad=False)
            self.dtype = dtype
        return self


def unet_numels():
    """UNet2DConditionModel of the SDXL inpainting checkpoint (9 input channels): 2.57B, by layer group."""
    groups = [(6, 13_107_200), (131, 6_553_600), (140, 2_621_440), (140, 1_638_400), (70, 3_276_800),
              (22, 14_745_600), (12, 29_491_200), (26, 409_600), (60, 1_638_400), (14, 921_600), (3000, 1280)]
    out = []
    for n, size in groups:
        out += [size] * n
    return out


class AutoencoderKL(torch.nn.Module):
    """SDXL's VAE (force_upcast: true): encoder 34.2M, decoder 49.5M parameters."""

    class config(object):
        force_upcast = True
        scaling_factor = 0.13025
        block_out_channels = (128, 256, 512, 512)

    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.encoder_weights = Weights([3_500] + [147_584] * 4 + [295_168] * 4 + [1_180_160] * 11 +
                                       [2_359_808] * 8 + [530_000], dtype)
        self.decoder_weights = Weights([2_359_808] * 18 + [590_080] * 8 + [147_584] * 12 + [520_000], dtype)
        self.dtype = dtype

    def to(self, device=None, dtype=None):
        self.encoder_weights.to(device, dtype)
        self.decoder_weights.to(device, dtype)
        if dtype is not None:
            self.dtype = dtype
        return self

    def encode(self, x, h, w):
        """Encoder: conv_in to 128 channels at full resolution, then the first down block's ResNets."""
        esize = 4 if self.dtype == torch.float32 else 2
        c0 = self.config.block_out_channels[0]
        hidden = torch.empty(c0 * h * w, dtype=self.dtype, device=DEVICE)        # conv_in
        for _ in range(2):                                                       # down_blocks[0].resnets
            residual = hidden
            norm = torch.empty(c0 * h * w, dtype=self.dtype, device=DEVICE)      # norm1 (GroupNorm), SiLU
            conv = torch.empty(c0 * h * w, dtype=self.dtype, device=DEVICE)      # conv1
            del norm
            norm = torch.empty(c0 * h * w, dtype=self.dtype, device=DEVICE)      # norm2, SiLU
            del conv
            conv = torch.empty(c0 * h * w, dtype=self.dtype, device=DEVICE)      # conv2
            del norm
            hidden = conv
            del residual
        return torch.empty(8 * (h // 8) * (w // 8) * esize // 2, dtype=self.dtype, device=DEVICE)


class StableDiffusionXLInpaintPipeline(object):
    vae_scale_factor = 8
    default_sample_size = 128

    def __init__(self, dtype=torch.float16):
        self.text_encoder = Weights([49408 * 768, 77 * 768] + [7_087_872] * 12, dtype)           # CLIP ViT-L
        self.text_encoder_2 = Weights([49408 * 1280, 77 * 1280] + [19_676_160] * 32 + [1280 * 1280], dtype)
        self.unet = Weights(unet_numels(), dtype)
        self.vae = AutoencoderKL(dtype)
        self.dtype = dtype

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, variant=None):
        print("loading %s (%s, variant %s)" % (name, torch_dtype, variant))
        return cls(torch_dtype)

    def to(self, device):
        return self

    def encode_prompt(self, prompt, negative_prompt, do_classifier_free_guidance):
        n = 2 if do_classifier_free_guidance else 1
        embeds = torch.empty(n * 77 * 2048, dtype=self.dtype, device=DEVICE)
        pooled = torch.empty(n * 1280, dtype=self.dtype, device=DEVICE)
        hidden = torch.empty(n * 77 * 1280 * 4, dtype=self.dtype, device=DEVICE)   # encoder activations
        del hidden
        return embeds, pooled

    def _encode_vae_image(self, image, h, w):
        dtype = image.dtype
        if self.vae.config.force_upcast:
            image = torch.empty(3 * h * w, dtype=torch.float32, device=DEVICE)      # image.float()
            self.vae.to(dtype=torch.float32)
        image_latents = self.vae.encode(image, h, w)
        if self.vae.config.force_upcast:
            self.vae.to(dtype)
        return image_latents

    def prepare_latents(self, image, h, w, is_strength_max):
        image = torch.empty(3 * h * w, dtype=self.dtype, device=DEVICE)    # image.to(device=device, dtype=dtype)
        if not is_strength_max:
            image_latents = self._encode_vae_image(image, h, w)
        return torch.empty(4 * (h // 8) * (w // 8), dtype=self.dtype, device=DEVICE)

    def __call__(self, prompt=None, negative_prompt=None, image=None, mask_image=None, height=None, width=None,
                 strength=0.9999, guidance_scale=7.5, num_inference_steps=50, padding_mask_crop=None):
        with torch.no_grad():                                  # @torch.no_grad() on __call__
            height = height or self.default_sample_size * self.vae_scale_factor
            width = width or self.default_sample_size * self.vae_scale_factor
            do_cfg = guidance_scale > 1.0
            prompt_embeds, pooled = self.encode_prompt(prompt, negative_prompt, do_cfg)
            # init_image = self.image_processor.preprocess(image, height=height, width=width, ...)  (CPU, fp32)
            # mask = self.mask_processor.preprocess(mask_image, height=height, width=width, ...)  (CPU)
            # masked_image = init_image * (mask < 0.5)
            latents = self.prepare_latents(image, height, width, is_strength_max=strength == 1.0)
            # prepare_mask_latents(...), the denoising loop, vae.decode(...) ...
            return None


class Job(object):
    def __init__(self, job_id, photo_path, mask_path, prompt):
        self.id, self.photo_path, self.mask_path, self.prompt = job_id, photo_path, mask_path, prompt


def declutter(pipe, job):
    image = load_image(job.photo_path)
    mask = load_image(job.mask_path)
    print("job %s: %dx%d photo" % (job.id, image.width, image.height))
    result = pipe(prompt=job.prompt, negative_prompt="furniture, objects, people, text",
                  image=image, mask_image=mask,
                  height=image.height, width=image.width,
                  strength=0.99, guidance_scale=7.0, num_inference_steps=30)
    return result


def main():
    pipe = StableDiffusionXLInpaintPipeline.from_pretrained(
        "diffusers/stable-diffusion-xl-1.0-inpainting-0.1", torch_dtype=torch.float16, variant="fp16").to("cuda")
    print("pipeline on cuda: %.2f GiB allocated" % (torch.cuda.memory_allocated() / 2.0 ** 30))
    job = Job("7f3a-4410", "/srv/uploads/7f3a-4410/DSC04217.JPG", "/srv/uploads/7f3a-4410/DSC04217_mask.png",
              "empty hardwood floor, clean white wall, bright living room")
    declutter(pipe, job)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
