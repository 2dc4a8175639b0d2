"""draft_pickscore.py -- a research intern's reproduction of DRaFT (Direct Reward Fine-Tuning, Clark et al.
2023) on one A100-SXM4-40GB: Stable Diffusion 1.5 with a rank-8 LoRA on the UNet's attention, reward =
PickScore (a CLIP ViT-H/14 preference model, 986M parameters, fp16, frozen), 2 prompts per step,
50 DDIM steps with classifier-free guidance 7.5 (each UNet call runs 4 latents: 2 prompts x cond/uncond),
fp16 autocast.  The method needs the reward's gradient to reach the LoRA through the whole sampler, so the
sampling loop runs with autograd on -- on purpose:

    with torch.autocast("cuda", dtype=torch.float16):
        for t in scheduler.timesteps:                                   # 50
            noise_pred = unet(torch.cat([latents] * 2), t, encoder_hidden_states=emb).sample
            noise_uncond, noise_text = noise_pred.chunk(2)
            noise_pred = noise_uncond + 7.5 * (noise_text - noise_uncond)
            latents = scheduler.step(noise_pred, t, latents).prev_sample
        image = vae.decode(latents / 0.18215).sample
        reward = pickscore(image, prompts)
    (-reward.mean()).backward()

The paper backpropagates through the full chain only with gradient checkpointing around each UNet call,
and its cheap variant DRaFT-K only through the last K steps (the first 50-K under torch.no_grad).  The
intern wrote the plain version: every UNet call keeps its activations (~3.8 GiB for 4 latents at 64x64)
until the backward at the end, 50 calls would need ~190 GiB.  The weights are 3.8 GiB (UNet 1.6, text
encoder 0.2, VAE 0.2, PickScore 1.8); the first iteration dies in the UNet forward of denoising step 10.

An expert: this is training, not inference, though it looks like sampling: checkpoint each UNet call
(unet.enable_gradient_checkpointing() and unet.train(), or torch.utils.checkpoint around the call: 50 x
4 latents kept, one call's activations recomputed at a time) or truncate the backprop to the last K steps
(DRaFT-K, K=1 in the paper's best runs: ~4 GiB of UNet activations + the VAE decode's).  Wrong first
advice: "inference without autograd" for the whole loop (no reward gradient reaches the LoRA: the
method is gone -- though no_grad on the EARLY steps is exactly DRaFT-K), running the reward model under
no_grad (its input gradient is the signal), a smaller batch (one prompt still needs ~95 GiB), a bigger
GPU (no card holds 190 GiB), quantization, expandable_segments/empty_cache, releasing references (nothing
is kept by mistake: the graph is what the method differentiates).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# diffusers / transformers / peft and the few tensor operations the loop uses, as far as memory goes (the
# stand-in torch has no diffusers, and its Tensor no arithmetic): an operation makes a new tensor in its
# inputs' graph; a forward keeps what autograd saves when a parameter in the pass requires grad (the LoRA).
# ---------------------------------------------------------------------------------------------------------
F16 = torch.float16


def _graph(t):
    return isinstance(t, torch.Tensor) and bool(t._params or t.requires_grad)


def _op(a, b=None, nbytes=None):
    """a (op) b: a new tensor of a's size, in the graph of both; it keeps what backward needs of them"""
    out = torch.empty(a.nbytes if nbytes is None else nbytes, device="cuda")
    out._dtype = a.dtype
    if torch.is_grad_enabled() and (_graph(a) or _graph(b)):
        out._saved = b if _graph(b) else a
    return torch._derive(out, *[t for t in (a, b) if isinstance(t, torch.Tensor)])


def _cat(tensors, dim=0):
    return _op(tensors[0], nbytes=sum(t.nbytes for t in tensors))


def _randn(*shape, device=None, dtype=None):
    n = 1
    for s in shape:
        n *= s
    return torch.empty(n, dtype=dtype or torch.float32, device=device)


def _chunk(self, n, dim=0):
    return [self.view() for _ in range(n)]


torch.cat = getattr(torch, "cat", _cat)
torch.randn = getattr(torch, "randn", _randn)
torch.Tensor.chunk = _chunk
torch.Tensor.__add__ = _op
torch.Tensor.__sub__ = _op
torch.Tensor.__mul__ = _op
torch.Tensor.__rmul__ = _op
torch.Tensor.__truediv__ = _op
torch.Tensor.__neg__ = lambda a: _op(a)
torch.Tensor.mean = lambda a: _op(a, nbytes=512)


class SavedTensors(object):
    """What autograd keeps for backward: one chain from the call's input through every saved tensor."""

    def __init__(self, first):
        self.last = first

    def append(self, t):
        t._saved = self.last
        self.last = t


class ModelMixin(torch.nn.Module):
    def _weights(self, n_params, n_tensors, dtype=F16):
        per = n_params // n_tensors
        for i in range(n_tensors):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(per, dtype=dtype, device="cuda"),
                                                        requires_grad=False))

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self


class LoRALayer(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.lora_A = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        return x


class BasicTransformerBlock(ModelMixin):
    def __init__(self, dim):
        ModelMixin.__init__(self)
        self.dim = dim
        self._weights(18 * dim * dim + 2 * 768 * dim, 2)

    def forward(self, hidden, tokens, keep):
        lora = getattr(self, "lora", None)
        h = lora(hidden) if lora is not None else hidden
        # norms (fp32 under autocast), q k v, SDPA out + logsumexp, to_out, cross-attn q/out, GEGLU
        for width in [self.dim] * 14 + [2 * self.dim] * 2 + [8 * self.dim, 4 * self.dim, 4 * self.dim]:
            t = torch.empty(tokens * width, dtype=F16, device="cuda")
            if keep is not None:
                keep.append(t)
        return h


class ResnetBlock2D(ModelMixin):
    def __init__(self, ch):
        ModelMixin.__init__(self)
        self.ch = ch
        self._weights(18 * ch * ch + 1280 * ch, 2)

    def forward(self, hidden, pixels, keep):
        for _ in range(10):                  # group norms in fp32, silu, convs, temb, skip
            t = torch.empty(pixels * self.ch, dtype=F16, device="cuda")
            if keep is not None:
                keep.append(t)
        return hidden


class UNetBlock(ModelMixin):
    def __init__(self, ch, side, n_resnets, n_attn):
        ModelMixin.__init__(self)
        self.side = side
        self.resnets = [ResnetBlock2D(ch) for _ in range(n_resnets)]
        for i, r in enumerate(self.resnets):
            setattr(self, "resnet_%d" % i, r)
        self.attentions = [BasicTransformerBlock(ch) for _ in range(n_attn)]
        for i, b in enumerate(self.attentions):
            setattr(self, "attention_%d" % i, b)

    def forward(self, hidden, batch, keep):
        pixels = batch * self.side * self.side
        for i, r in enumerate(self.resnets):
            hidden = r(hidden, pixels, keep)
            if i < len(self.attentions):
                hidden = self.attentions[i](hidden, pixels, keep)
        return hidden


class UNet2DConditionOutput(object):
    def __init__(self, sample):
        self.sample = sample


class UNet2DConditionModel(ModelMixin):
    """SD 1.5's UNet: 860M parameters; attention at 64x64, 32x32, 16x16 and in the 8x8 mid block."""

    def __init__(self):
        ModelMixin.__init__(self)
        self.down_blocks = [UNetBlock(320, 64, 2, 2), UNetBlock(640, 32, 2, 2), UNetBlock(1280, 16, 2, 2),
                            UNetBlock(1280, 8, 2, 0)]
        self.mid_block = UNetBlock(1280, 8, 2, 1)
        self.up_blocks = [UNetBlock(1280, 8, 3, 0), UNetBlock(1280, 16, 3, 3), UNetBlock(640, 32, 3, 3),
                          UNetBlock(320, 64, 3, 3)]
        for i, b in enumerate(self.down_blocks):
            setattr(self, "down_%d" % i, b)
        for i, b in enumerate(self.up_blocks):
            setattr(self, "up_%d" % i, b)
        self._weights(190_000_000, 4)      # conv in/out, samplers, proj_in/out, time embedding

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None):
        return cls()

    def add_adapter(self, config):
        for blk in self.down_blocks + [self.mid_block] + self.up_blocks:
            for b in blk.attentions:
                b.lora = LoRALayer(2 * config.r * (6 * b.dim + 2 * 768))

    def forward(self, sample, timestep, encoder_hidden_states=None):
        batch = sample.nbytes // (4 * 64 * 64 * 2)
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        keep = SavedTensors(sample) if grad else None
        h = sample
        for blk in self.down_blocks + [self.mid_block] + self.up_blocks:
            h = blk(h, batch, keep)
        out = torch.empty(batch * 4 * 64 * 64, dtype=F16, device="cuda")
        out._saved = keep.last if keep is not None else None
        return UNet2DConditionOutput(out)


class AutoencoderKL(ModelMixin):
    def __init__(self):
        ModelMixin.__init__(self)
        self._weights(83_650_000, 4)
        self.config = type("Config", (), {"scaling_factor": 0.18215})()

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None):
        return cls()

    def decode(self, latents):
        batch = latents.nbytes // (4 * 64 * 64 * 2)
        x = latents
        for side, ch in ((64, 512), (128, 512), (256, 512), (512, 256), (512, 128)):
            for _ in range(8):
                x = _op(x, nbytes=batch * side * side * ch * 2)
        return UNet2DConditionOutput(_op(x, nbytes=batch * 3 * 512 * 512 * 2))


class CLIPTextModel(ModelMixin):
    def __init__(self):
        ModelMixin.__init__(self)
        self._weights(123_060_000, 4)

    @classmethod
    def from_pretrained(cls, path, subfolder=None, torch_dtype=None):
        return cls()

    def forward(self, input_ids):
        return (torch.empty(input_ids.nbytes // 8 * 768, dtype=F16, device="cuda"),)


class CLIPModel(ModelMixin):
    """PickScore_v1: CLIP ViT-H/14 (text 354M + vision 632M)."""

    def __init__(self):
        ModelMixin.__init__(self)
        self._weights(986_000_000, 8)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def get_image_features(self, pixel_values):
        x = pixel_values
        for _ in range(32):
            x = _op(x, nbytes=pixel_values.nbytes // (3 * 224 * 224) * 257 * 1280 * 2 * 6)
        return _op(x, nbytes=4096)


class DDIMScheduler(object):
    def __init__(self):
        self.timesteps = []

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def set_timesteps(self, n):
        self.timesteps = list(range(981, 0, -1000 // n))[:n]

    def step(self, noise_pred, t, latents):
        prev = latents * 0.5 + noise_pred * 0.5
        return type("DDIMSchedulerOutput", (), {"prev_sample": prev})()


class LoraConfig(object):
    def __init__(self, r, lora_alpha=None, target_modules=()):
        self.r = r


def tokenize(prompts):
    return torch.empty(len(prompts) * 77 * 8, device="cuda")


def pickscore_preprocess(image):
    """resize 512 -> 224 and normalize, differentiably (the method needs d reward / d image)"""
    return _op(image, nbytes=image.nbytes // (512 * 512) * 224 * 224)


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
SD = "runwayml/stable-diffusion-v1-5"
prompts_train = ["a watercolor of a fox in the snow", "a studio photo of a ceramic teapot",
                 "an astronaut riding a horse, oil painting", "a cozy cabin at dusk, 35mm photo"]
batch_size = 2
num_inference_steps = 50
guidance_scale = 7.5

unet = UNet2DConditionModel.from_pretrained(SD, subfolder="unet", torch_dtype=F16)
vae = AutoencoderKL.from_pretrained(SD, subfolder="vae", torch_dtype=F16)
text_encoder = CLIPTextModel.from_pretrained(SD, subfolder="text_encoder", torch_dtype=F16)
scheduler = DDIMScheduler.from_pretrained(SD, subfolder="scheduler")
pickscore = CLIPModel.from_pretrained("yuvalkirstain/PickScore_v1", torch_dtype=F16).eval().requires_grad_(False)
unet.add_adapter(LoraConfig(r=8, lora_alpha=8, target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
lora_params = [p for p in unet.parameters() if p.requires_grad]
optimizer = torch.optim.AdamW(lora_params, lr=1e-4)
print("weights %.1f GiB, LoRA %.1fM parameters" % (torch.cuda.memory_allocated() / (1 << 30),
                                                  sum(p.nbytes for p in lora_params) / 4e6))

with torch.no_grad():
    uncond = text_encoder(tokenize([""] * batch_size))[0]

try:
    for it in range(2000):
        prompts = [prompts_train[(2 * it + j) % len(prompts_train)] for j in range(batch_size)]
        with torch.no_grad():
            cond = text_encoder(tokenize(prompts))[0]
        emb = torch.cat([uncond, cond])
        latents = torch.randn(batch_size, 4, 64, 64, device="cuda", dtype=F16)
        scheduler.set_timesteps(num_inference_steps)
        with torch.autocast("cuda", dtype=torch.float16):
            for i, t in enumerate(scheduler.timesteps):
                noise_pred = unet(torch.cat([latents] * 2), t, encoder_hidden_states=emb).sample
                noise_uncond, noise_text = noise_pred.chunk(2)
                noise_pred = noise_uncond + guidance_scale * (noise_text - noise_uncond)
                latents = scheduler.step(noise_pred, t, latents).prev_sample
                if it == 0:
                    print("step %2d allocated %.1f GiB" % (i, torch.cuda.memory_allocated() / (1 << 30)))
            image = vae.decode(latents / vae.config.scaling_factor).sample
            reward = pickscore.get_image_features(pickscore_preprocess(image))
        loss = -reward.mean()
        scen_truth.backward(loss)                      # loss.backward()
        optimizer.step()
        optimizer.zero_grad()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
