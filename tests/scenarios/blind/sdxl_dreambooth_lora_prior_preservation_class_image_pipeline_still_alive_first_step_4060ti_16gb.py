"""train_lora_sdxl.py -- a hobbyist's DreamBooth LoRA of SDXL (their dog) on an RTX 4060 Ti 16GB,
written from diffusers' train_dreambooth_lora_sdxl.py and a blog post: fp16 weights, LoRA rank 16 on
the UNet's attention, gradient checkpointing, 8-bit AdamW (bitsandbytes), batch 1 at 1024 px, and
prior preservation -- so the script first makes 50 class images ("a photo of a dog") with the base
model, then trains on instance + class image pairs.  The official script does the class images in a
block that ends with `del pipeline; torch.cuda.empty_cache()`.  The rewrite kept the generation at
module level and dropped that line as clutter:

    if args.with_prior_preservation and len(os.listdir(class_dir)) < args.num_class_images:
        pipe = StableDiffusionXLPipeline.from_pretrained(BASE, torch_dtype=torch.float16).to("cuda")
        for i in range(missing):
            pipe(args.class_prompt, num_inference_steps=25).images[0].save(...)

    unet = UNet2DConditionModel.from_pretrained(BASE, subfolder="unet")
    ...
    unet.to("cuda", dtype=torch.float16); text_encoder_one.to(...); vae.to("cuda", dtype=torch.float32)

`pipe` is a module-level name: the pipeline's UNet, two text encoders and VAE (6.5 GiB in fp16) stay on
the card through training, beside the training copies of the same weights loaded from the same
checkpoint (6.7 GiB: UNet and text encoders in fp16, the VAE in fp32 because SDXL's VAE overflows in
fp16).  Class-image generation finishes (40 minutes); model loading, LoRA and the optimizer fit; the
first training step fails in vae.encode of the instance + class pair at 1024 px in fp32 (Tried to
allocate 1 GiB: the encoder's third full-resolution feature map), with 13.1 GiB of weights resident
on a 16 GiB card.  Without the pipeline the step peaks at under 10 GiB.

An expert: a Python object holds a second copy of the model -- the class-image pipeline is still
referenced by `pipe`.  `del pipe; gc.collect(); torch.cuda.empty_cache()` before loading the training
models (or generate the class images in a separate run, or build the training models from the
pipeline's own components: they are the same frozen fp16 weights).  Wrong first advice: gradient
checkpointing, 8-bit Adam, fp16 mixed precision, LoRA, batch size 1 (all already used), empty_cache
alone (the pipeline is live), expandable_segments, quantization, a bigger GPU, and inference_mode /
no_grad around vae.encode (the VAE is frozen: it builds no graph, the memory is its feature maps).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

fp16, f32 = torch.float16, torch.float32


def _weights(module, name, total_params, n_tensors, dtype, trainable=False):
    """A component's weights as n_tensors parameters (from_pretrained + .to(device, dtype))."""
    each = total_params // n_tensors
    for i in range(n_tensors):
        t = torch.empty(each, dtype=dtype, device="cuda")
        setattr(module, "%s_%d" % (name, i), torch.nn.Parameter(t, requires_grad=trainable))


# ----------------------------------------------------------------------------------------------
# diffusers / transformers / bitsandbytes, as far as memory goes (the stand-in computes no values;
# every tensor is the size PyTorch's would be)
class UNet2DConditionModel(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        _weights(self, "w", 2_567_000_000, 64, dtype)
        self.lora = []

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def add_adapter(self, rank=16):
        for i in range(40):                                   # to_q/k/v/out.0 LoRA A and B, fp32, trainable
            p = torch.nn.Parameter(torch.empty(rank * 29_000, dtype=f32, device="cuda"))
            setattr(self, "lora_%d" % i, p)
            self.lora.append(p)

    def forward(self, latents, batch, side, checkpointing=True):
        """128x128 latents; with gradient checkpointing only each block's input is saved."""
        lat = side // 8
        saved = [torch.empty(batch * 320 * lat * lat, dtype=fp16, device="cuda") for _ in range(12)]
        for _ in range(3):
            tmp = torch.empty(batch * 5120 * (lat // 2) ** 2, dtype=fp16, device="cuda")   # GEGLU at 64x64
            del tmp
        out = torch.empty(batch * 4 * lat * lat, dtype=fp16, device="cuda")
        out._saved = saved
        return torch._derive(out, *self.lora)

    def denoise_step(self, batch, side):
        lat = side // 8
        for ch, res in ((320, lat), (640, lat // 2), (1280, lat // 4), (5120, lat // 2), (10240, lat // 4)):
            tmp = torch.empty(batch * ch * res * res, dtype=fp16, device="cuda")
            del tmp
        return torch.empty(batch * 4 * lat * lat, dtype=fp16, device="cuda")


class CLIPTextModel(torch.nn.Module):
    def __init__(self, params, dtype):
        torch.nn.Module.__init__(self)
        _weights(self, "w", params, 16, dtype)

    def forward(self, batch):
        return torch.empty(batch * 77 * 2048, dtype=fp16, device="cuda")


class DiagonalGaussianDistribution(object):
    def __init__(self, moments):
        self.moments = moments

    def sample(self):
        return torch.empty(self.moments.nbytes // 2, dtype=torch.uint8, device="cuda")


class EncoderOutput(object):
    def __init__(self, moments):
        self.latent_dist = DiagonalGaussianDistribution(moments)


class AutoencoderKL(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.dtype = dtype
        _weights(self, "w", 83_650_000, 8, dtype)

    def _fm(self, batch, ch, side):
        return torch.empty(batch * ch * side * side, dtype=self.dtype, device="cuda")

    def encode(self, pixel_values):
        """Encoder: conv_in and the first down block at full resolution (128 channels), then 1/2, 1/4, 1/8."""
        b, side = pixel_values["batch"], pixel_values["side"]
        h = self._fm(b, 128, side)                            # conv_in
        r = self._fm(b, 128, side)                            # resnet: norm + silu + conv
        t = self._fm(b, 128, side)
        del h, r
        h = self._fm(b, 128, side // 2)                       # downsample
        del t
        h = self._fm(b, 256, side // 2)
        h = self._fm(b, 512, side // 4)
        h = self._fm(b, 512, side // 8)
        moments = self._fm(b, 8, side // 8)
        del h
        return EncoderOutput(moments)

    def decode(self, latents, batch, side):
        """Decoder (the pipeline upcasts it to fp32 for SDXL: force_upcast)."""
        h = torch.empty(batch * 512 * (side // 4) ** 2, dtype=f32, device="cuda")
        u = torch.empty(batch * 256 * (side // 2) ** 2, dtype=f32, device="cuda")
        del h
        h = torch.empty(batch * 256 * side * side, dtype=f32, device="cuda")
        o = torch.empty(batch * 128 * side * side, dtype=f32, device="cuda")
        del u, h
        img = torch.empty(batch * 3 * side * side, dtype=f32, device="cuda")
        del o
        return img


class StableDiffusionXLPipeline(object):
    def __init__(self, torch_dtype):
        self.unet = UNet2DConditionModel(torch_dtype)
        self.text_encoder = CLIPTextModel(123_000_000, torch_dtype)
        self.text_encoder_2 = CLIPTextModel(695_000_000, torch_dtype)
        self.vae = AutoencoderKL(torch_dtype)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=f32):
        return cls(torch_dtype)

    def to(self, device):
        return self

    def __call__(self, prompt, num_inference_steps=25, height=1024, width=1024):
        with torch.no_grad():                                 # diffusers pipelines run under no_grad
            emb = self.text_encoder_2(2)
            latents = torch.empty(4 * 128 * 128, dtype=fp16, device="cuda")
            for _ in range(num_inference_steps):
                latents = self.unet.denoise_step(2, height)   # classifier-free guidance: batch 2
            image = self.vae.decode(latents, 1, height)
            del emb, latents
        return {"images": [image.nbytes]}


class AdamW8bit(torch.optim.Optimizer):
    """bitsandbytes.optim.AdamW8bit: two uint8 states per parameter plus blockwise absmax."""

    def __init__(self, params, lr=1e-4):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr))

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                n = p.nbytes // 4
                self.state[p] = {"state1": torch.empty(n, dtype=torch.uint8, device="cuda"),
                                 "state2": torch.empty(n, dtype=torch.uint8, device="cuda")}


# ----------------------------------------------------------------------------------------------
# train_lora_sdxl.py
BASE = "stabilityai/stable-diffusion-xl-base-1.0"
RES, NUM_CLASS_IMAGES, CLASS_PROMPT = 1024, 50, "a photo of a dog"

try:
    # 1. prior preservation: class images
    existing = 0
    if existing < NUM_CLASS_IMAGES:
        pipe = StableDiffusionXLPipeline.from_pretrained(BASE, torch_dtype=fp16).to("cuda")
        for i in range(existing, NUM_CLASS_IMAGES):
            image = pipe(CLASS_PROMPT, num_inference_steps=25)["images"][0]
        print("class images: %d written, %.1f GiB allocated" % (NUM_CLASS_IMAGES, torch.cuda.memory_allocated() / 2.0 ** 30))

    # 2. the models to train
    text_encoder_one = CLIPTextModel(123_000_000, fp16)
    text_encoder_two = CLIPTextModel(695_000_000, fp16)
    vae = AutoencoderKL(f32)                                  # SDXL's VAE overflows in fp16: kept in fp32
    unet = UNet2DConditionModel(fp16)
    unet.add_adapter(rank=16)
    unet.enable_gradient_checkpointing()
    optimizer = AdamW8bit(unet.lora, lr=1e-4)
    print("models loaded: %.1f GiB allocated" % (torch.cuda.memory_allocated() / 2.0 ** 30))

    # 3. training: instance + class image per step (prior preservation), 1024 px
    unet.train()
    for step in range(400):
        pixel_values = {"batch": 2, "side": RES}
        model_input = vae.encode(pixel_values).latent_dist.sample()
        prompt_embeds = text_encoder_two(2)
        with torch.autocast("cuda", dtype=fp16):
            model_pred = unet(model_input, 2, RES)
        loss = torch.empty(4, dtype=f32, device="cuda")
        loss = torch._derive(loss, model_pred)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        del model_pred, loss, model_input, prompt_embeds
        if step % 50 == 0:
            print("step %d: loss ok, %.1f GiB allocated" % (step, torch.cuda.memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
