"""make_shots.py -- the owner of a small online shop generates lifestyle pictures for her product pages with Stable
Diffusion XL on her desktop PC (GeForce RTX 4060 Ti 8 GB, 32 GB RAM).  The script is the model card's snippet with
a loop around it:

    pipe = StableDiffusionXLPipeline.from_pretrained("stabilityai/stable-diffusion-xl-base-1.0",
                                                     torch_dtype=torch.float16, variant="fp16", use_safetensors=True)
    pipe.to("cuda")
    for sku, prompt in prompts.items():
        image = pipe(prompt, negative_prompt=NEGATIVE, num_inference_steps=30, guidance_scale=7.0,
                     height=1024, width=1024).images[0]
        image.save(f"out/{sku}.png")

Everything is resident on the 8 GB card: the UNet (2.57B parameters, 4.8 GiB in fp16), the two text encoders
(CLIP ViT-L and OpenCLIP ViT-bigG: 0.82B parameters, 1.5 GiB) and the VAE (0.16 GiB): 6.5 GiB of weights, 6.8 GiB
with the CUDA context, 1.2 GiB left.  The 30 denoising steps go through (the UNet's activations at 128x128 latents
with classifier-free guidance and SDPA stay under 0.5 GiB), the progress bar reaches 30/30, and the image dies in
the VAE decode: SDXL's VAE overflows in fp16, so the pipeline upcasts it (vae.config.force_upcast) and the
decoder's up blocks run in float32; at 1024x1024 the upsampler of up_blocks[1] makes a [1, 512, 512, 512] float32
tensor (512 MiB), then asks for its convolution's 512 MiB output with 258 MiB free.

An expert: the text encoders run once per image and the UNet is idle during the decode, yet all of them sit on an
8 GB card for the whole run.  pipe.enable_model_cpu_offload() instead of pipe.to("cuda") keeps one component on
the GPU at a time (moved in and out through the 32 GB of RAM, a second or two per image): the decode then has
7 GiB to itself.  Wrong first advice: enable_vae_tiling / slicing or another split of the decode (SDXL's VAE tiles
at 1024 pixels, sample_size 1024: at exactly 1024x1024 tiling does nothing, and slicing splits a batch of one),
an fp16 VAE (madebyollin's fp16-fix halves the decode's tensors and fails one block later, at the last upsampler:
256 x 1024 x 1024 is 512 MiB in fp16 too), a smaller batch (one image), inference mode (the pipeline already runs
under no_grad), empty_cache / expandable_segments (the weights are live, nothing is cached or fragmented),
quantizing SDXL's UNet, a bigger GPU (the card runs SDXL with offloading), other processes (none).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20


def _weights(module, name, n_params, dtype, chunks):
    """A component's weights, as several tensors (the safetensors shard's tensors), moved to the GPU."""
    per = n_params // chunks
    for i in range(chunks):
        setattr(module, "%s_%d" % (name, i),
                torch.nn.Parameter(torch.empty(per, dtype=dtype, device="cuda"), requires_grad=False))


def _t(n, dtype):
    return torch.empty(n, dtype=dtype, device="cuda")


class CLIPTextModel(torch.nn.Module):
    def __init__(self, n_params, width, chunks):
        torch.nn.Module.__init__(self)
        _weights(self, "w", n_params, torch.float16, chunks)
        self.width = width

    def forward(self, ids):
        return _t(2 * 77 * self.width, torch.float16)        # penultimate hidden states, negative and positive


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        _weights(self, "w", 2_567_463_684, torch.float16, 96)

    def forward(self, latents, t, prompt_embeds):
        # batch 2 (classifier-free guidance) at 128x128 latents; the skip connections of the down path are kept for the
        # up path; the transformer blocks' feed-forwards at 64x64 (4096 tokens, GEGLU to 2x5120) are the largest
        skips = [_t(2 * 320 * 128 * 128, torch.float16) for _ in range(4)]
        skips += [_t(2 * 640 * 64 * 64, torch.float16) for _ in range(3)]
        skips += [_t(2 * 1280 * 32 * 32, torch.float16) for _ in range(3)]
        ff = _t(2 * 4096 * 10240, torch.float16)
        gelu = _t(2 * 4096 * 5120, torch.float16)
        del ff, gelu
        up = [_t(2 * 640 * 64 * 64, torch.float16) for _ in range(3)]
        noise_pred = _t(2 * 4 * 128 * 128, torch.float16)
        del skips, up
        return noise_pred


class AutoencoderKL(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.dtype = torch.float16
        _weights(self, "w", 83_653_863, torch.float16, 8)

    def to(self, dtype=None):
        """vae.to(dtype=torch.float32): each weight gets a float32 copy, the fp16 one is freed."""
        for k, p in list(self._parameters.items()):
            new = torch.nn.Parameter(torch.empty(p.nbytes // 2, dtype=dtype, device="cuda"), requires_grad=False)
            self._parameters[k] = new
            del p
        self.dtype = dtype
        return self

    def decode(self, z):
        """Decoder: conv_in and the mid block at 128x128 with 512 channels, four up blocks (512, 512, 256, 128
        channels), each but the last ending in an Upsample2D (nearest x2, then a 3x3 conv), to a 1024x1024 image."""
        dt = self.dtype
        h = _t(512 * 128 * 128, dt)                                   # conv_in
        for _ in range(2):                                            # mid_block: resnet, attention, resnet
            a, b = _t(512 * 128 * 128, dt), _t(512 * 128 * 128, dt)
            del h, a
            h = b
        for ch_in, ch, size, upsample in ((512, 512, 128, True), (512, 512, 256, True), (512, 256, 512, True),
                                          (256, 128, 1024, False)):
            for _ in range(3):                                        # ResnetBlock2D: norm1, silu, conv1, norm2, conv2
                n1 = _t(ch_in * size * size, dt)
                c1 = _t(ch * size * size, dt)
                del n1
                c2 = _t(ch * size * size, dt)
                del c1
                out = _t(ch * size * size, dt)                        # + shortcut
                del c2, h
                h, ch_in = out, ch
            if upsample:                                              # Upsample2D
                up = F.interpolate(h, scale_factor=2.0, mode="nearest")
                del h
                h = _t(ch * (2 * size) * (2 * size), dt)               # self.conv(hidden_states)
                del up
        return _t(3 * 1024 * 1024, dt)


class StableDiffusionXLPipeline(object):
    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None, variant=None, use_safetensors=True):
        return cls()

    def to(self, device):
        """pipe.to("cuda"): every component's weights on the GPU."""
        self.text_encoder = CLIPTextModel(123_060_480, 768, 12)
        self.text_encoder_2 = CLIPTextModel(694_659_840, 1280, 32)
        self.unet = UNet2DConditionModel()
        self.vae = AutoencoderKL()
        return self

    def __call__(self, prompt, negative_prompt=None, num_inference_steps=50, guidance_scale=5.0, height=1024,
                 width=1024):
        with torch.no_grad():                                       # @torch.no_grad() on __call__
            e1 = self.text_encoder(prompt)
            e2 = self.text_encoder_2(prompt)
            prompt_embeds = _t(2 * 77 * 2048, torch.float16)
            del e1, e2
            latents = _t(4 * (height // 8) * (width // 8), torch.float16)
            for i in range(num_inference_steps):
                noise_pred = self.unet(latents, i, prompt_embeds)
                latents = _t(4 * (height // 8) * (width // 8), torch.float16)    # scheduler.step
                del noise_pred
            print("100%%|##########| %d/%d" % (num_inference_steps, num_inference_steps))
            # needs_upcasting = self.vae.dtype == torch.float16 and self.vae.config.force_upcast
            self.vae.to(dtype=torch.float32)
            z = _t(4 * (height // 8) * (width // 8), torch.float32)
            image = self.vae.decode(z)
            return image


PROMPTS = {
    "MUG-STONE-350": "a speckled stoneware mug on a linen tablecloth, morning light, shallow depth of field",
    "TOTE-OLIVE-L": "an olive canvas tote bag on a wooden bench in a sunlit cafe, lifestyle photo",
}
NEGATIVE = "blurry, watermark, text, deformed"


def main():
    pipe = StableDiffusionXLPipeline.from_pretrained("stabilityai/stable-diffusion-xl-base-1.0",
                                                     torch_dtype=torch.float16, variant="fp16", use_safetensors=True)
    pipe.to("cuda")
    for sku, prompt in PROMPTS.items():
        image = pipe(prompt, negative_prompt=NEGATIVE, num_inference_steps=30, guidance_scale=7.0,
                     height=1024, width=1024)
        print("out/%s.png" % sku)
        del image


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
