"""make_clips.py -- short product clips from still photos with Stable Video Diffusion XT (image-to-video,
25 frames at 1024x576, fp16) on a 16 GiB RTX A4000, run with plain `LD_PRELOAD=liboomguard.so`:

    pipe = StableVideoDiffusionPipeline.from_pretrained("stable-video-diffusion-img2vid-xt",
                                                        torch_dtype=torch.float16).to("cuda")
    for photo in photos:
        frames = pipe(photo, num_frames=25, num_inference_steps=25).frames[0]    # decode_chunk_size unset
        export_to_video(frames, out_path(photo), fps=7)

The UNet (2.9 GiB), the CLIP image encoder (1.2 GiB) and the 25 denoising steps fit with room to spare.
With decode_chunk_size unset the pipeline hands all 25 frames' latents to the VAE's temporal decoder at
once: its third up block upsamples 25 frames x 256 channels to 576 x 1024 (7 GiB in fp16) while the
block's input (3.5 GiB, still held by the decoder's loop) and its resnet output (1.76 GiB) are alive,
and the convolution right after it would need another 7 GiB; after the allocator gives back the
UNet's cached activations the card has 6 GiB left.  The job dies on the first photo, in the decoder, after the
denoising finished.

An expert: decode the frames in chunks -- decode_chunk_size=4 or 8 (the decoder's peak shrinks in
proportion; the video is the same), i.e. split the oversized operation.  Not a smaller batch of photos
(it is one), not mixed precision (fp16 already), not inference_mode (the pipeline runs under
no_grad), not a cache or fragmentation problem; offloading the UNet and the
image encoder during decoding would get past the upsampling but not the convolution after it.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

FRAMES = 25
LAT_H, LAT_W = 72, 128


def act(frames, channels, h, w):
    """An fp16 activation of frames x channels x h x w."""
    return torch.empty(frames * channels * h * w, dtype=torch.float16, device="cuda")


class UNetSpatioTemporalConditionModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(1524 * MiB, dtype=torch.float16, device="cuda"))

    def forward(self, latents, t, image_embeddings):
        tmp1 = act(FRAMES * 2, 320, LAT_H, LAT_W)          # classifier-free guidance: 2 x 25 frames
        tmp2 = act(FRAMES * 2, 640, LAT_H // 2, LAT_W // 2)
        out = torch.empty(latents.nbytes * 2, device="cuda")
        del tmp1, tmp2
        return out


class CLIPVisionModelWithProjection(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(632 * MiB, dtype=torch.float16, device="cuda"))

    def forward(self, image):
        return torch.empty(2 * 1024 * 2, device="cuda")


class SpatioTemporalResBlock(torch.nn.Module):
    def __init__(self, cin, cout):
        torch.nn.Module.__init__(self)
        self.cin, self.cout = cin, cout
        self.weight = torch.nn.Parameter(torch.empty(cin * cout * 9 * 2 + cout * cout * 9, dtype=torch.float16,
                                                     device="cuda"))

    def forward(self, x, h, w):
        spatial = act(FRAMES, self.cout, h, w)
        temporal = act(FRAMES, self.cout, h, w)
        mixed = act(FRAMES, self.cout, h, w)
        del spatial, temporal
        return mixed


class Upsample2D(torch.nn.Module):
    def __init__(self, channels):
        torch.nn.Module.__init__(self)
        self.channels = channels
        self.conv = torch.nn.Parameter(torch.empty(channels * channels * 9, dtype=torch.float16, device="cuda"))

    def forward(self, hidden_states, h, w):
        upsampled = act(FRAMES, self.channels, h * 2, w * 2)      # F.interpolate(scale_factor=2.0, mode="nearest")
        out = act(FRAMES, self.channels, h * 2, w * 2)            # self.conv(upsampled)
        return out


class UpBlockTemporalDecoder(torch.nn.Module):
    def __init__(self, cin, cout, upsample):
        torch.nn.Module.__init__(self)
        self.cout = cout
        self.resnets = SpatioTemporalResBlock(cin, cout)
        self.upsamplers = Upsample2D(cout) if upsample else None

    def forward(self, hidden_states, h, w):
        hidden_states = self.resnets(hidden_states, h, w)
        if self.upsamplers is not None:
            hidden_states = self.upsamplers(hidden_states, h, w)
        return hidden_states


class TemporalDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.up_blocks = [UpBlockTemporalDecoder(512, 512, True), UpBlockTemporalDecoder(512, 512, True),
                          UpBlockTemporalDecoder(512, 256, True), UpBlockTemporalDecoder(256, 128, False)]
        for i, b in enumerate(self.up_blocks):
            setattr(self, "up_%d" % i, b)

    def forward(self, z, num_frames):
        sample = act(num_frames, 512, LAT_H, LAT_W)               # conv_in + mid block
        h, w = LAT_H, LAT_W
        for block in self.up_blocks:
            sample = block(sample, h, w)
            if block.upsamplers is not None:
                h, w = h * 2, w * 2
        return act(num_frames, 3, h, w)


class AutoencoderKLTemporalDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.decoder = TemporalDecoder()

    def decode(self, z, num_frames):
        return self.decoder(z, num_frames)


class StableVideoDiffusionPipeline(object):
    def __init__(self):
        self.image_encoder = CLIPVisionModelWithProjection()
        self.unet = UNetSpatioTemporalConditionModel()
        self.vae = AutoencoderKLTemporalDecoder()

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def to(self, device):
        return self

    def decode_latents(self, latents, num_frames, decode_chunk_size=None):
        decode_chunk_size = decode_chunk_size or num_frames
        frames = []
        for i in range(0, num_frames, decode_chunk_size):
            n = min(decode_chunk_size, num_frames - i)
            frames.append(self.vae.decode(latents, n))
        return frames

    def __call__(self, image, num_frames=25, num_inference_steps=25, decode_chunk_size=None):
        with torch.no_grad():
            image_embeddings = self.image_encoder(image)
            latents = act(num_frames, 4, LAT_H, LAT_W)
            for t in range(num_inference_steps):
                noise_pred = self.unet(latents, t, image_embeddings)
                latents = act(num_frames, 4, LAT_H, LAT_W)
                del noise_pred
            return self.decode_latents(latents, num_frames, decode_chunk_size)


def main():
    pipe = StableVideoDiffusionPipeline.from_pretrained("stabilityai/stable-video-diffusion-img2vid-xt",
                                                        torch_dtype=torch.float16).to("cuda")
    photos = ["sku-%05d.jpg" % i for i in range(300)]
    for photo in photos:
        frames = pipe(photo, num_frames=25, num_inference_steps=25)
        del frames


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
