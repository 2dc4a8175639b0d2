"""render_worker.py -- a product-photo renderer: SDXL base (fp16: UNet 4.8 GiB, two text encoders
1.6 GiB, VAE 0.2 GiB) making 4 images of 1024x1024 per job on a 24 GB card that this worker has to
itself.  Its config came from the team's shared template, written for the old cluster where two
workers split each 40 GB A100:

    cfg = yaml.safe_load(open("worker.yaml"))          # gpu_memory_fraction: 0.35
    torch.cuda.set_per_process_memory_fraction(cfg["gpu_memory_fraction"])
    pipe = StableDiffusionXLPipeline.from_pretrained(..., torch_dtype=torch.float16).to("cuda")
    with torch.inference_mode():
        images = pipe(prompt, num_images_per_prompt=4, height=1024, width=1024).images

0.35 of 24 GiB is 8.4 GiB: the weights (6.6 GiB) load, and the first denoising step's UNet
activations (~2.6 GiB for a CFG batch of 8 latents) are refused by PyTorch's own allocator while
the card has 16 GiB free.

An expert: the framework's cap, not the card, is what ran out; raise or remove the memory fraction
(it was meant for two workers on a 40 GB card).  Nothing else on the card; the job is already fp16
inference under inference_mode; a smaller batch, offloading, quantization or a bigger card would
all be wrong answers to a config error.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

CONFIG = {"gpu_memory_fraction": 0.35, "num_images_per_prompt": 4, "height": 1024, "width": 1024,
          "num_inference_steps": 30}


def fp16_weights(nbytes):
    return torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.float16, device="cuda"), requires_grad=False)


class UNetBlock(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = fp16_weights(nbytes)

    def forward(self, x, nbytes):
        out = torch.empty(nbytes, device="cuda")
        return out


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(16):
            setattr(self, "block%d" % i, UNetBlock(300 * MiB))       # 4.7 GiB

    def forward(self, latents, emb):
        feats = []
        for i in range(16):                     # skip connections live until the up blocks use them
            feats.append(getattr(self, "block%d" % i)(latents, 170 * MiB))
        return torch.empty(latents.nbytes, device="cuda")


class TextEncoders(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.clip_l = torch.nn.Parameter(torch.empty(235 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)
        self.clip_g = torch.nn.Parameter(torch.empty(660 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class AutoencoderKL(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(80 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class StableDiffusionXLPipeline(object):
    def __init__(self):
        self.text_encoders = TextEncoders()
        self.unet = UNet2DConditionModel()
        self.vae = AutoencoderKL()

    def __call__(self, prompt, num_images_per_prompt, height, width, num_inference_steps):
        emb = torch.empty(2 * num_images_per_prompt * 77 * 2048 * 2, device="cuda")
        latents = torch.empty(2 * num_images_per_prompt * 4 * (height // 8) * (width // 8) * 2, device="cuda")
        for t in range(num_inference_steps):
            noise_pred = self.unet(latents, emb)
            latents = noise_pred
        return latents


def main():
    torch.cuda.set_per_process_memory_fraction(CONFIG["gpu_memory_fraction"])
    pipe = StableDiffusionXLPipeline()
    for job in range(100):
        with torch.inference_mode():
            images = pipe("a leather weekender bag on a marble table, studio light",
                          num_images_per_prompt=CONFIG["num_images_per_prompt"], height=CONFIG["height"],
                          width=CONFIG["width"], num_inference_steps=CONFIG["num_inference_steps"])
        del images


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
