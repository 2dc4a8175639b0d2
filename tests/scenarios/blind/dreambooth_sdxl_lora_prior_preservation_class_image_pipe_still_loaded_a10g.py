"""train_dreambooth_sdxl.py -- a freelancer's DreamBooth LoRA for SDXL on a g5.xlarge (one A10G, 24 GB,
22 GiB usable).  The subject is a client's dog (5 instance photos); prior preservation needs 200 class
images of "a photo of a dog", so the script makes the missing ones first with the base model, then trains
a rank-16 LoRA on the UNet at 1024 px, fp16, batch 1 (an instance image and a class image per step,
concatenated, as prior preservation does).  It is condensed from the diffusers example by hand:

    pipe = StableDiffusionXLPipeline.from_pretrained(BASE, torch_dtype=torch.float16, variant="fp16").to("cuda")
    for i in range(0, missing, 4):
        for img in pipe(CLASS_PROMPT, num_images_per_prompt=4).images: img.save(...)

    text_encoder_one = CLIPTextModel.from_pretrained(BASE, subfolder="text_encoder", ...).to("cuda")
    ...
    unet = UNet2DConditionModel.from_pretrained(BASE, subfolder="unet", torch_dtype=torch.float16).to("cuda")
    unet.add_adapter(LoraConfig(r=16, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))

The example frees its class-image pipeline (`del pipeline; torch.cuda.empty_cache()`); the condensed
script dropped those lines with the rest of the example's bookkeeping, and `pipe` is a module-level name:
the whole SDXL pipeline (UNet 5.1 GB, both text encoders 1.6 GB, VAE: 6.6 GiB in fp16) stays on the GPU
for the whole training, beside the second copy of the same weights that the training loads.  Class-image
generation runs fine (no_grad, 20 minutes), the training's first step fails in the UNet's forward pass
(a feed-forward of the up blocks): 6.6 + 6.6 GiB of weights leave ~8.7 GiB for the 13 GiB of activations a
1024 px step of two images keeps without gradient checkpointing.  Without the stale pipeline the step
peaks at about 20 GiB and trains.

An expert: the first pipeline is dead weight held by the global `pipe`: free it before training
(`del pipe; gc.collect(); torch.cuda.empty_cache()`), or train the components of that pipeline
(pipe.unet, pipe.vae, pipe.text_encoder/_2) instead of loading them a second time; generating the class
images in their own run first is the same fix.  Gradient checkpointing would also make it fit but slows
every step to carry 6.6 GiB of nothing.  Wrong first advice: a smaller batch (it is 1; prior preservation
doubles it by design), mixed precision (already fp16), expandable_segments or a bare empty_cache (the
pipeline is referenced, nothing cached is in the way), quantization, an 8-bit optimizer or LoRA (the
trained parameters are a LoRA already: 25M), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# diffusers / transformers / peft, as far as memory goes (the stand-in torch has none of them): modules
# whose parameters are made on the GPU in the checkpoint's dtype, and forwards that allocate what the real
# ones allocate: transient tensors under no_grad, tensors saved for backward when a parameter in the pass
# requires grad (here: the LoRA weights).
# ---------------------------------------------------------------------------------------------------------
MiB = 1 << 20
F16 = torch.float16


class ModelMixin(torch.nn.Module):
    def _weights(self, n_params, n_tensors, dtype=F16):
        per = n_params // n_tensors
        for i in range(n_tensors):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(per, dtype=dtype, device="cuda"),
                                                        requires_grad=False))

    def _grad_on(self):
        return torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())


class SavedTensors(object):
    """What autograd keeps for backward: each saved tensor reachable from the pass's output (a chain,
    freed by backward); None under no_grad (each temporary is freed when the next layer runs)."""

    def __init__(self):
        self.last = None

    def append(self, t):
        t._saved = self.last
        self.last = t


class LoRALayer(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.lora_A = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        return x                      # x + B(A(x)) * scale: its outputs are tiny (rank 16)


class BasicTransformerBlock(ModelMixin):
    """self-attention, cross-attention on the text embeddings, GEGLU feed-forward"""

    def __init__(self, dim):
        ModelMixin.__init__(self)
        self.dim = dim
        self._weights(18 * dim * dim + 2 * 2048 * dim, 2)

    def forward(self, hidden, tokens, keep):
        d = self.dim
        lora = getattr(self, "lora", None)
        n = lora(hidden) if lora is not None else hidden
        # norm1, q k v, attention out (SDPA: out + logsumexp), to_out, norm2, cross q/out, norm3: ~14 of d
        for _ in range(14):
            t = torch.empty(tokens * d, dtype=F16, device="cuda")
            if keep is not None:
                keep.append(t)
        for width in (8 * d, 4 * d, 4 * d):          # GEGLU proj, gelu(gate), gate * value
            t = torch.empty(tokens * width, dtype=F16, device="cuda")
            if keep is not None:
                keep.append(t)
        return n


class ResnetBlock2D(ModelMixin):
    def __init__(self, ch):
        ModelMixin.__init__(self)
        self.ch = ch
        self._weights(2 * 9 * ch * ch + 1280 * ch, 2)

    def forward(self, hidden, pixels, keep):
        for _ in range(8):                              # norm, silu, conv, temb add, norm, silu, conv, skip
            t = torch.empty(pixels * self.ch, dtype=F16, device="cuda")
            if keep is not None:
                keep.append(t)
        return hidden


class UNetBlock(ModelMixin):
    def __init__(self, ch, side, n_resnets, n_attn, layers_per_attn):
        ModelMixin.__init__(self)
        self.side = side
        self.resnets = [ResnetBlock2D(ch) for _ in range(n_resnets)]
        for i, r in enumerate(self.resnets):
            setattr(self, "resnet_%d" % i, r)
        self.blocks = [BasicTransformerBlock(ch) for _ in range(n_attn * layers_per_attn)]
        for i, b in enumerate(self.blocks):
            setattr(self, "transformer_%d" % i, b)

    def forward(self, hidden, batch, keep):
        pixels = batch * self.side * self.side
        for r in self.resnets:
            hidden = r(hidden, pixels, keep)
        for b in self.blocks:
            hidden = b(hidden, pixels, keep)
        return hidden


class UNet2DConditionOutput(object):
    def __init__(self, sample):
        self.sample = sample


class UNet2DConditionModel(ModelMixin):
    """SDXL's UNet: 2.57B parameters; 70 transformer layers at 64x64 and 32x32 latents (1024 px)."""

    def __init__(self):
        ModelMixin.__init__(self)
        self.down_blocks_0 = UNetBlock(320, 128, 2, 0, 0)
        self.down_blocks_1 = UNetBlock(640, 64, 2, 2, 2)
        self.down_blocks_2 = UNetBlock(1280, 32, 2, 2, 10)
        self.mid_block = UNetBlock(1280, 32, 2, 1, 10)
        self.up_blocks_0 = UNetBlock(1280, 32, 3, 3, 10)
        self.up_blocks_1 = UNetBlock(640, 64, 3, 3, 2)
        self.up_blocks_2 = UNetBlock(320, 128, 3, 0, 0)
        self._weights(110_000_000, 4)             # conv_in/out, time and add embeddings, norms

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None, variant=None):
        return cls()

    def add_adapter(self, config):
        """peft: a LoRA A/B pair on to_q, to_k, to_v, to_out.0 of every attention (r=16: 23M parameters,
        kept in float32 for training as the example does)."""
        for blk in (self.down_blocks_1, self.down_blocks_2, self.mid_block, self.up_blocks_0, self.up_blocks_1):
            for b in blk.blocks:
                b.lora = LoRALayer(2 * config.r * (6 * b.dim + 2 * 2048))

    def forward(self, sample, timestep, encoder_hidden_states, added_cond_kwargs=None):
        batch = sample.nbytes // (4 * 128 * 128 * 2)
        keep = SavedTensors() if self._grad_on() else None
        h = sample
        for blk in (self.down_blocks_0, self.down_blocks_1, self.down_blocks_2, self.mid_block,
                    self.up_blocks_0, self.up_blocks_1, self.up_blocks_2):
            h = blk(h, batch, keep)
        out = torch.empty(batch * 4 * 128 * 128, dtype=F16, device="cuda")
        out._saved = keep.last if keep is not None else None
        return UNet2DConditionOutput(out)


class AutoencoderKL(ModelMixin):
    def __init__(self):
        ModelMixin.__init__(self)
        self._weights(83_650_000, 4)

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None):
        return cls()

    def encode(self, pixel_values):
        batch = pixel_values.nbytes // (3 * 1024 * 1024 * 2)
        for ch in (128, 128, 256):                    # the encoder's first blocks at full resolution
            t = torch.empty(batch * 1024 * 1024 * ch, dtype=F16, device="cuda")
            del t
        return torch.empty(batch * 4 * 128 * 128, dtype=F16, device="cuda")

    def decode(self, latents):
        batch = latents.nbytes // (4 * 128 * 128 * 2)
        live = []
        for side, ch in ((256, 512), (512, 512), (1024, 256), (1024, 128)):
            live.append(torch.empty(batch * side * side * ch, dtype=F16, device="cuda"))
            if len(live) > 2:
                live.pop(0)
        return torch.empty(batch * 3 * 1024 * 1024, dtype=F16, device="cuda")


class CLIPTextModel(ModelMixin):
    N = 123_060_000

    def __init__(self):
        ModelMixin.__init__(self)
        self._weights(self.N, 4)

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None, variant=None):
        return cls()

    def forward(self, input_ids):
        return torch.empty(input_ids.nbytes // 8 * 2048, dtype=F16, device="cuda")


class CLIPTextModelWithProjection(CLIPTextModel):
    N = 694_660_000


class LoraConfig(object):
    def __init__(self, r, lora_alpha=None, init_lora_weights="gaussian", target_modules=()):
        self.r = r


class StableDiffusionXLPipeline(object):
    """diffusers' pipeline: a plain object (not a Module) holding its components."""

    def __init__(self, unet, vae, text_encoder, text_encoder_2):
        self.unet, self.vae, self.text_encoder, self.text_encoder_2 = unet, vae, text_encoder, text_encoder_2

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, variant=None):
        return cls(UNet2DConditionModel(), AutoencoderKL(), CLIPTextModel(), CLIPTextModelWithProjection())

    def to(self, device):
        return self

    def __call__(self, prompt, num_images_per_prompt=1, num_inference_steps=30, guidance_scale=5.0):
        with torch.no_grad():                                     # @torch.no_grad() in diffusers
            ids = torch.empty(2 * 77 * 8, device="cuda")
            cond = self.text_encoder_2(ids)
            latents = torch.empty(num_images_per_prompt * 4 * 128 * 128, dtype=F16, device="cuda")
            for _ in range(num_inference_steps // 30):            # (one step shown: each allocates alike)
                both = torch.empty(2 * latents.nbytes // 2, dtype=F16, device="cuda")   # CFG: cond + uncond
                noise = self.unet(both, 999, cond).sample
                del both, noise
            image = self.vae.decode(latents)
            del image, latents, cond, ids
        return ["<PIL.Image 1024x1024>"] * num_images_per_prompt


def load_images(paths):
    return torch.empty(len(paths) * 3 * 1024 * 1024, dtype=F16, device="cuda")


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
BASE = "stabilityai/stable-diffusion-xl-base-1.0"
CLASS_PROMPT = "a photo of a dog"
INSTANCE_PROMPT = "a photo of sks dog"
num_class_images = 200
have = 0                                # class_data/ was empty

try:
    # 1. class images for prior preservation
    if have < num_class_images:
        pipe = StableDiffusionXLPipeline.from_pretrained(BASE, torch_dtype=torch.float16, variant="fp16").to("cuda")
        for i in range(have, num_class_images, 4):
            images = pipe(CLASS_PROMPT, num_images_per_prompt=4, num_inference_steps=30)
        print("class images: %d generated, %.1f GiB allocated" % (num_class_images - have,
              torch.cuda.memory_allocated() / (1 << 30)))

    # 2. the models to train
    text_encoder_one = CLIPTextModel.from_pretrained(BASE, subfolder="text_encoder", torch_dtype=torch.float16)
    text_encoder_two = CLIPTextModelWithProjection.from_pretrained(BASE, subfolder="text_encoder_2",
                                                                   torch_dtype=torch.float16)
    vae = AutoencoderKL.from_pretrained("madebyollin/sdxl-vae-fp16-fix", torch_dtype=torch.float16)
    unet = UNet2DConditionModel.from_pretrained(BASE, subfolder="unet", torch_dtype=torch.float16)
    for m in (text_encoder_one, text_encoder_two, vae, unet):
        m.to("cuda")
    unet.add_adapter(LoraConfig(r=16, lora_alpha=16, target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    params_to_optimize = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params_to_optimize, lr=1e-4, weight_decay=1e-4)
    print("trainable: %.1fM parameters" % (sum(p.nbytes for p in params_to_optimize) / 4 / 1e6))

    # 3. train: each step one instance image and one class image, 1024 px
    prior_loss_weight = 1.0
    for step in range(800):
        pixel_values = load_images(["instance/%d.jpg" % (step % 5), "class_data/%d.png" % step])
        with torch.no_grad():
            model_input = vae.encode(pixel_values)
            ids = torch.empty(2 * 77 * 8, device="cuda")
            prompt_embeds = text_encoder_two(ids)
        noisy_model_input = torch.empty(model_input.nbytes // 2, dtype=F16, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            model_pred = unet(noisy_model_input, 500, prompt_embeds).sample
            loss = torch.nn.functional.nll_loss(model_pred, None)        # mse(instance) + prior mse(class)
        scen_truth.backward(loss)                                       # loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 50 == 0:
            print("step", step, "allocated %.1f GiB" % (torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
