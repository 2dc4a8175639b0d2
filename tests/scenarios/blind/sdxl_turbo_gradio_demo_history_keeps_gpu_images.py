"""demo.ipynb -- an SDXL-Turbo text-to-image demo I serve to the team from a Jupyter notebook with
Gradio (share link) on my workstation's RTX 4090 (24 GiB).  The pipeline is loaded once in fp16
(UNet 2.6B, both text encoders, the VAE upcast to fp32: 6.6 GiB); each click makes 4 images at
512x512 in one step:

    pipe = AutoPipelineForText2Image.from_pretrained("stabilityai/sdxl-turbo", torch_dtype=torch.float16).to("cuda")
    history = []                                  # for the "Gallery" tab and the "download all" button

    @torch.inference_mode()
    def generate(prompt, seed):
        out = pipe(prompt, num_images_per_prompt=4, num_inference_steps=1, guidance_scale=0.0,
                   output_type="pt")              # tensors, so that the upscale tab can reuse them
        history.append({"prompt": prompt, "seed": seed, "images": out.images})
        return to_pil(out.images)

    gr.Interface(generate, ...).launch(share=True)

It worked all morning.  After lunch a click fails in the VAE decode with "CUDA out of memory.
Tried to allocate 1024.00 MiB ... 1.30 GiB reserved by PyTorch but unallocated".  Each request's images
stay on the GPU inside `history` (4 x 3 x 512 x 512 fp32 = 12 MiB per click); after about 1,180 clicks
that is 13.8 GiB, and the decode's temporaries (about 2.2 GiB at their peak) no longer fit beside the
weights; the cache left between the history's tensors is in pieces of at most 512 MiB.  nvidia-smi
shows only the notebook's kernel.

An expert: the demo keeps every output on the GPU -- store `out.images.cpu()` (or the PIL images, or
files on disk) in the history, or keep only the last N entries on the GPU.  Not a smaller batch or
fewer steps (one click alone fits with 14 GiB to spare), not quantizing the UNet or a bigger card (the
history would fill any card), not expandable_segments or empty_cache (they would win back the 1.3 GiB
between the history's tensors, a hundred clicks more; the 13.8 GiB are live), not inference_mode
(already on), not another process.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def fp16(n):
    return torch.empty(n, dtype=torch.float16, device="cuda")


def fp32(n):
    return torch.empty(n, dtype=torch.float32, device="cuda")


class CLIPTextModel(torch.nn.Module):
    def __init__(self, params, width):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(fp16(params), requires_grad=False)
        self.width = width

    def forward(self, batch):
        hidden = fp16(batch * 77 * self.width)
        return hidden


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # 2.567B parameters in fp16, as 64 tensors of about 80 MB
        self.blocks = torch.nn.Module()
        for i in range(64):
            setattr(self.blocks, "w%d" % i, torch.nn.Parameter(fp16(2567000000 // 64), requires_grad=False))

    def forward(self, latents, prompt_embeds, batch):
        down = [fp16(batch * 320 * 64 * 64), fp16(batch * 320 * 64 * 64), fp16(batch * 640 * 32 * 32),
                fp16(batch * 640 * 32 * 32), fp16(batch * 1280 * 16 * 16), fp16(batch * 1280 * 16 * 16)]
        attn_scores = fp16(batch * 20 * 1024 * 1024)             # 32x32 level: 1024 tokens, 20 heads
        mid = fp16(batch * 1280 * 16 * 16)
        noise_pred = fp16(batch * 4 * 64 * 64)
        return noise_pred


class AutoencoderKL(torch.nn.Module):
    """The SDXL VAE, upcast to float32 by the pipeline (force_upcast)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.decoder_weight = torch.nn.Parameter(fp32(49500000), requires_grad=False)
        self.encoder_weight = torch.nn.Parameter(fp32(34100000), requires_grad=False)

    def decode(self, latents, batch):
        z = fp32(batch * 4 * 64 * 64)
        mid = fp32(batch * 512 * 64 * 64)
        up0 = fp32(batch * 512 * 128 * 128)
        up1 = fp32(batch * 512 * 256 * 256)                      # 512 MiB
        up1b = fp32(batch * 512 * 256 * 256)
        up2 = fp32(batch * 256 * 512 * 512)                      # 1 GiB
        del up1
        up3 = fp32(batch * 128 * 512 * 512)                      # 512 MiB
        del up2, up1b
        up3b = fp32(batch * 128 * 512 * 512)
        image = fp32(batch * 3 * 512 * 512)
        return image


class StableDiffusionXLPipeline(object):
    def __init__(self):
        self.text_encoder = CLIPTextModel(123000000, 768)
        self.text_encoder_2 = CLIPTextModel(694700000, 1280)
        self.unet = UNet2DConditionModel()
        self.vae = AutoencoderKL()

    def __call__(self, prompt, num_images_per_prompt=4, num_inference_steps=1, guidance_scale=0.0, output_type="pt"):
        batch = num_images_per_prompt
        e1 = self.text_encoder(1)
        e2 = self.text_encoder_2(1)
        prompt_embeds = fp16(batch * 77 * 2048)
        latents = fp16(batch * 4 * 64 * 64)
        for _ in range(num_inference_steps):
            noise_pred = self.unet(latents, prompt_embeds, batch)
            latents = fp16(batch * 4 * 64 * 64)                  # scheduler.step
        image = self.vae.decode(latents, batch)
        images = fp32(batch * 3 * 512 * 512)                     # image_processor.postprocess: (image / 2 + 0.5).clamp(0, 1)
        return images


pipe = StableDiffusionXLPipeline()
history = []


def generate(prompt, seed):
    with torch.inference_mode():
        images = pipe(prompt, num_images_per_prompt=4, num_inference_steps=1, guidance_scale=0.0, output_type="pt")
        history.append({"prompt": prompt, "seed": seed, "images": images})
    return len(history)


try:
    for click in range(100000):                  # the team clicking "Generate" all day
        generate("a corgi astronaut, studio lighting, #%d" % click, seed=click)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
