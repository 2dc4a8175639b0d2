"""heatmaps.py -- a PhD student's figure script for a paper on prompt attribution, run on one A100 80GB
of the university cluster (Slurm, one GPU).  SDXL base 1.0 in fp16 (with the fp16-fix VAE), diffusers,
50 Euler steps, guidance 7.5, 4 images per prompt at 1024x1024 -- the UNet runs a batch of 8.

For per-token heatmaps (DAAM-style) the student replaced every attention processor of the UNet with a
copy of diffusers' classic AttnProcessor that also keeps the cross-attention probabilities:

    class HeatmapProcessor(AttnProcessor):
        def __init__(self, name, store):
            self.name, self.store = name, store
        def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
            is_cross = encoder_hidden_states is not None
            ...
            attention_probs = attn.get_attention_scores(query, key, attention_mask)
            if is_cross:
                self.store[self.name].append(attention_probs.float())     # aggregated after sampling
            hidden_states = torch.bmm(attention_probs, value)
            ...

    store = collections.defaultdict(list)
    pipe.unet.set_attn_processor({n: HeatmapProcessor(n, store) for n in pipe.unet.attn_processors})
    images = pipe(prompt, num_images_per_prompt=4, num_inference_steps=50, guidance_scale=7.5).images
    heatmaps = aggregate(store, tokenizer(prompt))                       # after the call

It worked for the first smoke test (4 steps).  With 50 steps it dies part way through sampling.  What
fills the card: the dict `store` keeps, for every one of the 70 cross-attention layers and every
denoising step, the full probability tensor (CFG batch 8 x heads x queries x 77 keys) upcast to fp32:
10 layers at 64x64 (8x10x4096x77x4 B = 96 MiB each) + 60 layers at 32x32 (8x20x1024x77x4 B = 48 MiB
each) = 3.76 GiB per step, never released until the call returns.  With the 6.5 GiB of fp16 weights and
~5.5 GiB of per-step temporaries (the classic processor materialises the 64x64 self-attention scores,
2.5 GiB), the 80 GB card runs out at step 18 of 50 -- in whatever allocation comes next, here a
self-attention score matrix (2.5 GiB asked, 1.9 GiB free; the 3 GiB PyTorch holds cached are that
step's freed temporaries, not what the run is short of).

An expert: memory grows by a fixed amount per denoising step because the Python dict of lists keeps every
map: aggregate on the fly (a running sum per layer of the conditional half, averaged over heads, in
fp32 that is a few MiB), or move each map to the CPU, or keep only the 32x32 layers / a subset of steps
-- release the references / bound what the store keeps.  Wrong first advice: flash/SDPA attention
(the failing line is an attention score, but that transient is not what grows; it saves 5 GiB = one more
step), fewer images per prompt or a smaller resolution (only postpones the step at which it fails),
CPU offload or quantizing the UNet (weights are 6.5 GiB of 80), expandable_segments / empty_cache (the
memory is live), a bigger GPU (there is none; 50 steps need ~195 GiB).
"""
import collections
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
HALF = torch.float16


def _fp16(n_elems):
    return torch.empty(int(n_elems), dtype=HALF, device="cuda")


def _param(n_elems):
    return nn.Parameter(_fp16(n_elems), requires_grad=False)


def no_grad_call(fn):
    """@torch.no_grad(), as diffusers decorates DiffusionPipeline.__call__."""
    def decorate_context(*args, **kwargs):
        with torch.no_grad():
            return fn(*args, **kwargs)
    return decorate_context


# ---------------------------------------------------------------- diffusers, as far as this script touches it
class AttnProcessor(object):
    """diffusers.models.attention_processor.AttnProcessor: the classic (non-SDPA) processor."""

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        is_cross = encoder_hidden_states is not None
        context = encoder_hidden_states if is_cross else hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(context)
        value = attn.to_v(context)
        query = attn.head_to_batch_dim(query)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)
        attention_probs = attn.get_attention_scores(query, key, attention_mask)
        hidden_states = attn.bmm(attention_probs, value)
        del attention_probs
        hidden_states = attn.batch_to_head_dim(hidden_states)
        return attn.to_out(hidden_states)


class Attention(nn.Module):
    """diffusers.models.attention_processor.Attention; tensors are (bytes, shape-like) stand-ins: the rows
    are batch x tokens and the widths are the channels, so sizes are exact without shapes."""

    def __init__(self, query_dim, heads, cross_attention_dim=None):
        nn.Module.__init__(self)
        kv_dim = cross_attention_dim or query_dim
        self.query_dim, self.heads, self.kv_dim = query_dim, heads, kv_dim
        self.w_q = _param(query_dim * query_dim)
        self.w_k = _param(kv_dim * query_dim)
        self.w_v = _param(kv_dim * query_dim)
        self.w_out = _param(query_dim * query_dim + query_dim)
        self.processor = AttnProcessor()
        self._rows = None

    # the projections: (rows, width) fp16 tensors
    def _lin(self, x, rows, width):
        out = _fp16(rows * width)
        out.rows, out.width = rows, width
        return out

    def to_q(self, x):
        return self._lin(x, x.rows, self.query_dim)

    def to_k(self, ctx):
        return self._lin(ctx, ctx.rows, self.query_dim)

    def to_v(self, ctx):
        return self._lin(ctx, ctx.rows, self.query_dim)

    def head_to_batch_dim(self, t):
        out = _fp16(t.rows * t.width)                       # reshape + permute + reshape: a copy
        out.rows, out.width, out.tokens = t.rows, t.width, t.tokens_per_item
        return out

    def get_attention_scores(self, query, key, attention_mask=None):
        # baddbmm(empty, q, k^T) -> (batch*heads, q_tokens, k_tokens), then softmax: a second tensor
        bh = BATCH * self.heads
        n = bh * query.tokens * key.tokens
        scores = _fp16(n)
        probs = _fp16(n)
        del scores
        probs.shape_bqk = (bh, query.tokens, key.tokens)
        return probs

    def bmm(self, probs, value):
        out = _fp16(BATCH * probs.shape_bqk[1] * self.query_dim)
        out.rows, out.width = BATCH * probs.shape_bqk[1], self.query_dim
        return out

    def batch_to_head_dim(self, t):
        out = _fp16(t.rows * t.width)
        out.rows, out.width = t.rows, t.width
        return out

    def to_out(self, x):
        out = self._lin(x, x.rows, self.query_dim)
        out.tokens_per_item = x.rows // BATCH
        return out

    def forward(self, hidden_states, encoder_hidden_states=None, attention_mask=None):
        return self.processor(self, hidden_states, encoder_hidden_states, attention_mask)


class FeedForward(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.proj_in = _param(dim * dim * 8)            # GEGLU: dim -> 2 x 4 dim
        self.proj_out = _param(dim * 4 * dim)
        self.dim = dim

    def forward(self, x):
        h = _fp16(x.rows * self.dim * 8)
        g = _fp16(x.rows * self.dim * 4)
        del h
        out = _fp16(x.rows * self.dim)
        del g
        out.rows, out.width, out.tokens_per_item = x.rows, self.dim, x.tokens_per_item
        return out


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.attn1 = Attention(dim, heads)
        self.attn2 = Attention(dim, heads, cross_attention_dim=2048)
        self.ff = FeedForward(dim)

    def forward(self, hidden_states, encoder_hidden_states):
        hidden_states = self.attn1(hidden_states)
        hidden_states = self.attn2(hidden_states, encoder_hidden_states)
        return self.ff(hidden_states)


class Transformer2DModel(nn.Module):
    def __init__(self, dim, heads, depth):
        nn.Module.__init__(self)
        self.dim = dim
        for i in range(depth):
            setattr(self, "block_%d" % i, BasicTransformerBlock(dim, heads))
        self.depth = depth

    def forward(self, sample, encoder_hidden_states):
        h = _fp16(sample.rows * self.dim)
        h.rows, h.width, h.tokens_per_item = sample.rows, self.dim, sample.rows // BATCH
        for i in range(self.depth):
            h = getattr(self, "block_%d" % i)(h, encoder_hidden_states)
        out = _fp16(sample.rows * self.dim)
        out.rows, out.width, out.tokens_per_item = sample.rows, self.dim, sample.rows // BATCH
        return out


class ResnetBlock2D(nn.Module):
    def __init__(self, dim, n_params):
        nn.Module.__init__(self)
        self.weight = _param(n_params)
        self.dim = dim

    def forward(self, x):
        a = _fp16(x.rows * self.dim)
        b = _fp16(x.rows * self.dim)
        del a
        out = _fp16(x.rows * self.dim)
        del b
        out.rows, out.width, out.tokens_per_item = x.rows, self.dim, x.rows // BATCH
        return out


# SDXL UNet levels at 1024x1024: (latent side, channels, heads, transformer depth, attentions per block)
LEVELS = [(128, 320, 5, 0), (64, 640, 10, 2), (32, 1280, 20, 10)]
UNET_PARAMS = 2_567_463_684


class UNet2DConditionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn_modules = []
        made = 0
        self.down = []
        for li, (side, dim, heads, depth) in enumerate(LEVELS):
            blocks = []
            for j in range(2):
                r = ResnetBlock2D(dim, 0)
                t = Transformer2DModel(dim, heads, depth) if depth else None
                blocks.append((r, t))
                setattr(self, "down_%d_res_%d" % (li, j), r)
                if t is not None:
                    setattr(self, "down_%d_attn_%d" % (li, j), t)
            self.down.append(blocks)
        self.mid_res = ResnetBlock2D(1280, 0)
        self.mid_attn = Transformer2DModel(1280, 20, 10)
        self.up = []
        for li, (side, dim, heads, depth) in reversed(list(enumerate(LEVELS))):
            blocks = []
            for j in range(3):
                r = ResnetBlock2D(dim, 0)
                t = Transformer2DModel(dim, heads, depth) if depth else None
                blocks.append((r, t))
                setattr(self, "up_%d_res_%d" % (li, j), r)
                if t is not None:
                    setattr(self, "up_%d_attn_%d" % (li, j), t)
            self.up.append((li, blocks))
        made = sum(p.nbytes for p in self.parameters()) // 2
        # the convolutions of the resnets, time embedding, conv_in/out: the rest of the 2.57B parameters
        rest = UNET_PARAMS - made
        for i in range(16):
            setattr(self, "conv_weights_%02d" % i, _param(rest // 16))

    @property
    def attn_processors(self):
        return dict((name, m) for name, m in self._named_attention())

    def _named_attention(self):
        out = []
        todo = [("", self)]
        while todo:
            prefix, m = todo.pop(0)
            for k, sub in m._modules.items():
                name = prefix + k
                if isinstance(sub, Attention):
                    out.append((name + ".processor", sub))
                else:
                    todo.append((name + ".", sub))
        return out

    def set_attn_processor(self, processors):
        for name, m in self._named_attention():
            m.processor = processors[name]

    def forward(self, sample, timestep, encoder_hidden_states):
        skips = []
        h = None
        for li, blocks in enumerate(self.down):
            side, dim = LEVELS[li][0], LEVELS[li][1]
            x = _fp16(BATCH * side * side * dim)
            x.rows, x.width = BATCH * side * side, dim
            skips.append(x)
            for r, t in blocks:
                x = r(x)
                if t is not None:
                    x = t(x, encoder_hidden_states)
                skips.append(x)
        m = self.mid_res(skips[-1])
        m = self.mid_attn(m, encoder_hidden_states)
        h = m
        for li, blocks in self.up:
            side, dim = LEVELS[li][0], LEVELS[li][1]
            for r, t in blocks:
                skip = skips.pop()
                cat = _fp16(BATCH * side * side * dim * 2)          # torch.cat([h, skip], dim=1)
                cat.rows, cat.width = BATCH * side * side, dim * 2
                del skip
                h = r(cat)
                del cat
                if t is not None:
                    h = t(h, encoder_hidden_states)
        del skips
        noise_pred = _fp16(BATCH * 4 * 128 * 128)
        return noise_pred


class CLIPTextModel(nn.Module):
    def __init__(self, n_params):
        nn.Module.__init__(self)
        for i in range(8):
            setattr(self, "w%d" % i, _param(n_params // 8))


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(4):
            setattr(self, "w%d" % i, _param(83_653_863 // 4))

    def decode(self, latents):
        return _fp16(BATCH // 2 * 3 * 1024 * 1024)


class StableDiffusionXLPipeline(object):
    def __init__(self, unet, text_encoder, text_encoder_2, vae):
        self.unet, self.text_encoder, self.text_encoder_2, self.vae = unet, text_encoder, text_encoder_2, vae

    @no_grad_call
    def __call__(self, prompt, num_images_per_prompt=1, num_inference_steps=50, guidance_scale=5.0):
        prompt_embeds = _fp16(BATCH * 77 * 2048)                     # [uncond x4, cond x4]
        prompt_embeds.rows, prompt_embeds.width, prompt_embeds.tokens = BATCH * 77, 2048, 77
        prompt_embeds.tokens_per_item = 77
        latents = _fp16(num_images_per_prompt * 4 * 128 * 128)
        for i in range(num_inference_steps):
            latent_model_input = _fp16(BATCH * 4 * 128 * 128)       # torch.cat([latents] * 2)
            noise_pred = self.unet(latent_model_input, i, prompt_embeds)
            del latent_model_input
            latents = _fp16(num_images_per_prompt * 4 * 128 * 128)
            del noise_pred
            print("  %d/%d" % (i + 1, num_inference_steps), end="\r" if i + 1 < num_inference_steps else "\n",
                  flush=True)
        return self.vae.decode(latents)


# ---------------------------------------------------------------- the student's script
class HeatmapProcessor(AttnProcessor):
    """AttnProcessor that also keeps the cross-attention probabilities for the token heatmaps."""

    def __init__(self, name, store):
        self.name, self.store = name, store

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None):
        is_cross = encoder_hidden_states is not None
        context = encoder_hidden_states if is_cross else hidden_states
        query = attn.to_q(hidden_states)
        key = attn.to_k(context)
        value = attn.to_v(context)
        query.tokens_per_item = hidden_states.tokens_per_item
        key.tokens_per_item = context.tokens_per_item
        value.tokens_per_item = context.tokens_per_item
        query = attn.head_to_batch_dim(query)
        key = attn.head_to_batch_dim(key)
        value = attn.head_to_batch_dim(value)
        attention_probs = attn.get_attention_scores(query, key, attention_mask)
        if is_cross:
            kept = torch.empty(attention_probs.nbytes // 2, dtype=torch.float32, device="cuda")   # .float()
            self.store[self.name].append(kept)
        hidden_states = attn.bmm(attention_probs, value)
        del attention_probs
        hidden_states = attn.batch_to_head_dim(hidden_states)
        return attn.to_out(hidden_states)


PROMPTS = ["a red fox sitting in a snowy birch forest, golden hour",
           "an astronaut riding a horse on the beach, film photo"]
NUM_IMAGES = 4
BATCH = 2 * NUM_IMAGES           # classifier-free guidance: unconditional + conditional


def main():
    unet = UNet2DConditionModel()
    pipe = StableDiffusionXLPipeline(unet, CLIPTextModel(123_060_480), CLIPTextModel(694_659_841),
                                     AutoencoderKL())
    print("weights on the GPU: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))
    for prompt in PROMPTS:
        store = collections.defaultdict(list)
        pipe.unet.set_attn_processor(dict((n, HeatmapProcessor(n, store)) for n in pipe.unet.attn_processors))
        images = pipe(prompt, num_images_per_prompt=NUM_IMAGES, num_inference_steps=50, guidance_scale=7.5)
        print("maps kept:", sum(len(v) for v in store.values()))
        del images, store
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
