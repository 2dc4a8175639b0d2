"""poster.py -- generating a 2048 x 2048 poster with an SDXL pipeline in fp16 (6.5 GiB of weights) on
a 16 GiB card (RTX 4080 class); 1024 px images work every day:

    pipe = StableDiffusionXLPipeline.from_pretrained(base, torch_dtype=torch.float16,
                                                     variant="fp16").to("cuda")
    image = pipe(prompt, height=2048, width=2048, num_inference_steps=30).images[0]

The 30 denoising steps run (the UNet works on 256 x 256 latents with SDPA attention, ~2.5 GiB of
temporaries).  Then the VAE decodes: SDXL's VAE is upcast to fp32 for the decode (force_upcast:
it overflows in fp16), and its decoder works at full resolution: the last upsampler of the
1024 px stage interpolates its 2 GiB input to a 512-channel 2048 x 2048 fp32 tensor (8 GiB; its
convolution then needs another 8 GiB), with 6.8 GiB free once PyTorch has given back its cache.
The rest of the card is weights (UNet, two text encoders, the VAE) and the CUDA context.  An expert: decode in tiles (pipe.enable_vae_tiling()), which keeps the decode
near 1 GiB; an fp16-safe VAE (sdxl-vae-fp16-fix) halves it; offloading the UNet alone does not
cover two 8 GiB tensors.  Not a smaller batch (it is one image), not checkpointing (no training),
not a leak.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Weights(torch.nn.Module):
    def __init__(self, n, nbytes):
        torch.nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(nbytes, device="cuda"), requires_grad=False))


class AutoencoderKL(torch.nn.Module):
    force_upcast = True

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.decoder = Weights(16, 10 * MiB)            # fp16, 160 MiB

    def to_fp32(self):
        self.decoder = Weights(16, 20 * MiB)            # upcast: new fp32 copies, the fp16 ones go
        return self

    def decode(self, latents):
        h = torch.empty(512 * 256 * 256 * 4, device="cuda")               # conv_in, 512 ch at 256^2
        for res, ch in ((256, 512), (512, 512), (1024, 512)):
            for r in range(3):                                            # resnets: norm, conv, add
                t = torch.empty(ch * res * res * 4, device="cuda")
                out = torch.empty(ch * res * res * 4, device="cuda")
                del t
                h = out
            up = torch.empty(ch * (2 * res) * (2 * res) * 4, device="cuda")   # Upsample2D: interpolate
            del h
            h = torch.empty(ch * (2 * res) * (2 * res) * 4, device="cuda")    # Upsample2D: conv
            del up
        return h


class StableDiffusionXLPipeline(object):
    def __init__(self):
        self.text_encoder = Weights(8, 30 * MiB)        # CLIP ViT-L, fp16
        self.text_encoder_2 = Weights(32, 42 * MiB)     # OpenCLIP bigG, fp16
        self.unet = Weights(96, 51 * MiB)               # 2.6B parameters, fp16
        self.vae = AutoencoderKL()

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, variant=None):
        return cls()

    def __call__(self, prompt, height, width, num_inference_steps):
        with torch.no_grad():
            embeds = torch.empty(2 * 77 * 2048 * 2, device="cuda")
            latents = torch.empty(4 * (height // 8) * (width // 8) * 2, device="cuda")
            for step in range(num_inference_steps):
                temps = [torch.empty(320 * MiB, device="cuda") for _ in range(8)]   # CFG batch 2
                del temps
            if self.vae.force_upcast:
                self.vae.to_fp32()
            image = self.vae.decode(latents)
            return image


def main():
    pipe = StableDiffusionXLPipeline.from_pretrained("stabilityai/stable-diffusion-xl-base-1.0",
                                                     torch_dtype=torch.float16, variant="fp16")
    image = pipe("a retro travel poster of the Alps", height=2048, width=2048, num_inference_steps=30)
    return image


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
