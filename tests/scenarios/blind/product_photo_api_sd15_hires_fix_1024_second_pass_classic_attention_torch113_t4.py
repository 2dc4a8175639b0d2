"""app.py -- an e-commerce team's product-photo API (FastAPI, one uvicorn worker per g4dn.xlarge, Tesla T4
16 GB), built in early 2023 on a pinned image: torch 1.13.1+cu117, diffusers 0.14, no xformers.  A fine-tuned
SD 1.5 in fp16 with its safety checker; txt2img at 512x512 has served for a year.  This sprint adds an "HD"
option, done the A1111 "hires fix" way: generate at 512, upscale the image 2x, and run img2img over it at
1024x1024 with strength 0.45, sharing the components:

    txt2img = StableDiffusionPipeline.from_pretrained(MODEL, torch_dtype=torch.float16).to("cuda")
    img2img = StableDiffusionImg2ImgPipeline(**txt2img.components)
    @app.post("/v1/render")
    def render(req):
        image = txt2img(req.prompt, negative_prompt=NEG, num_inference_steps=30, guidance_scale=7).images[0]
        if req.hd:
            image = img2img(req.prompt, image=image.resize((1024, 1024), Image.LANCZOS), strength=0.45,
                            num_inference_steps=30, guidance_scale=7).images[0]

The container's start-up warm-up renders one normal and one HD picture; the HD one kills the worker.  The
first UNet call of the 1024 pass fails in the first self-attention layer: with torch 1.13 and no xformers,
diffusers 0.14 runs the classic AttnProcessor, which materialises the attention matrix.  At 1024x1024 the
top level has 128x128 = 16384 latent tokens; with CFG (batch 2) and 8 heads, get_attention_scores first
makes the `baddbmm_input` placeholder (torch.empty of the full size) and then the scores, each 16 x 16384 x
16384 x 2 B = 8 GiB -- the second 8 GiB does not fit beside the first and the 2.6 GiB of weights (and the
softmax would need a third).  At 512x512 the same matrices are 512 MiB, which is why the old path worked.

An expert: attention memory grows with the square of the token count: use memory-efficient attention --
pipe.enable_xformers_memory_efficient_attention() (xformers 0.0.16 for torch 1.13) or move to torch 2.x where
diffusers uses scaled_dot_product_attention by default -- or, on this image as it is,
pipe.enable_attention_slicing() (split the attention by head).  Wrong advice: a smaller batch (it is one
image), quantization or CPU offload (2.6 GiB of weights), fp16 (already), inference_mode (pipelines run
under no_grad), expandable_segments / empty_cache, and a bigger GPU before the one-line fix.
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


class Act(object):
    """Shape bookkeeping beside the stand-in tensors: (batch, tokens, channels)."""

    def __init__(self, t, batch, tokens, channels):
        self.t, self.batch, self.tokens, self.channels = t, batch, tokens, channels


def act(batch, tokens, channels):
    return Act(_fp16(batch * tokens * channels), batch, tokens, channels)


# ---------------------------------------------------------------- diffusers 0.14, as far as memory goes
class AttnProcessor(object):
    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None):
        batch, tokens = hidden_states.batch, hidden_states.tokens
        context = encoder_hidden_states if encoder_hidden_states is not None else hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(context)
        value = attn.to_v(context)
        query = attn.head_to_batch_dim(query)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)
        attention_probs = attn.get_attention_scores(query, key, attention_mask)
        hidden_states = act(batch, tokens, attn.inner_dim)              # torch.bmm(attention_probs, value)
        del attention_probs
        return attn.to_out(hidden_states)


class Attention(nn.Module):
    def __init__(self, query_dim, heads, dim_head, cross_attention_dim=None):
        nn.Module.__init__(self)
        self.heads, self.inner_dim = heads, heads * dim_head
        self.scale = dim_head ** -0.5
        self.upcast_softmax = False
        self.to_q_weight = nn.Parameter(_fp16(query_dim * self.inner_dim), requires_grad=False)
        self.to_k_weight = nn.Parameter(_fp16((cross_attention_dim or query_dim) * self.inner_dim),
                                        requires_grad=False)
        self.processor = AttnProcessor()

    def to_q(self, x):
        return act(x.batch, x.tokens, self.inner_dim)

    def to_k(self, x):
        return act(x.batch, x.tokens, self.inner_dim)

    def to_v(self, x):
        return act(x.batch, x.tokens, self.inner_dim)

    def to_out(self, x):
        return act(x.batch, x.tokens, self.inner_dim)

    def head_to_batch_dim(self, x):
        # (batch, tokens, heads*d) -> (batch*heads, tokens, d): reshape/permute/reshape, a copy
        out = act(x.batch * self.heads, x.tokens, self.inner_dim // self.heads)
        return out

    def get_attention_scores(self, query, key, attention_mask=None):
        dtype = HALF
        if attention_mask is None:
            baddbmm_input = torch.empty(query.batch * query.tokens * key.tokens, dtype=dtype, device="cuda")
            beta = 0
        else:
            baddbmm_input = attention_mask
            beta = 1
        attention_scores = torch.empty(query.batch * query.tokens * key.tokens, dtype=dtype, device="cuda")
        del baddbmm_input                                         # torch.baddbmm(baddbmm_input, q, k^T, ...)
        attention_probs = torch.empty(attention_scores.nbytes // 2, dtype=dtype, device="cuda")   # .softmax(-1)
        del attention_scores
        return attention_probs

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None):
        return self.processor(self, hidden_states, encoder_hidden_states, attention_mask)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.attn1 = Attention(dim, heads, dim // heads)
        self.attn2 = Attention(dim, heads, dim // heads, cross_attention_dim=768)

    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.attn1(hidden_states)
        hidden_states = self.attn2(hidden_states, encoder_hidden_states)
        ff = act(hidden_states.batch, hidden_states.tokens, hidden_states.channels * 8)      # GEGLU
        del ff
        return act(hidden_states.batch, hidden_states.tokens, hidden_states.channels)


class Transformer2DModel(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.transformer_blocks_0 = BasicTransformerBlock(dim, heads)

    def forward(self, hidden_states, encoder_hidden_states):
        return self.transformer_blocks_0(hidden_states, encoder_hidden_states)


class ResnetBlock2D(nn.Module):
    def forward(self, x):
        a = act(x.batch, x.tokens, x.channels)
        b = act(x.batch, x.tokens, x.channels)
        del a
        return b


class CrossAttnDownBlock2D(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.resnets_0 = ResnetBlock2D()
        self.attentions_0 = Transformer2DModel(dim, heads)

    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.resnets_0(hidden_states)
        return self.attentions_0(hidden_states, encoder_hidden_states)


class UNet2DConditionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.down_blocks_0 = CrossAttnDownBlock2D(320, 8)
        self.down_blocks_1 = CrossAttnDownBlock2D(640, 8)
        _weights(self, 859_520_964 - sum(p.nbytes for p in self.parameters()) // 2, 16)

    def forward(self, sample, timestep, encoder_hidden_states):
        h = act(sample.batch, sample.tokens, 320)                       # conv_in
        h = self.down_blocks_0(h, encoder_hidden_states)
        h = act(sample.batch, sample.tokens // 4, 640)
        h = self.down_blocks_1(h, encoder_hidden_states)
        # (the rest of the down path, the mid block and the up path: smaller than the top level)
        return act(sample.batch, sample.tokens, 4)


class CLIPTextModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 123_060_480, 4)


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 83_653_863, 4)

    def encode(self, image):
        a = _fp16(image.batch * 128 * image.tokens)
        b = _fp16(image.batch * 128 * image.tokens)
        del a, b
        return act(image.batch, image.tokens // 64, 4)

    def decode(self, latents):
        a = _fp16(latents.batch * 128 * latents.tokens * 64)
        b = _fp16(latents.batch * 128 * latents.tokens * 64)
        del a
        img = act(latents.batch, latents.tokens * 64, 3)
        del b
        return img


class StableDiffusionSafetyChecker(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 303_981_824 + 768 * 17, 4)

    def forward(self, clip_input, images):
        emb = act(1, 257, 1024)
        del emb
        return images, [False]


class StableDiffusionPipeline(object):
    def __init__(self, vae, text_encoder, unet, safety_checker):
        self.vae, self.text_encoder, self.unet, self.safety_checker = vae, text_encoder, unet, safety_checker

    @property
    def components(self):
        return dict(vae=self.vae, text_encoder=self.text_encoder, unet=self.unet, safety_checker=self.safety_checker)

    def _denoise(self, latents, prompt_embeds, steps):
        for i in range(steps):
            latent_model_input = act(2, latents.tokens, 4)                # torch.cat([latents] * 2)
            noise_pred = self.unet(latent_model_input, i, prompt_embeds)
            latents = act(1, latents.tokens, 4)
            del noise_pred, latent_model_input
        return latents

    def _finish(self, latents):
        image = self.vae.decode(latents)
        image, has_nsfw = self.safety_checker(act(1, 224 * 224, 3), image)
        return image

    @no_grad_call
    def __call__(self, prompt, negative_prompt=None, height=512, width=512, num_inference_steps=30,
                 guidance_scale=7.0):
        prompt_embeds = act(2, 77, 768)
        latents = act(1, (height // 8) * (width // 8), 4)
        latents = self._denoise(latents, prompt_embeds, num_inference_steps)
        return self._finish(latents)


class StableDiffusionImg2ImgPipeline(StableDiffusionPipeline):
    @no_grad_call
    def __call__(self, prompt, image, strength=0.8, negative_prompt=None, num_inference_steps=50,
                 guidance_scale=7.5):
        prompt_embeds = act(2, 77, 768)
        image_t = act(1, image.width * image.height, 3)                   # image_processor.preprocess
        init_latents = self.vae.encode(image_t)
        del image_t
        steps = int(num_inference_steps * strength)
        latents = self._denoise(init_latents, prompt_embeds, steps)
        return self._finish(latents)


class PILImage(object):
    """What .images[0] gives back: a PIL image on the host."""

    def __init__(self, width, height):
        self.width, self.height = width, height

    def resize(self, size, resample=None):
        return PILImage(size[0], size[1])


# ---------------------------------------------------------------- the app
NEG = "lowres, blurry, watermark, text"
txt2img = StableDiffusionPipeline(AutoencoderKL(), CLIPTextModel(), UNet2DConditionModel(),
                                  StableDiffusionSafetyChecker())
img2img = StableDiffusionImg2ImgPipeline(**txt2img.components)


class RenderRequest(object):
    def __init__(self, prompt, hd=False):
        self.prompt, self.hd = prompt, hd


def render(req):
    txt2img(req.prompt, negative_prompt=NEG, num_inference_steps=30, guidance_scale=7)
    image = PILImage(512, 512)
    if req.hd:
        img2img(req.prompt, image=image.resize((1024, 1024)), strength=0.45, negative_prompt=NEG,
                num_inference_steps=30, guidance_scale=7)
        image = PILImage(1024, 1024)
    return {"width": image.width, "height": image.height}


def warm_up():
    print("warm-up: standard", render(RenderRequest("white ceramic mug on a marble counter, studio light")))
    print("warm-up: hd", render(RenderRequest("white ceramic mug on a marble counter, studio light", hd=True)))


if __name__ == "__main__":
    try:
        warm_up()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
