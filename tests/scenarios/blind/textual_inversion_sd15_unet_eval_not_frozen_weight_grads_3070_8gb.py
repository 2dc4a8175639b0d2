"""Textual inversion on Stable Diffusion 1.5, on a home desktop's RTX 3070 (8 GB, also driving the display).

The real program (train_ti.py) is a hand-written textual-inversion loop, put together from the diffusers
example and a blog post:

    tokenizer = CLIPTokenizer.from_pretrained(MODEL, subfolder="tokenizer")
    text_encoder = CLIPTextModel.from_pretrained(MODEL, subfolder="text_encoder")
    vae = AutoencoderKL.from_pretrained(MODEL, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(MODEL, subfolder="unet")
    tokenizer.add_tokens("<my-cat>"); text_encoder.resize_token_embeddings(len(tokenizer))
    ...
    vae.eval(); unet.eval()          # "frozen: only the new embedding is trained"
    text_encoder.train()
    text_encoder.to("cuda"); vae.to("cuda"); unet.to("cuda")
    optimizer = torch.optim.AdamW(text_encoder.get_input_embeddings().parameters(), lr=5e-4)
    orig_embeds_params = text_encoder.get_input_embeddings().weight.data.clone()
    for step, batch in enumerate(loader):                    # train_batch_size=1, grad accumulation 4
        with torch.no_grad():
            latents = vae.encode(batch["pixel_values"].to("cuda")).latent_dist.sample() * 0.18215
        noise = torch.randn_like(latents); timesteps = torch.randint(0, 1000, (bsz,), device="cuda")
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)
        encoder_hidden_states = text_encoder(batch["input_ids"].to("cuda"))[0]
        noise_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
        loss = F.mse_loss(noise_pred.float(), noise.float(), reduction="mean")
        loss.backward()                                       # <- CUDA out of memory, first step
        ...

The user believes that unet.eval()/vae.eval() freeze those models and that handing AdamW only the token
embedding means nothing else is trained.  eval() only switches dropout/normalisation behaviour; every
weight still has requires_grad=True.  The UNet cannot run under no_grad (the gradient has to flow through
it back to the prompt embedding), so autograd records it, and loss.backward() makes a .grad for every UNet
weight and every CLIP text-encoder weight, although the optimizer will never read them.  (The diffusers
script avoids exactly this with unet.requires_grad_(False), vae.requires_grad_(False) and freezing the
text encoder's encoder / final_layer_norm / position_embedding.)

Sizes (fp32 everywhere, mixed_precision "no", batch 1 at 512x512, torch 2 SDPA attention):
  CUDA context ~0.5 GiB; Xorg + gnome-shell on the same card ~0.3 GiB
  UNet 859.5M params = 3.20 GiB, CLIP-L text encoder 123.1M = 0.46 GiB, VAE 84M = 0.31 GiB
  orig_embeds_params (a copy of the 49409x768 token embedding) 0.14 GiB
  UNet + text-encoder activations saved for backward at 64x64 latents, batch 1: ~2.15 GiB
  -> 6.26 GiB allocated by PyTorch before backward, ~7.06 GiB in use on the card, ~0.94 GiB free.
  backward then wants gradients for all of them: UNet 3.20 GiB + text encoder 0.46 GiB = 3.66 GiB
  -> fails part way through making the UNet's weight gradients (first step, phase backward), on a
     56.25 MiB gradient of a 1280x1280 3x3 conv, with ~0.9 GiB of gradients made: the pass is ~2.8 GiB short.
  Even if backward released every saved activation as it went, the end of backward holds the fp32 weights and
  the embedding copy (4.1 GiB) plus their gradients (3.66 GiB) plus context and desktop (0.8 GiB): ~8.6 GiB.

What an expert says first: freeze what you do not train -- unet.requires_grad_(False),
vae.requires_grad_(False), and the text encoder except its token embedding -- so backward makes only the
0.14 GiB embedding gradient (plus 0.28 GiB of AdamW state at the step): ~6.7 GiB allocated, ~7.5 GiB on the
card, it fits the 8 GB card as it is (more headroom in reality: with frozen weights autograd also stops
saving the inputs of their matmuls).  It also makes every step faster: no weight gradients for 980M parameters.
Wrong or insufficient advice: smaller batch (it is 1 already); empty_cache / expandable_segments (nothing is
cached: live tensors fill the card); closing Xorg (0.3 GiB of a ~2.8 GiB shortfall); 8-bit Adam or LoRA (the
optimizer state is 0.28 GiB and LoRA is another method); autocast alone or gradient checkpointing alone (they
shrink activations only; weights + unwanted gradients alone are ~8.6 GiB on the card); inference_mode (it
would cut the gradient to the embedding); flash attention (SDPA already).  A bigger card would work but is not
needed.

Stand-in notes: the stand-in torch has no nn.Linear / LayerNorm / GroupNorm / ModuleList / mse_loss, so the
few layer classes below stand for them (weights sized as PyTorch's, outputs sized as PyTorch's activations).
Its tensors are on the GPU from creation, so the models' .to("cuda") calls are no-ops here; the memory at
the failure is the same as in the real program.
"""
import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
MODEL = "runwayml/stable-diffusion-v1-5"


class Args(object):
    pretrained_model_name_or_path = MODEL
    placeholder_token = "<my-cat>"
    initializer_token = "cat"
    train_data_dir = "data/my_cat"          # 6 photos of the cat
    resolution = 512
    train_batch_size = 1
    gradient_accumulation_steps = 4
    learning_rate = 5e-4
    max_train_steps = 3000
    mixed_precision = "no"
    seed = 1234


# --------------------------------------------------------------------------------------------------
# layers (torch.nn.Linear, LayerNorm, GroupNorm, Embedding, ModuleList as far as memory goes)
# --------------------------------------------------------------------------------------------------

def _fp32(numel):
    return torch.empty(int(numel), dtype=torch.float32)


def _like(x, num=1, den=1):
    """A new activation of x's numel * num / den (fp32), saving x for backward."""
    out = _fp32(max(x.nbytes // 4 * num // den, 1))
    if torch.is_grad_enabled():
        out._saved = x
    return out


class ModuleList(nn.Module):
    def __init__(self, mods=()):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __len__(self):
        return len(self._modules)

    def __getitem__(self, i):
        return list(self._modules.values())[i]


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(_fp32(in_features * out_features))
        if bias:
            self.bias = nn.Parameter(_fp32(out_features))

    def forward(self, x):
        return _like(x, self.out_features, self.in_features)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(_fp32(dim))
        self.bias = nn.Parameter(_fp32(dim))

    def forward(self, x):
        return _like(x)


class GroupNorm(LayerNorm):
    pass


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num, dim
        self.weight = nn.Parameter(_fp32(num * dim))

    def forward(self, ids_numel):
        return _fp32(ids_numel * self.embedding_dim)


def silu(x):
    return _like(x)


def add(a, b):
    out = _like(a)
    if torch.is_grad_enabled():
        out._saved = (a, b)
    return out


def cat(tensors):
    out = _fp32(sum(t.nbytes for t in tensors) // 4)
    if torch.is_grad_enabled():
        out._saved = tuple(tensors)
    return out


# --------------------------------------------------------------------------------------------------
# transformers.CLIPTextModel (ViT-L/14 text tower)
# --------------------------------------------------------------------------------------------------

class CLIPAttention(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.k_proj, self.v_proj, self.q_proj, self.out_proj = (Linear(d, d), Linear(d, d), Linear(d, d),
                                                                Linear(d, d))

    def forward(self, h, tokens):
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        probs = _fp32(12 * tokens * tokens)              # 12 heads, 77x77 causal attention
        probs._saved = (q, k)
        ctx = _like(v)
        ctx._saved = (probs, v)
        return self.out_proj(ctx)


class CLIPMLP(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.fc1, self.fc2 = Linear(d, 4 * d), Linear(4 * d, d)

    def forward(self, h):
        return self.fc2(_like(self.fc1(h)))               # quick_gelu


class CLIPEncoderLayer(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.self_attn, self.layer_norm1 = CLIPAttention(d), LayerNorm(d)
        self.mlp, self.layer_norm2 = CLIPMLP(d), LayerNorm(d)

    def forward(self, h, tokens):
        h = add(h, self.self_attn(self.layer_norm1(h), tokens))
        return add(h, self.mlp(self.layer_norm2(h)))


class CLIPTextEmbeddings(nn.Module):
    def __init__(self, vocab, d, positions):
        nn.Module.__init__(self)
        self.token_embedding = Embedding(vocab, d)
        self.position_embedding = Embedding(positions, d)

    def forward(self, ids_numel):
        return add(self.token_embedding(ids_numel), self.position_embedding(ids_numel))


class CLIPEncoder(nn.Module):
    def __init__(self, d, n):
        nn.Module.__init__(self)
        self.layers = ModuleList([CLIPEncoderLayer(d) for _ in range(n)])

    def forward(self, h, tokens):
        for layer in self.layers:
            h = layer(h, tokens)
        return h


class CLIPTextTransformer(nn.Module):
    def __init__(self, vocab=49408, d=768, n=12, positions=77):
        nn.Module.__init__(self)
        self.embeddings = CLIPTextEmbeddings(vocab, d, positions)
        self.encoder = CLIPEncoder(d, n)
        self.final_layer_norm = LayerNorm(d)

    def forward(self, ids_numel, tokens):
        return self.final_layer_norm(self.encoder(self.embeddings(ids_numel), tokens))


class CLIPTextModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.text_model = CLIPTextTransformer()

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def get_input_embeddings(self):
        return self.text_model.embeddings.token_embedding

    def resize_token_embeddings(self, n):
        emb = self.text_model.embeddings
        old = emb.token_embedding
        emb.token_embedding = Embedding(n, old.embedding_dim)   # new matrix, old rows copied, old one freed
        del old
        return emb.token_embedding

    def forward(self, input_ids):
        bsz, tokens = input_ids
        return (self.text_model(bsz * tokens, tokens),)


class CLIPTokenizer(object):
    def __init__(self):
        self.vocab = 49408

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def add_tokens(self, token):
        self.vocab += 1
        return 1

    def __len__(self):
        return self.vocab

    def __call__(self, text, max_length=77):
        return (1, max_length)


# --------------------------------------------------------------------------------------------------
# diffusers.AutoencoderKL (encoder side used here) and UNet2DConditionModel, SD1.5 configuration
# --------------------------------------------------------------------------------------------------

class ResnetBlock2D(nn.Module):
    def __init__(self, cin, cout, temb=1280):
        nn.Module.__init__(self)
        self.cin, self.cout = cin, cout
        self.norm1 = GroupNorm(cin)
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        if temb:
            self.time_emb_proj = Linear(temb, cout)
        self.norm2 = GroupNorm(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        if cin != cout:
            self.conv_shortcut = nn.Conv2d(cin, cout, 1)
        self.has_temb = bool(temb)

    def forward(self, x, temb=None):
        h = self.conv1(silu(self.norm1(x)))
        if self.has_temb:
            h = add(h, self.time_emb_proj(silu(temb)))
        h = self.conv2(silu(self.norm2(h)))              # dropout 0
        if self.cin != self.cout:
            x = self.conv_shortcut(x)
        return add(x, h)


class Attention(nn.Module):
    def __init__(self, dim, cross_dim=None, heads=8):
        nn.Module.__init__(self)
        self.dim, self.heads = dim, heads
        self.to_q = Linear(dim, dim, bias=False)
        self.to_k = Linear(cross_dim or dim, dim, bias=False)
        self.to_v = Linear(cross_dim or dim, dim, bias=False)
        self.to_out = Linear(dim, dim)

    def forward(self, h, context=None):
        ctx = h if context is None else context
        q, k, v = self.to_q(h), self.to_k(ctx), self.to_v(ctx)
        out = _like(q)                                   # F.scaled_dot_product_attention (memory-efficient)
        out._saved = (q, k, v)
        lse = _fp32(self.heads * (h.nbytes // 4 // self.dim))    # logsumexp, saved for backward
        out._saved = (q, k, v, lse)
        return self.to_out(out)


class GEGLUFeedForward(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.proj = Linear(dim, 8 * dim)                # GEGLU: hidden and gate, 4*dim each
        self.out = Linear(4 * dim, dim)

    def forward(self, h):
        hg = self.proj(h)
        gate = _like(hg, 1, 2)                           # F.gelu(gate)
        prod = _like(hg, 1, 2)                           # hidden * gelu(gate)
        prod._saved = (hg, gate)
        return self.out(prod)


class BasicTransformerBlock(nn.Module):
    def __init__(self, dim, cross_dim=768):
        nn.Module.__init__(self)
        self.norm1, self.attn1 = LayerNorm(dim), Attention(dim)
        self.norm2, self.attn2 = LayerNorm(dim), Attention(dim, cross_dim)
        self.norm3, self.ff = LayerNorm(dim), GEGLUFeedForward(dim)

    def forward(self, h, encoder_hidden_states):
        h = add(h, self.attn1(self.norm1(h)))
        h = add(h, self.attn2(self.norm2(h), encoder_hidden_states))
        return add(h, self.ff(self.norm3(h)))


class Transformer2DModel(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.norm = GroupNorm(dim)
        self.proj_in = nn.Conv2d(dim, dim, 1)
        self.transformer_blocks = ModuleList([BasicTransformerBlock(dim)])
        self.proj_out = nn.Conv2d(dim, dim, 1)

    def forward(self, x, encoder_hidden_states):
        h = self.proj_in(self.norm(x))
        for block in self.transformer_blocks:
            h = block(h, encoder_hidden_states)
        return add(x, self.proj_out(h))


class Downsample2D(nn.Module):
    def __init__(self, ch):
        nn.Module.__init__(self)
        self.conv = nn.Conv2d(ch, ch, 3, stride=2, padding=1)

    def forward(self, x):
        return self.conv(x)


class Upsample2D(nn.Module):
    def __init__(self, ch):
        nn.Module.__init__(self)
        self.conv = nn.Conv2d(ch, ch, 3, padding=1)

    def forward(self, x):
        return self.conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))


class DownBlock2D(nn.Module):
    def __init__(self, cin, cout, attn, downsample):
        nn.Module.__init__(self)
        self.resnets = ModuleList([ResnetBlock2D(cin, cout), ResnetBlock2D(cout, cout)])
        if attn:
            self.attentions = ModuleList([Transformer2DModel(cout), Transformer2DModel(cout)])
        if downsample:
            self.downsamplers = ModuleList([Downsample2D(cout)])
        self.has_attn, self.has_down = attn, downsample

    def forward(self, x, temb, encoder_hidden_states):
        res = []
        for i, resnet in enumerate(self.resnets):
            x = resnet(x, temb)
            if self.has_attn:
                x = self.attentions[i](x, encoder_hidden_states)
            res.append(x)
        if self.has_down:
            x = self.downsamplers[0](x)
            res.append(x)
        return x, res


class UpBlock2D(nn.Module):
    def __init__(self, skip_chs, prev_ch, cout, attn, upsample):
        nn.Module.__init__(self)
        ins = [prev_ch + skip_chs[0], cout + skip_chs[1], cout + skip_chs[2]]
        self.resnets = ModuleList([ResnetBlock2D(c, cout) for c in ins])
        if attn:
            self.attentions = ModuleList([Transformer2DModel(cout) for _ in range(3)])
        if upsample:
            self.upsamplers = ModuleList([Upsample2D(cout)])
        self.has_attn, self.has_up = attn, upsample

    def forward(self, x, res, temb, encoder_hidden_states):
        for i, resnet in enumerate(self.resnets):
            x = resnet(cat([x, res.pop()]), temb)
            if self.has_attn:
                x = self.attentions[i](x, encoder_hidden_states)
        if self.has_up:
            x = self.upsamplers[0](x)
        return x


class UNetMidBlock2DCrossAttn(nn.Module):
    def __init__(self, ch):
        nn.Module.__init__(self)
        self.resnets = ModuleList([ResnetBlock2D(ch, ch), ResnetBlock2D(ch, ch)])
        self.attentions = ModuleList([Transformer2DModel(ch)])

    def forward(self, x, temb, encoder_hidden_states):
        x = self.resnets[0](x, temb)
        x = self.attentions[0](x, encoder_hidden_states)
        return self.resnets[1](x, temb)


class TimestepEmbedding(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linear_1, self.linear_2 = Linear(320, 1280), Linear(1280, 1280)

    def forward(self, t):
        return self.linear_2(silu(self.linear_1(t)))


class UNet2DConditionOutput(object):
    def __init__(self, sample):
        self.sample = sample


class UNet2DConditionModel(nn.Module):
    block_out_channels = (320, 640, 1280, 1280)

    def __init__(self):
        nn.Module.__init__(self)
        c = self.block_out_channels
        self.conv_in = nn.Conv2d(4, c[0], 3, padding=1)
        self.time_embedding = TimestepEmbedding()
        self.down_blocks = ModuleList([DownBlock2D(c[0], c[0], True, True), DownBlock2D(c[0], c[1], True, True),
                                       DownBlock2D(c[1], c[2], True, True), DownBlock2D(c[2], c[3], False, False)])
        self.mid_block = UNetMidBlock2DCrossAttn(c[3])
        self.up_blocks = ModuleList([
            UpBlock2D((c[3], c[3], c[2]), c[3], c[3], False, True),
            UpBlock2D((c[2], c[2], c[1]), c[3], c[2], True, True),
            UpBlock2D((c[1], c[1], c[0]), c[2], c[1], True, True),
            UpBlock2D((c[0], c[0], c[0]), c[1], c[0], True, False)])
        self.conv_norm_out = GroupNorm(c[0])
        self.conv_out = nn.Conv2d(c[0], 4, 3, padding=1)

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def forward(self, sample, timestep, encoder_hidden_states):
        temb = self.time_embedding(_fp32(timestep.nbytes // 4 * 320))
        x = self.conv_in(sample)
        res = [x]
        for block in self.down_blocks:
            x, r = block(x, temb, encoder_hidden_states)
            res.extend(r)
        x = self.mid_block(x, temb, encoder_hidden_states)
        for block in self.up_blocks:
            x = block(x, res, temb, encoder_hidden_states)
        return UNet2DConditionOutput(self.conv_out(silu(self.conv_norm_out(x))))


class DiagonalGaussianDistribution(object):
    def __init__(self, moments):
        self.moments = moments

    def sample(self):
        return _like(self.moments, 1, 2)


class AutoencoderKLOutput(object):
    def __init__(self, latent_dist):
        self.latent_dist = latent_dist


class VAEEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        ch = (128, 256, 512, 512)
        self.conv_in = nn.Conv2d(3, 128, 3, padding=1)
        blocks, prev = [], 128
        for i, c in enumerate(ch):
            blocks.append(ResnetBlock2D(prev, c, temb=0))
            blocks.append(ResnetBlock2D(c, c, temb=0))
            if i < 3:
                blocks.append(Downsample2D(c))
            prev = c
        self.down_blocks = ModuleList(blocks)
        self.mid_resnets = ModuleList([ResnetBlock2D(512, 512, temb=0), ResnetBlock2D(512, 512, temb=0)])
        self.mid_attn = Attention(512, heads=1)
        self.conv_norm_out = GroupNorm(512)
        self.conv_out = nn.Conv2d(512, 8, 3, padding=1)

    def forward(self, x):
        x = self.conv_in(x)
        for block in self.down_blocks:
            x = block(x)
        x = self.mid_resnets[1](self.mid_attn(self.mid_resnets[0](x)))
        return self.conv_out(silu(self.conv_norm_out(x)))


class VAEDecoder(VAEEncoder):
    """The decoder's weights (used only for sample images, not during training)."""

    def __init__(self):
        VAEEncoder.__init__(self)
        self.up_extra = ModuleList([ResnetBlock2D(c, c, temb=0) for c in (512, 512, 512, 256, 128)])


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = VAEEncoder()
        self.decoder = VAEDecoder()
        self.quant_conv = nn.Conv2d(8, 8, 1)
        self.post_quant_conv = nn.Conv2d(4, 4, 1)

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def encode(self, pixel_values):
        return AutoencoderKLOutput(DiagonalGaussianDistribution(self.quant_conv(self.encoder(pixel_values))))


class DDPMScheduler(object):
    num_train_timesteps = 1000

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def add_noise(self, latents, noise, timesteps):
        return _like(latents)


# --------------------------------------------------------------------------------------------------
# the training script
# --------------------------------------------------------------------------------------------------

class TextualInversionDataset(object):
    templates = ["a photo of a {}", "a rendering of a {}", "a cropped photo of the {}", "a close-up photo of a {}"]

    def __init__(self, data_root, tokenizer, size, placeholder_token, repeats=100):
        self.tokenizer, self.size, self.placeholder_token = tokenizer, size, placeholder_token
        self.num_images = 6
        self._length = self.num_images * repeats

    def __len__(self):
        return self._length

    def __getitem__(self, i):
        text = self.templates[i % len(self.templates)].format(self.placeholder_token)
        return {"input_ids": self.tokenizer(text), "pixel_values": (3, self.size, self.size)}


class DataLoader(object):
    def __init__(self, dataset, batch_size=1, shuffle=True):
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self):
        for i in range(0, len(self.dataset), self.batch_size):
            yield self.dataset[i]


def to_device(shape, batch_size):
    """batch["pixel_values"].to("cuda") of a float32 image batch."""
    c, h, w = shape
    return _fp32(batch_size * c * h * w)


class MSELoss(nn.Module):
    """F.mse_loss(noise_pred.float(), target.float(), reduction="mean")."""

    def forward(self, pred, target):
        sq = _like(pred)
        sq._saved = (pred, target)
        loss = _fp32(1)
        loss._saved = sq
        return loss


def main():
    args = Args()

    tokenizer = CLIPTokenizer.from_pretrained(args.pretrained_model_name_or_path, subfolder="tokenizer")
    noise_scheduler = DDPMScheduler.from_pretrained(args.pretrained_model_name_or_path, subfolder="scheduler")
    text_encoder = CLIPTextModel.from_pretrained(args.pretrained_model_name_or_path, subfolder="text_encoder")
    vae = AutoencoderKL.from_pretrained(args.pretrained_model_name_or_path, subfolder="vae")
    unet = UNet2DConditionModel.from_pretrained(args.pretrained_model_name_or_path, subfolder="unet")

    tokenizer.add_tokens(args.placeholder_token)
    text_encoder.resize_token_embeddings(len(tokenizer))
    # (the new row is initialised from the "cat" embedding)

    # only the new embedding is trained: the rest is frozen
    vae.eval()
    unet.eval()
    text_encoder.train()
    text_encoder.to(DEVICE)
    vae.to(DEVICE)
    unet.to(DEVICE)

    optimizer = torch.optim.AdamW(text_encoder.get_input_embeddings().parameters(), lr=args.learning_rate,
                                  betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    # keep the original embeddings as reference: every other token's row is put back after each step
    orig_embeds_params = text_encoder.get_input_embeddings().weight.detach().clone()

    train_dataset = TextualInversionDataset(args.train_data_dir, tokenizer, args.resolution, args.placeholder_token)
    train_dataloader = DataLoader(train_dataset, batch_size=args.train_batch_size, shuffle=True)
    criterion = MSELoss()

    global_step = 0
    for step, batch in enumerate(train_dataloader):
        bsz = args.train_batch_size
        with torch.no_grad():
            pixel_values = to_device(batch["pixel_values"], bsz)
            latents = vae.encode(pixel_values).latent_dist.sample()     # * 0.18215
            del pixel_values
        noise = _like(latents)                                           # torch.randn_like(latents)
        timesteps = torch.empty(bsz, dtype=torch.float32)                # torch.randint(0, 1000, (bsz,))
        noisy_latents = noise_scheduler.add_noise(latents, noise, timesteps)

        encoder_hidden_states = text_encoder(batch["input_ids"])[0]
        noise_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
        loss = criterion(noise_pred, noise)
        loss.backward()

        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad()
            global_step += 1
            # put back every row but the placeholder's (no new memory)
            _ = orig_embeds_params
        if global_step >= args.max_train_steps:
            break


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
