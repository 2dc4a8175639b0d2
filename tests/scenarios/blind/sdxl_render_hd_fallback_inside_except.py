"""render_queue.py -- an internal SDXL render service on a 16 GB RTX A4000 (fp16 pipeline, 6.2 GiB of
weights: UNet 4.8 GiB, the two text encoders 1.3 GiB, the fp16-fixed VAE 160 MiB).  Every job makes
two images (num_images_per_prompt=2, so the UNet runs a batch of 4 with classifier-free guidance).
Our attention processor is an old custom one (prompt weighting) that computes the scores eagerly:

    @torch.no_grad()
    def render(job):
        try:
            return pipe(job.prompt, height=job.size, width=job.size, num_images_per_prompt=2)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            log.warning("OOM at %dpx, falling back to 1024px", job.size)
            return pipe(job.prompt, height=1024, width=1024, num_images_per_prompt=2)   # <- OOM again

1024px jobs render fine all day.  After a restart the first job of the queue asked for the new "HD"
preset, 1536px: at the first attention of the 96x96 level the score matrix (4 x 10 heads x 9216^2,
fp16, 6.3 GiB) fits, its softmax (another 6.3 GiB) does not.  The fallback then fails too, at 1024px,
at its own softmax (1.25 GiB): the 1536px attempt's score matrix, q/k/v and skip tensors (6.8 GiB) are
still alive, held by the frames of the exception's traceback while the except block runs, and
empty_cache() cannot release a byte of them.  Run outside the except block the 1024px fallback would
have 9.3 GiB free and fit easily.

An expert: this failure is the retry's own -- leave the except block before retrying (set a flag,
or drop the exception) so the failed attempt's tensors are freed; empty_cache is already there and
changes nothing.  (Separately, memory-efficient attention / SDPA would let 1536px fit at all.)  Not
a smaller batch, not a bigger card, not quantization, not inference_mode (the pipeline is under
no_grad already).
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


def fp16_weight(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=torch.float16, device="cuda"), requires_grad=False)


class Attention(nn.Module):
    """The team's custom prompt-weighting processor: q @ k^T and softmax made whole, in fp16."""

    def __init__(self, dim):
        nn.Module.__init__(self)
        self.to_qkv = fp16_weight(3 * dim * dim * 2)
        self.to_out = fp16_weight(dim * dim * 2)
        self.dim = dim

    def forward(self, hidden, batch, tokens):
        heads = self.dim // 64
        qkv = torch.empty(3 * batch * tokens * self.dim, dtype=torch.float16, device="cuda")
        scores = torch.empty(batch * heads * tokens * tokens, dtype=torch.float16, device="cuda")     # q @ k^T
        probs = torch.empty(batch * heads * tokens * tokens, dtype=torch.float16, device="cuda")      # softmax
        out = torch.empty(batch * tokens * self.dim, dtype=torch.float16, device="cuda")
        return out


class TransformerBlock(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.attn1 = Attention(dim)

    def forward(self, hidden, batch, tokens):
        return self.attn1(hidden, batch, tokens)


class ResnetBlock(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.conv = fp16_weight(nbytes)

    def forward(self, x, batch, side, channels):
        return torch.empty(batch * side * side * channels, dtype=torch.float16, device="cuda")


class UNet2DConditionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.down0 = ResnetBlock(1200 * MiB)
        self.down1 = TransformerBlock(640)
        self.mid = ResnetBlock(1900 * MiB)
        self.up = ResnetBlock(1800 * MiB - 4 * 640 * 640 * 2)

    def forward(self, latents, embeds, batch, height, width):
        side = height // 8
        skips = [self.down0(latents, batch, side, 320) for _ in range(3)]          # 192x192 at 1536px
        hidden = torch.empty(batch * (side // 2) ** 2 * 640, dtype=torch.float16, device="cuda")
        hidden = self.down1(hidden, batch, (side // 2) ** 2)                       # 9216 tokens at 1536px
        return hidden


class TextEncoder(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = fp16_weight(nbytes)

    def forward(self, n):
        return torch.empty(n * 77 * 2048, dtype=torch.float16, device="cuda")


class AutoencoderKL(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.decoder = fp16_weight(nbytes)


class StableDiffusionXLPipeline(object):
    def __init__(self):
        self.unet = UNet2DConditionModel()
        self.text_encoder = TextEncoder(240 * MiB)
        self.text_encoder_2 = TextEncoder(1080 * MiB)
        self.vae = AutoencoderKL(160 * MiB)

    def __call__(self, prompt, height=1024, width=1024, num_images_per_prompt=1):
        with torch.no_grad():                                                      # as diffusers' @torch.no_grad()
            batch = 2 * num_images_per_prompt                                      # classifier-free guidance
            embeds = self.text_encoder_2(batch)
            latents = torch.empty(batch * 4 * (height // 8) * (width // 8), dtype=torch.float16, device="cuda")
            for t in range(30):
                noise_pred = self.unet(latents, embeds, batch, height, width)
            return noise_pred


class Job(object):
    def __init__(self, prompt, size):
        self.prompt, self.size = prompt, size


def render(pipe, job):
    try:
        return pipe(job.prompt, height=job.size, width=job.size, num_images_per_prompt=2)
    except torch.cuda.OutOfMemoryError:
        torch.cuda.empty_cache()
        sys.stderr.write("OOM at %dpx, falling back to 1024px\n" % job.size)
        return pipe(job.prompt, height=1024, width=1024, num_images_per_prompt=2)


def main():
    pipe = StableDiffusionXLPipeline()
    queue = [Job("isometric cutaway of a container ship, studio lighting", 1536),
             Job("product shot of a ceramic mug on oak, soft shadows", 1024)]
    for job in queue:
        render(pipe, job)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
