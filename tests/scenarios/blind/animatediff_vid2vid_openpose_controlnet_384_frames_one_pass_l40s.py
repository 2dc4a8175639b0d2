"""restyle_dance.py -- a video creator restyles a 24-second vertical dance clip (16 fps, 384 frames, 576x1024)
into anime with AnimateDiff video-to-video plus an OpenPose ControlNet, in diffusers, on a rented L40S
(48 GB).  Everything in fp16:

    adapter = MotionAdapter.from_pretrained("guoyww/animatediff-motion-adapter-v1-5-3", torch_dtype=torch.float16)
    controlnet = ControlNetModel.from_pretrained("lllyasviel/control_v11p_sd15_openpose", torch_dtype=torch.float16)
    pipe = AnimateDiffVideoToVideoControlNetPipeline.from_pretrained(
        "stablediffusionapi/counterfeit-v30", motion_adapter=adapter, controlnet=controlnet,
        torch_dtype=torch.float16).to("cuda")
    frames = load_video("dance_vertical.mp4")                      # 384 PIL frames, 576x1024
    poses = [openpose(f) for f in frames]
    out = pipe(video=frames, conditioning_frames=poses, prompt=..., negative_prompt=...,
               strength=0.6, num_inference_steps=25, guidance_scale=7.5, decode_chunk_size=16).frames[0]

A 2-second test (32 frames) ran in 40 s.  The full clip dies at the first denoising step.  The weights are
3.5 GiB; the VAE encodes the video 16 frames at a time (decode_chunk_size), so that part goes through.  But
the UNet, its motion modules and the ControlNet get all 384 frames at once, doubled for classifier-free
guidance: every call is a batch of 768 frames.  The ControlNet's conditioning embedding runs at full pixel
resolution: its first 16-channel feature map is 768 x 16 x 1024 x 576 x 2 B = 13.5 GiB, and with the
SiLU after it and the next conv there are three of them: the third does not fit in the ~9.6 GiB left.  Past
that point the UNet's own skip connections alone would be ~14 GiB at the top level for this batch.

An expert: the work scales with the number of frames processed in one call; AnimateDiff's motion modules
were trained on 16-frame windows anyway.  Run the clip in overlapping context windows (16 frames, stride
4-8: AnimateDiff-Evolved's context options in ComfyUI; in diffusers FreeNoise, pipe.enable_free_noise(...)
with enable_free_noise_split_inference(), or a window loop of your own), or generate the clip in
segments.  Wrong first advice: quantization or CPU offload of the models (3.5 GiB of weights), fp16/autocast
(already fp16), inference_mode (the pipeline already runs under no_grad), a smaller batch with gradient
accumulation (there is no training; the "batch" is the frame count), flash attention (attention already
uses SDPA; the failing allocation is a convolution), expandable_segments / empty_cache, and a bigger GPU:
a single pass over 768 frames needs well over 80 GB.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
HALF = torch.float16


def no_grad_call(fn):
    """@torch.no_grad(), as diffusers decorates the pipelines' __call__."""
    def decorate_context(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return decorate_context


def _fp16(n_elems):
    return torch.empty(int(n_elems), dtype=HALF, device="cuda")


def _weights(module, n_params, n_tensors=8):
    for i in range(n_tensors):
        setattr(module, "weight_%d" % i, nn.Parameter(_fp16(n_params // n_tensors), requires_grad=False))


class Conv2d(nn.Conv2d):
    """diffusers' LoRACompatibleConv-style nn.Conv2d subclass, in fp16 (the weights and outputs are half)."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0):
        nn.Conv2d.__init__(self, in_channels, out_channels, kernel_size, stride=stride, padding=padding)

    def forward(self, input):
        out = nn.Conv2d.forward(self, input)
        out._dtype = HALF
        return out


def silu(x):
    out = _fp16(x.nbytes // 2)
    return out


# ---------------------------------------------------------------- diffusers models, as far as memory goes
class ControlNetConditioningEmbedding(nn.Module):
    """conv_in 3->16 at full pixel resolution, blocks 16->16, 16->32 (/2), 32->32, 32->96 (/2), 96->96,
    96->256 (/2), conv_out 256->320: the control image brought to latent resolution."""

    def __init__(self):
        nn.Module.__init__(self)
        self.conv_in = Conv2d(3, 16, 3, padding=1)
        chans = [(16, 16, 1), (16, 32, 2), (32, 32, 1), (32, 96, 2), (96, 96, 1), (96, 256, 2)]
        self.n_blocks = len(chans)
        for i, (a, b, s) in enumerate(chans):
            setattr(self, "blocks_%d" % i, Conv2d(a, b, 3, stride=s, padding=1))
        self.conv_out = Conv2d(256, 320, 3, padding=1)

    def forward(self, conditioning):
        embedding = self.conv_in(conditioning)
        embedding = silu(embedding)
        for i in range(self.n_blocks):
            nxt = getattr(self, "blocks_%d" % i)(embedding)
            embedding = silu(nxt)
            del nxt
        return self.conv_out(embedding)


class ControlNetModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.controlnet_cond_embedding = ControlNetConditioningEmbedding()
        _weights(self, 361_278_400)

    def forward(self, sample, timestep, encoder_hidden_states, controlnet_cond, conditioning_scale=1.0):
        frames = controlnet_cond.frames
        cond = self.controlnet_cond_embedding(controlnet_cond)
        h = _fp16(frames * 320 * LATENT_TOKENS)                    # conv_in(sample) + cond
        del cond
        down_block_res_samples = []
        for level, ch in enumerate((320, 640, 1280, 1280)):
            for j in range(3 if level < 3 else 2):
                down_block_res_samples.append(_fp16(frames * ch * (LATENT_TOKENS >> (2 * level))))
        mid_block_res_sample = _fp16(frames * 1280 * (LATENT_TOKENS >> 6))
        return down_block_res_samples, mid_block_res_sample


class MotionAdapter(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 453_200_000)


class UNetMotionModel(nn.Module):
    def __init__(self, motion_adapter):
        nn.Module.__init__(self)
        _weights(self, 859_520_964, 16)
        self.motion_adapter = motion_adapter

    def forward(self, sample, timestep, encoder_hidden_states, down_block_additional_residuals=None,
                mid_block_additional_residual=None):
        frames = sample.frames
        skips = []
        for level, ch in enumerate((320, 640, 1280, 1280)):
            for j in range(3 if level < 3 else 2):
                skips.append(_fp16(frames * ch * (LATENT_TOKENS >> (2 * level))))
        return _fp16(frames * 4 * LATENT_TOKENS)


class CLIPTextModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 123_060_480, 4)


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 83_653_863, 4)

    def encode(self, frames_chunk, n):
        # encoder maps at full resolution, 128 channels, for this chunk of frames (freed at return)
        a = _fp16(n * 128 * PIXELS)
        b = _fp16(n * 128 * PIXELS)
        del a
        c = _fp16(n * 128 * PIXELS)
        del b, c
        return _fp16(n * 4 * LATENT_TOKENS)


# ---------------------------------------------------------------- the pipeline
class AnimateDiffVideoToVideoControlNetPipeline(object):
    def __init__(self, vae, text_encoder, unet, controlnet):
        self.vae, self.text_encoder, self.unet, self.controlnet = vae, text_encoder, unet, controlnet

    def preprocess_video(self, frames):
        video = _fp16(len(frames) * 3 * PIXELS)
        video.frames = len(frames)
        return video

    def encode_video(self, video, decode_chunk_size=16):
        latents = []
        for i in range(0, video.frames, decode_chunk_size):
            n = min(decode_chunk_size, video.frames - i)
            latents.append(self.vae.encode(video, n))
        out = _fp16(video.frames * 4 * LATENT_TOKENS)                # torch.cat(latents)
        del latents
        out.frames = video.frames
        return out

    def prepare_control_video(self, conditioning_frames, do_classifier_free_guidance):
        n = len(conditioning_frames)
        video = _fp16(n * 3 * PIXELS)
        if do_classifier_free_guidance:
            doubled = _fp16(2 * n * 3 * PIXELS)                      # torch.cat([video] * 2)
            del video
            video = doubled
        video.frames = 2 * n if do_classifier_free_guidance else n
        return video

    @no_grad_call
    def __call__(self, video, conditioning_frames, prompt, negative_prompt=None, strength=0.6,
                 num_inference_steps=25, guidance_scale=7.5, decode_chunk_size=16):
        do_cfg = guidance_scale > 1.0
        prompt_embeds = _fp16(2 * 77 * 768)
        video_tensor = self.preprocess_video(video)
        init_latents = self.encode_video(video_tensor, decode_chunk_size)
        latents = _fp16(init_latents.nbytes // 2)                   # scheduler.add_noise at the start step
        latents.frames = init_latents.frames
        del init_latents
        conditioning = self.prepare_control_video(conditioning_frames, do_cfg)
        start = int(num_inference_steps * (1 - strength))
        for i in range(start, num_inference_steps):
            latent_model_input = _fp16(2 * latents.nbytes // 2)       # torch.cat([latents] * 2)
            latent_model_input.frames = 2 * latents.frames
            down_res, mid_res = self.controlnet(latent_model_input, i, prompt_embeds, conditioning)
            noise_pred = self.unet(latent_model_input, i, prompt_embeds, down_res, mid_res)
            del down_res, mid_res, latent_model_input
            latents = _fp16(latents.nbytes // 2)
            latents.frames = video_tensor.frames
            del noise_pred
            print("step %d/%d" % (i + 1 - start, num_inference_steps - start), flush=True)
        return latents


# ---------------------------------------------------------------- the user's script
WIDTH, HEIGHT = 576, 1024
PIXELS = WIDTH * HEIGHT
LATENT_TOKENS = (WIDTH // 8) * (HEIGHT // 8)


def load_video(path, n_frames):
    return ["frame_%04d" % i for i in range(n_frames)]          # PIL images (host memory)


def main():
    adapter = MotionAdapter()
    controlnet = ControlNetModel()
    pipe = AnimateDiffVideoToVideoControlNetPipeline(AutoencoderKL(), CLIPTextModel(), UNetMotionModel(adapter),
                                                     controlnet)
    frames = load_video("dance_vertical.mp4", 384)
    poses = ["pose_%04d" % i for i in range(len(frames))]          # openpose(f) for each frame, host memory
    out = pipe(video=frames, conditioning_frames=poses,
               prompt="anime girl dancing, cel shading, detailed background, best quality",
               negative_prompt="lowres, bad anatomy, watermark",
               strength=0.6, num_inference_steps=25, guidance_scale=7.5, decode_chunk_size=16)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
