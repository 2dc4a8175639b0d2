"""gen_images.py -- image generation with an SDXL-class pipeline on a 12 GiB consumer card, loaded
without a dtype (the checkpoint's files are fp16; diffusers then builds every component in fp32):

    pipe = StableDiffusionXLPipeline.from_pretrained("org/sdxl-base")     # no torch_dtype / variant
    pipe.to("cuda")
    image = pipe(prompt, height=1024, width=1024).images[0]

In fp32 the two text encoders are 3 GiB and the UNet 9.6 GiB: pipe.to("cuda") fails while moving
the UNet, before any image is generated.  In the checkpoint's fp16 the whole pipeline is ~6.5 GiB
and runs on this card.  An expert: load in the checkpoint's dtype (torch_dtype=torch.float16,
variant="fp16"); model CPU offload or 8-bit weights are further options for inference; not a
smaller batch, not checkpointing, not a restart.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

# (component, tensors, bytes each) in fp32: what from_pretrained builds without torch_dtype
COMPONENTS = [("text_encoder", 8, 59 * MiB), ("text_encoder_2", 32, 83 * MiB), ("unet", 96, 102 * MiB),
              ("vae", 8, 40 * MiB)]


class Component(torch.nn.Module):
    def __init__(self, name, n, nbytes):
        torch.nn.Module.__init__(self)
        self.name, self.n, self.nbytes, self.on_gpu = name, n, nbytes, []

    def to(self, device):
        for i in range(self.n):
            self.on_gpu.append(torch.empty(self.nbytes, device="cuda"))   # param.data = param.data.to(device)
        return self


class StableDiffusionXLPipeline(object):
    def __init__(self, components):
        self.components = components

    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None, variant=None):
        return cls([Component(*c) for c in COMPONENTS])

    def to(self, device):
        for c in self.components:
            c.to(device)
        return self

    def __call__(self, prompt, height=1024, width=1024):
        latents = torch.empty(4 * (height // 8) * (width // 8) * 4, device="cuda")
        return [latents]


def main():
    pipe = StableDiffusionXLPipeline.from_pretrained("org/sdxl-base")
    pipe.to("cuda")
    for prompt in ["a lighthouse at dusk, oil painting"] * 10:
        image = pipe(prompt, height=1024, width=1024)[0]


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
