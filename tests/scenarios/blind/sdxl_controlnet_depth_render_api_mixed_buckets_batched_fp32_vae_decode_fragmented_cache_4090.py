"""render_api.py -- an interior-design startup's render service: a user uploads a photo of a room and a
style prompt; the service estimates depth, runs SDXL 1.0 with the SDXL depth ControlNet and returns 1, 2
or 4 variations at the aspect ratio of the photo (snapped to SDXL's training buckets).  One RTX 4090 per
worker process, one pipeline loaded at start-up, requests served one after another:

    depth_estimator = DPTForDepthEstimation.from_pretrained("Intel/dpt-large").to("cuda")
    controlnet = ControlNetModel.from_pretrained("diffusers/controlnet-depth-sdxl-1.0",
                                                 variant="fp16", torch_dtype=torch.float16)
    pipe = StableDiffusionXLControlNetPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-base-1.0", controlnet=controlnet,
        variant="fp16", torch_dtype=torch.float16).to("cuda")

    @app.post("/render")
    def render(req: RenderRequest):
        width, height = snap_to_bucket(req.photo.size)          # 1024x1024, 1152x896, 1216x832, 1344x768 ...
        depth = get_depth_map(req.photo, width, height)          # DPT, normalised, 3 channels
        images = pipe(req.prompt, negative_prompt=NEGATIVE, image=depth,
                      controlnet_conditioning_scale=0.5, num_inference_steps=30, guidance_scale=6.5,
                      num_images_per_prompt=req.variations, width=width, height=height).images
        return [to_webp(im) for im in images]

The worker starts fine and serves the morning's traffic; the 38th request (1024x1024, 4 variations)
fails in the VAE decode, although request 23 had exactly that size and went through.  Nothing is kept
between requests (the images go back as WebP), but the decode is where the memory is: the fp16 SDXL VAE
overflows, so the pipeline calls `upcast_vae()` (its 84M parameters re-made in float32), decodes all
variations at once in float32 -- at 4 x 1024x1024 the upsampled 256-channel tensors are 4 GiB each --
and re-makes the fp16 parameters afterwards.  SDXL's buckets have almost, not exactly, the same number of
pixels (1024x1024: 16,384 latent pixels; 1152x896 and 1344x768: 16,128; 1216x832: 15,808), so each
decode is served from the blocks the previous ones left in the cache and splits them; while a decode
runs, its live tensors sit in split segments that the allocator cannot give back, and a new 4 GiB block
cannot be made.  The failing request asks for 4.00 GiB with 788 MiB free and 7.6 GiB reserved by PyTorch
but unallocated (15.1 GiB allocated, of which 10.0 GiB are weights: UNet 4.8, ControlNet 2.3, text
encoders 1.5, DPT-Large 1.3 in float32, VAE).

An expert: textbook fragmentation -- the weights (10 GiB) and the largest request fit (the same request
ran 15 requests earlier); the cache is full of holes. Start the worker with
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow and shrink in place instead of needing a
new contiguous 4 GiB); max_split_size_mb:512 is the older alternative. Worth doing as well: the fp16-fix
VAE (madebyollin/sdxl-vae-fp16-fix: no upcast, no re-made parameters, half the decode memory) and
pipe.enable_vae_slicing() (one image at a time). Wrong advice: a bigger GPU or quantizing/offloading the
UNet or ControlNet (the weights are not the problem), fewer steps, a smaller batch as the first answer (4
variations fit in a fresh process), gradient checkpointing or inference_mode (the pipeline runs under
no_grad), release_references (nothing is kept between requests), restarting the worker every N requests (a
workaround that hides it).
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
FP16, FP32 = torch.float16, torch.float32


class Weights(torch.nn.Module):
    """Some of a model's weights on the GPU; .to(dtype=...) re-makes each tensor in the new dtype in turn
    (Module._apply: the new tensor is made, then the parameter's old one released)."""

    def __init__(self, numels, dtype):
        torch.nn.Module.__init__(self)
        self.numels = list(numels)
        self.dtype = dtype
        for i, n in enumerate(self.numels):
            self._parameters["p%d" % i] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=DEVICE),
                                                             requires_grad=False)

    def to(self, device=None, dtype=None):
        if dtype is not None and dtype != self.dtype:
            for i, n in enumerate(self.numels):
                self._parameters["p%d" % i] = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=DEVICE),
                                                                 requires_grad=False)
            self.dtype = dtype
        return self


def repeat(*groups):
    out = []
    for n, size in groups:
        out += [size] * n
    return out


def new(n, dtype=FP16):
    return torch.empty(int(n), dtype=dtype, device=DEVICE)


class DPTForDepthEstimation(Weights):
    """Intel/dpt-large (ViT-L/16 backbone, 343M parameters), float32 as loaded."""

    def __init__(self):
        Weights.__init__(self, repeat((24, 12_596_224), (40, 600_000), (1, 13_000_000)), FP32)

    def __call__(self, pixel_values_384):
        tokens = new(577 * 1024 * 4, FP32)
        feats = new(4 * 256 * 192 * 192, FP32)
        depth = new(384 * 384, FP32)
        del tokens, feats
        return depth


class ControlNetModel(Weights):
    """diffusers/controlnet-depth-sdxl-1.0: SDXL's encoder half plus zero convolutions, 1.25B parameters
    (fp16: 2.33 GiB)."""

    def __init__(self):
        Weights.__init__(self, repeat((118, 6_553_600), (70, 2_621_440), (60, 1_638_400), (8, 14_745_600),
                                      (40, 409_600), (60, 921_600), (1500, 1280)), FP16)

    def __call__(self, B, h, w):
        """The down-block residuals (3 at each of the 1/1, 1/2 and 1/4 resolutions) and the mid-block
        residual, scaled by controlnet_conditioning_scale, handed to the UNet."""
        res = [new(B * 320 * h * w * 4), new(B * 640 * h * w), new(B * 1280 * h * w // 4 * 3)]
        ff = new(B * h * w // 4 * 5120 * 2)                      # its own attention / GEGLU work
        del ff
        return res


class UNet2DConditionModel(Weights):
    """SDXL 1.0's UNet, 2.57B parameters (fp16: 4.78 GiB)."""

    def __init__(self):
        Weights.__init__(self, repeat((6, 13_107_200), (131, 6_553_600), (140, 2_621_440), (140, 1_638_400),
                                      (70, 3_276_800), (22, 14_745_600), (12, 29_491_200), (26, 409_600),
                                      (60, 1_638_400), (14, 921_600), (3000, 1280)), FP16)

    def __call__(self, B, h, w, down_block_additional_residuals):
        skips = [new(B * 320 * h * w * 3), new(B * 640 * h * w // 4 * 3), new(B * 1280 * h * w // 16 * 3)]
        ff = new(B * h * w // 4 * 5120 * 2)                      # level-2 GEGLU projection
        del ff
        cat = new(B * 2 * 320 * h * w)                           # last up block: skip concatenation
        del cat
        noise_pred = new(B * 4 * h * w)
        del skips
        return noise_pred


def vae_layers():
    return repeat((18, 2_359_808), (8, 590_080), (12, 147_584), (4, 1_180_160), (1, 520_000))


class AutoencoderKL(Weights):
    """SDXL's VAE (force_upcast: the fp16 weights overflow in the decoder)."""

    class config(object):
        force_upcast = True
        scaling_factor = 0.13025

    def __init__(self):
        Weights.__init__(self, vae_layers(), FP16)

    def _resnet(self, x_elems, cin, cout):
        """A ResnetBlock2D as eager PyTorch runs it: norm1 -> silu -> conv1 -> norm2 -> silu -> conv2
        (+ a 1x1 shortcut when the channels change); each line one new tensor."""
        per = x_elems // cin
        h = new(per * cin, self.dtype)                          # norm1
        a = new(per * cin, self.dtype)                          # silu
        del h
        h = new(per * cout, self.dtype)                         # conv1
        del a
        a = new(per * cout, self.dtype)                         # norm2 + silu
        del h
        h = new(per * cout, self.dtype)                         # conv2
        del a
        if cin != cout:
            sc = new(per * cout, self.dtype)                    # conv_shortcut
            del sc
        return new(per * cout, self.dtype)                      # residual + h

    def decode(self, n, h, w):
        """Decoder on n latents of h x w: 512 channels at 1/8, up to 128 channels at full resolution."""
        x = new(n * 512 * h * w, self.dtype)                    # conv_in
        for _ in range(2):
            x = self._resnet(n * 512 * h * w, 512, 512)          # mid block (+ attention)
        for cin, cout, scale in ((512, 512, 1), (512, 512, 2), (512, 256, 4), (256, 128, 8)):
            elems = n * cin * h * w * scale * scale
            x = self._resnet(elems, cin, cout)
            for _ in range(2):
                x = self._resnet(n * cout * h * w * scale * scale, cout, cout)
            if scale < 8:
                up = new(n * cout * h * w * scale * scale * 4, self.dtype)    # upsample (nearest, 2x)
                x = new(n * cout * h * w * scale * scale * 4, self.dtype)     # upsampler conv
                del up
        y = new(n * 128 * h * w * 64, self.dtype)               # conv_norm_out + silu
        image = new(n * 3 * h * w * 64, self.dtype)             # conv_out
        del y, x
        return image


class StableDiffusionXLControlNetPipeline(object):
    vae_scale_factor = 8

    def __init__(self, controlnet, torch_dtype=FP16):
        self.text_encoder = Weights([49408 * 768, 77 * 768] + [7_087_872] * 12, FP16)
        self.text_encoder_2 = Weights([49408 * 1280, 77 * 1280] + [19_676_160] * 32 + [1280 * 1280], FP16)
        self.unet = UNet2DConditionModel()
        self.vae = AutoencoderKL()
        self.controlnet = controlnet

    @classmethod
    def from_pretrained(cls, name, controlnet=None, variant=None, torch_dtype=None):
        return cls(controlnet, torch_dtype)

    def to(self, device):
        return self

    def upcast_vae(self):
        self.vae.to(dtype=FP32)

    def __call__(self, prompt, negative_prompt=None, image=None, controlnet_conditioning_scale=1.0,
                 num_inference_steps=50, guidance_scale=5.0, num_images_per_prompt=1, width=1024, height=1024):
        with torch.no_grad():                                   # @torch.no_grad() on __call__
            n = num_images_per_prompt
            B = 2 * n if guidance_scale > 1.0 else n            # classifier-free guidance: uncond + cond
            h, w = height // self.vae_scale_factor, width // self.vae_scale_factor
            prompt_embeds = new(B * 77 * 2048)
            pooled = new(B * 1280)
            control_image = new(B * 3 * height * width)         # prepare_image: repeated per image, x2 for CFG
            latents = new(n * 4 * h * w)
            for t in range(num_inference_steps):
                latent_model_input = new(B * 4 * h * w)
                down_res = self.controlnet(B, h, w)
                noise_pred = self.unet(B, h, w, down_res)
                del down_res, latent_model_input
                guided = new(n * 4 * h * w)                     # uncond + scale * (cond - uncond)
                del noise_pred
                latents = new(n * 4 * h * w)                    # scheduler.step(...).prev_sample
                del guided
            del control_image, prompt_embeds, pooled
            needs_upcasting = self.vae.dtype == FP16 and self.vae.config.force_upcast
            if needs_upcasting:
                self.upcast_vae()
                latents = new(n * 4 * h * w, FP32)
            image = self.vae.decode(n, h, w)
            if needs_upcasting:
                self.vae.to(dtype=FP16)
            # image_processor.postprocess: to the CPU, PIL
            del image, latents
            return ["<PIL %dx%d>" % (width, height)] * n


BUCKETS = [(1024, 1024), (1152, 896), (896, 1152), (1216, 832), (832, 1216), (1344, 768), (768, 1344)]


def snap_to_bucket(size):
    w, h = size
    return min(BUCKETS, key=lambda b: abs(b[0] / float(b[1]) - w / float(h)))


def get_depth_map(depth_estimator, photo, width, height):
    with torch.no_grad():
        pixel_values = new(3 * 384 * 384, FP32)
        depth = depth_estimator(pixel_values)
        depth = new(3 * height * width, FP16)       # interpolate to (height, width), normalise, 3 channels
    return depth


class RenderRequest(object):
    def __init__(self, rid, prompt, size, variations):
        self.id, self.prompt, self.size, self.variations = rid, prompt, size, variations


def incoming_requests():
    """The morning's traffic: phone photos (4:3, 3:4), screenshots (16:9), square crops; 1, 2 or 4
    variations (4 only for the paid plan)."""
    rnd = random.Random(2)
    sizes = [(4032, 3024), (3024, 4032), (1920, 1080), (1080, 1920), (2048, 2048), (3000, 2000), (1600, 1200)]
    for i in range(400):
        yield RenderRequest("r%04d" % i, "scandinavian living room, oak floor, linen sofa, soft daylight",
                            rnd.choice(sizes), rnd.choice([1, 1, 2, 2, 4]))


NEGATIVE = "lowres, blurry, distorted furniture, text, watermark"


def main():
    depth_estimator = DPTForDepthEstimation()
    controlnet = ControlNetModel()
    pipe = StableDiffusionXLControlNetPipeline.from_pretrained(
        "stabilityai/stable-diffusion-xl-base-1.0", controlnet=controlnet, variant="fp16", torch_dtype=FP16).to("cuda")
    print("worker ready: %.2f GiB allocated" % (torch.cuda.memory_allocated() / 2.0 ** 30))
    for k, req in enumerate(incoming_requests()):
        width, height = snap_to_bucket(req.size)
        depth = get_depth_map(depth_estimator, req.size, width, height)
        images = pipe(req.prompt, negative_prompt=NEGATIVE, image=depth, controlnet_conditioning_scale=0.5,
                      num_inference_steps=30, guidance_scale=6.5, num_images_per_prompt=req.variations,
                      width=width, height=height)
        del depth
        st = torch.cuda.memory_stats()
        print("%s %dx%d x%d ok  allocated %.2f GiB reserved %.2f GiB" % (
            req.id, width, height, req.variations, st["allocated_bytes.all.current"] / 2.0 ** 30,
            st["reserved_bytes.all.current"] / 2.0 ** 30))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
