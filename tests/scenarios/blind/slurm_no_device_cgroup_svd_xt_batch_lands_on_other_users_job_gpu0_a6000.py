"""svd_batch.py -- a research group's Slurm cluster whose GPU nodes each have one RTX A6000 (48 GB, 48 GiB
usable), shared as a consumable gres (--gres=gpu:1 gives a job the card, and only one job at a time).  A
student renders product turntables with Stable Video Diffusion img2vid-xt (fp16: UNet 2.9 GiB, VAE,
CLIP image encoder: 4.3 GiB in all) over a folder of 300 product photos, submitted as

    sbatch --partition=gpu --cpus-per-task=8 --mem=64G svd_batch.sh      # no --gres=gpu:1

The cluster's cgroup.conf has ConstrainDevices=no, so a job that asks for no GPU is scheduled on any
node with free CPUs and still sees the card: `pipe.to("cuda")` lands on the A6000 that Slurm had given,
with --gres=gpu:1, to another user's job (a LoRA fine-tune, `python train_lora.py`, pid 2291847, 31 GiB).  Alone the
render peaks at about 18.4 GiB (25 frames at 1024x576, decode_chunk_size=8); beside the other job only
16.5 GiB are left, and the first clip fails in the UNet's denoising loop, after the pipeline loaded.
The same script worked the week before, when the node was empty.

An expert: the memory is another user's process: ask Slurm for a GPU (--gres=gpu:1, so the job waits
for a node whose card is free) -- i.e. stop sharing the card with the other process (and the admins
should set ConstrainDevices=yes).
Wrong first advice: a smaller decode chunk or batch, fp8/quantization, CPU offload, a bigger GPU (it
is a 48 GB card, and the job needs 18.4 GiB), empty_cache or expandable_segments (this process's cache is
small), "memory outside the framework" in this process (it is another process), or fewer workers of
this job (there is one).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30


def weights(n_bytes):
    return torch.nn.Parameter(torch.empty(n_bytes // 2, dtype=torch.float16, device="cuda"), requires_grad=False)


class UNetSpatioTemporalConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "block_%d" % i, torch.nn.Module())
            getattr(self, "block_%d" % i).weight = weights(250 * MiB)

    def forward(self, latents, frames):
        # classifier-free guidance doubles the batch; temporal + spatial attention over 25 frames
        acts = []
        for i in range(12):
            acts.append(torch.empty(frames * 2 * 600 * MiB // 25, device="cuda"))
        out = torch.empty(latents.nbytes, device="cuda")
        del acts
        return out


class AutoencoderKLTemporalDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = weights(190 * MiB)

    def decode(self, latents, num_frames, decode_chunk_size=8):
        frames = []
        for start in range(0, num_frames, decode_chunk_size):
            work = torch.empty(decode_chunk_size * 330 * MiB, device="cuda")
            frames.append(torch.empty(decode_chunk_size * 1024 * 576 * 3 * 2, device="cuda"))
            del work
        return frames


class CLIPVisionModelWithProjection(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = weights(1210 * MiB)


class StableVideoDiffusionPipeline(object):
    def __init__(self):
        self.unet = UNetSpatioTemporalConditionModel()
        self.vae = AutoencoderKLTemporalDecoder()
        self.image_encoder = CLIPVisionModelWithProjection()

    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None, variant=None):
        return cls()

    def to(self, device):
        return self

    def __call__(self, image, num_frames=25, decode_chunk_size=8, num_inference_steps=25):
        with torch.inference_mode():
            latents = torch.empty(num_frames * 4 * 72 * 128 * 2 * 2, device="cuda")
            for step in range(num_inference_steps):
                latents = self.unet(latents, num_frames)
            return self.vae.decode(latents, num_frames, decode_chunk_size)


pipe = StableVideoDiffusionPipeline.from_pretrained("stabilityai/stable-video-diffusion-img2vid-xt",
                                                    torch_dtype=torch.float16, variant="fp16").to("cuda")
try:
    for photo in ["sku-10021.png", "sku-10022.png", "sku-10023.png"]:
        frames = pipe(photo, num_frames=25, decode_chunk_size=8)
        print("rendered", photo, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / GiB))
        del frames
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
