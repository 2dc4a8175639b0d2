"""app.py -- an internal "mood board" Gradio app on a workstation's RTX 4090 (24 GB, 23.99 GiB): SDXL-Turbo
in fp16 (UNet 4.8 GiB, text encoders 1.5 GiB, VAE 0.2 GiB), one step per image.  To get under 200 ms
the developer followed a speed-up blog post:

    pipe = AutoPipelineForText2Image.from_pretrained("stabilityai/sdxl-turbo", torch_dtype=torch.float16).to("cuda")
    pipe.unet = torch.compile(pipe.unet, mode="reduce-overhead", fullgraph=True)   # CUDA graphs
    pipe.vae.decode = torch.compile(pipe.vae.decode, mode="reduce-overhead", fullgraph=True)

and the UI offers six aspect ratios (512x512 ... 1024x1024, 1152x640, 640x1152) and 1-4 images per
click.  With static shapes, every new (images, height, width) combination is compiled and captured as
a new CUDA graph, and each captured graph keeps its own private memory pool (the activations it was
recorded with, reserved for replays) and its static output for the life of the process: 24 possible
shapes, the decoder's pools 0.3-4 GiB each.  The app is fast and flat for the first shapes anyone tries; by mid-morning,
when the designers have clicked through 12 combinations, capturing the next new shape (4 images at
640x1152) fails inside the UNet: 6.6 GiB allocated (the weights), 15.5 GiB reserved but unallocated --
the decoder graphs' private pools, kept for replays.  `torch.cuda.memory_allocated()` hardly moves all
morning: the pools are reserved, not allocated.

An expert: the graphs' private pools, one per shape, fill the card: capture fewer shapes (a fixed set:
pad/bucket to 2-3 sizes, always batch 4, or compile with dynamic shapes / mode="max-autotune-no-
cudagraphs"), or let the graphs share one pool.  Wrong first advice: empty_cache (live graphs' pools
are not released), expandable_segments, a smaller batch or quantization (each shape fits alone), a
bigger GPU (more shapes will come), inference_mode or mixed precision (already fp16, no autograd).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(10):
            setattr(self, "block_%d" % i, torch.nn.Parameter(
                torch.empty(246 * MiB, dtype=torch.float16, device="cuda"), requires_grad=False))

    def forward(self, images, height, width, pool=(0, 0)):
        latent_px = (height // 8) * (width // 8)
        # recorded activations of one denoising step (attention at 1/2 and 1/4 latent size, resnets)
        workspace = torch.empty(images * latent_px * 48 * 1024, device="cuda", pool_id=pool)
        out = torch.empty(images * latent_px * 4 * 2, device="cuda", pool_id=pool)
        del workspace
        return out


class AutoencoderKL(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(80 * MiB, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)

    def decode(self, images, height, width, pool=(0, 0)):
        # the decoder's full-resolution activations (128-512 channels, fp16), then the image
        workspace = torch.empty(images * height * width * 1024, device="cuda", pool_id=pool)
        del workspace
        return torch.empty(images * height * width * 3 * 2, device="cuda", pool_id=pool)


class CUDAGraphRecord(object):
    def __init__(self, pool, static_output):
        self.pool = pool
        self.static_output = static_output


class Compiled(object):
    """torch.compile(fn, mode="reduce-overhead"): one graph (and private pool) per static input shape."""
    pools = [0]

    def __init__(self, fn):
        self.fn = fn
        self.graphs = {}

    def __call__(self, images, height, width):
        key = (images, height, width)
        if key not in self.graphs:
            Compiled.pools[0] += 1
            pool = (1, Compiled.pools[0])
            self.fn(images, height, width, pool=pool)                        # warm-up run
            self.graphs[key] = CUDAGraphRecord(pool, self.fn(images, height, width, pool=pool))  # capture
        return self.graphs[key].static_output


class Pipeline(object):
    def __init__(self):
        self.text_encoder = torch.nn.Parameter(torch.empty(1536 * MiB // 2, dtype=torch.float16, device="cuda"),
                                               requires_grad=False)
        self.vae = AutoencoderKL()
        self.unet = UNet2DConditionModel()

    def __call__(self, prompt, num_images_per_prompt, height, width, num_inference_steps=1, guidance_scale=0.0):
        with torch.inference_mode():
            latents = self.unet(num_images_per_prompt, height, width)
            images = self.vae.decode(num_images_per_prompt, height, width)
            del latents
            return images.nbytes


pipe = Pipeline()
pipe.unet = Compiled(pipe.unet)
pipe.vae.decode = Compiled(pipe.vae.decode)

# the morning's clicks: (images, height, width)
clicks = [(1, 512, 512), (1, 512, 512), (4, 512, 512), (1, 1024, 1024), (2, 768, 512), (4, 768, 512),
          (2, 1024, 1024), (1, 1152, 640), (4, 1024, 1024), (2, 512, 768), (1, 640, 1152), (4, 512, 768),
          (2, 1152, 640), (1, 1024, 1024), (4, 640, 1152), (4, 1152, 640), (3, 1024, 1024), (4, 1024, 1024)]
try:
    for images, h, w in clicks:
        pipe("a moodboard of brutalist interiors, warm light", num_images_per_prompt=images, height=h, width=w)
        print("click", (images, h, w), "graphs", len(pipe.unet.graphs) + len(pipe.vae.decode.graphs),
              "allocated %.1f GiB reserved %.1f GiB" % (torch.cuda.memory_allocated() / GiB,
                                                       torch.cuda.memory_reserved() / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
