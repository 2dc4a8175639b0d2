"""F5-TTS v1 Base fine-tuned on a single RTX 4090 with the pretraining config's frame budget.

The story (what the user really ran)
------------------------------------
A user adapts F5-TTS (flow-matching DiT text-to-speech, "F5TTS_v1_Base": dim 1024, 22 blocks, 16 heads,
ff_mult 2, text_dim 512, 4 ConvNeXt-V2 text blocks, 100-band mel at 24 kHz / hop 256 = 93.75 frames per
second) to a new language: ~120 h of read audiobook speech, clips of 3-12 s.  They copied
F5TTS_v1_Base.yaml, set the dataset name and the pretrained checkpoint, and launched

    accelerate launch --mixed_precision bf16 src/f5_tts/train/train.py --config-name F5TTS_v1_Base_pl.yaml

on their one RTX 4090 (24 GB).  The yaml still says what it says for the 8 x A100 80GB pretraining run:

    optim:  batch_size_per_gpu: 38400   batch_size_type: frame   max_samples: 64   grad_accumulation_steps: 1
    model:  checkpoint_activations: False

so DynamicBatchSampler packs each batch up to 38,400 mel frames (~410 s of audio): the first batch is 36
clips padded to 1,041 frames = 37,476 frames.  The Trainer (accelerate, bf16 autocast on every forward)
builds the CFM model, keeps an EMA copy of it on the GPU (ema_pytorch EMA(model, include_online_model=False),
.to(accelerator.device) on the main process), makes AdamW (state at its first step), and dies in the very
first forward, in the 13th of the 22 DiT blocks:

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 146.39 MiB. GPU 0 has a total capacity of
    24576.00 MiB of which 22.00 MiB is free. Of the allocated memory 23918.53 MiB is allocated by PyTorch,
    and 123.47 MiB is reserved by PyTorch but unallocated.

The arithmetic (d = 1024, N = 37,476 frames)
--------------------------------------------
  weights      ~341M params fp32                      1.27 GiB
  EMA copy     the same, on the GPU                   1.27 GiB
  CUDA context                                        ~0.5 GiB
  text embedding: 4 ConvNeXt-V2 blocks over N filler-padded positions x 512 ch, ~9 KB kept per position
  each, + input embedding and conv position embedding                                   ~1.85 GiB
  each DiT block under bf16 autocast keeps for backward 40 bytes x d per frame:
    LN out fp32 (4d), three bf16 casts of the fp32 modulated input, one per to_q/to_k/to_v (autocast casts
    per op: 6d), q/k after RoPE, v, SDPA out, to_out (5 x 2d), residual (2d), ff LN fp32 (4d) + cast (2d),
    ff hidden before/after GELU (2 x 4d), ff out (2d), residual (2d)
    = 40 x 1024 x 37,476 = 1.53 GB = 1.43 GiB per block, + 29 MB of autocast's bf16 weight copies: 1.46 GiB
  -> 22 blocks want ~32 GiB of activations; after weights, EMA, context and embeddings ~19 GiB are left,
     so the 13th block fails (on its 146 MiB GELU output).  Gradients (1.27 GiB) and AdamW state (2.5 GiB)
     have not even been made yet.  The whole step needs ~40 GiB: what the config was written for is 80 GB.

What an expert says
-------------------
The model fits easily (weights + EMA + grads + Adam = 6.3 GiB); the *batch* does not: 38,400 frames per GPU
is the pretraining budget for 80 GB cards.  First: lower batch_size_per_gpu (frames), e.g. 9,600-12,800, and
keep the effective batch with grad_accumulation_steps 3-4 (activations are linear in the frame budget: a
third of it is ~11 GiB of blocks, ~18 GiB for the whole step).  Equally good: checkpoint_activations: True in
the model config (torch.utils.checkpoint around each DiT block: 22 x 77 MB of block inputs + one block
recomputed, ~3.1 GiB instead of ~32 GiB, ~11 GiB for the whole step) at ~30 % more step time.  Either
alone covers the shortfall; both together let the frame budget stay high.
Smaller extras: EMA on CPU (1.27 GiB), 8-bit AdamW (for the state still to come) -- not enough alone.

Wrong advice: mixed precision (bf16 autocast is already on: every activation above is already bf16 where
it can be), flash-attention (F.scaled_dot_product_attention already runs the memory-efficient kernel: no
T x T score matrix is kept, attention is not where the memory goes), shorter sequences / capped input size
(a TTS clip cannot be truncated without breaking its text alignment, and with frame-based batching shorter
clips only mean more clips per batch: same frames, same memory), expandable_segments / empty_cache (no
fragmentation, nothing cached to give back: it is live activations), inference_mode (training), releasing
references (nothing leaks: it is the first step), quantization, ZeRO/FSDP (one GPU).

The program below is that trainer condensed, on the stand-in torch: torch.nn has no Linear / LayerNorm /
Embedding and there is no F.scaled_dot_product_attention, so the few ops the model uses are written out as
PyTorch runs them under bf16 autocast -- each makes its output tensor and keeps what its backward needs.
"""
import copy
import os
import random

import torch
import torch.nn as nn
from torch.autograd._graph import derive

import scen_truth

scen_truth.note_every_empty(torch)


# ---------------------------------------------------------------------------------------------------------
# The torch ops the model uses, as PyTorch runs them under autocast (the stand-in torch lacks them): a tensor
# carries its shape; an op's output keeps (in _saved) the tensors its backward needs, as autograd does.
# ---------------------------------------------------------------------------------------------------------

def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def new_tensor(shape, dtype=torch.float32):
    t = torch.empty(_numel(shape), dtype=dtype)
    t.shape = tuple(shape)
    return t


def _autocast_dtype():
    return torch.bfloat16 if torch.is_autocast_enabled("cuda") else None


_weight_cast_cache = {}     # autocast's cache of bf16 copies of the fp32 weights, cleared when autocast exits


def _cast_weight(w):
    dt = _autocast_dtype()
    if dt is None:
        return w
    c = _weight_cast_cache.get(id(w))
    if c is None:
        c = _weight_cast_cache[id(w)] = derive(torch.empty(w.nbytes // 4, dtype=dt), w)
    return c


def _graph_of(t):
    """What the graph behind t keeps (t's own saved tensors), without t itself: an op whose backward does not
    need its input (a cast, an add) keeps the graph going but lets the input go."""
    return getattr(t, "_saved", None)


def _cast_input(x):
    dt = _autocast_dtype()
    if dt is None or x.dtype == dt:
        return x
    c = new_tensor(x.shape, dt)
    c._saved = _graph_of(x)
    return derive(c, x)


class Linear(nn.Module):
    """torch.nn.Linear: fp32 weight; under autocast input and weight are cast to bf16 (the cast input is what
    backward keeps), output bf16."""

    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32)) if bias else None

    def forward(self, x):
        xc = _cast_input(x)
        w = _cast_weight(self.weight)
        out = new_tensor(x.shape[:-1] + (self.out_features,), _autocast_dtype() or torch.float32)
        out._saved = (xc, w)
        return derive(out, xc, self.weight)


class LayerNorm(nn.Module):
    """torch.nn.LayerNorm: autocast runs it in fp32 (fp32 output); backward keeps its input and stats."""

    def __init__(self, dim, elementwise_affine=True, eps=1e-6):
        nn.Module.__init__(self)
        self.dim = dim
        if elementwise_affine:
            self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
            self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        out = new_tensor(x.shape, torch.float32)
        out._saved = x
        return derive(out, x)


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32))

    def forward(self, ids):
        out = new_tensor(ids.shape + (self.dim,), torch.float32)
        return derive(out, self.weight)


def elementwise(x, *others, dtype=None, saves=None):
    """An elementwise op (GELU, SiLU, Mish, a modulation x*(1+scale)+shift, a gated residual, an add): a new
    tensor of x's shape; `saves`: what its backward needs (default: x), the rest only keeps its graph."""
    out = new_tensor(x.shape, dtype or x.dtype)
    saves = (x,) if saves is None else tuple(saves)
    out._saved = saves + tuple(_graph_of(t) for t in (x,) + others)
    return derive(out, x, *others)


def scaled_dot_product_attention(q, k, v):
    """F.scaled_dot_product_attention with a padding mask on an sm_89 card: the memory-efficient kernel; the
    output (bf16) and a per-row logsumexp (fp32, tiny) are all it adds -- no T x T matrix is kept."""
    b, t, d = q.shape
    out = new_tensor(q.shape, q.dtype)
    lse = new_tensor((b, 16, t), torch.float32)
    out._saved = (q, k, v, lse)
    return derive(out, q, k, v)


# ---------------------------------------------------------------------------------------------------------
# f5_tts/model/modules.py, backbones/dit.py, cfm.py (condensed)
# ---------------------------------------------------------------------------------------------------------

class DepthwiseConv1d(nn.Module):
    """nn.Conv1d(dim, dim, kernel, groups=groups): dim x (dim/groups) x kernel weights."""

    def __init__(self, dim, kernel, groups):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim * (dim // groups) * kernel, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        xc = _cast_input(x)
        out = new_tensor(x.shape, _autocast_dtype() or torch.float32)
        out._saved = (xc, _cast_weight(self.weight))
        return derive(out, xc, self.weight)


class GRN(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.gamma = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.beta = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        # Gx = norm over time, Nx = Gx / mean: gamma * (x * Nx) + beta + x, fp32 by the promotion with gamma
        return elementwise(x, self.gamma, dtype=torch.float32)


class ConvNeXtV2Block(nn.Module):
    def __init__(self, dim, intermediate_dim):
        nn.Module.__init__(self)
        self.dwconv = DepthwiseConv1d(dim, 7, dim)
        self.norm = LayerNorm(dim)
        self.pwconv1 = Linear(dim, intermediate_dim)
        self.grn = GRN(intermediate_dim)
        self.pwconv2 = Linear(intermediate_dim, dim)

    def forward(self, x):
        residual = x
        x = self.dwconv(x)
        x = self.norm(x)
        x = self.pwconv1(x)
        x = elementwise(x)                      # GELU
        x = self.grn(x)
        x = self.pwconv2(x)
        return elementwise(x, residual, dtype=torch.float32, saves=())     # residual + x


class TextEmbedding(nn.Module):
    def __init__(self, text_num_embeds, text_dim, conv_layers=4, conv_mult=2):
        nn.Module.__init__(self)
        self.text_embed = Embedding(text_num_embeds + 1, text_dim)      # 0 is the filler token
        self.text_blocks = nn.Module()
        for i in range(conv_layers):
            setattr(self.text_blocks, str(i), ConvNeXtV2Block(text_dim, text_dim * conv_mult))
        self.conv_layers = conv_layers

    def forward(self, text, seq_len):
        # text is padded with the filler token up to the mel length: the text blocks run over every frame
        x = self.text_embed(text)
        for i in range(self.conv_layers):
            x = getattr(self.text_blocks, str(i))(x)
        return x


class ConvPositionEmbedding(nn.Module):
    def __init__(self, dim, kernel_size=31, groups=16):
        nn.Module.__init__(self)
        self.conv1 = DepthwiseConv1d(dim, kernel_size, groups)
        self.conv2 = DepthwiseConv1d(dim, kernel_size, groups)

    def forward(self, x):
        x = elementwise(self.conv1(x))          # Mish
        return elementwise(self.conv2(x))


class InputEmbedding(nn.Module):
    def __init__(self, mel_dim, text_dim, out_dim):
        nn.Module.__init__(self)
        self.proj = Linear(mel_dim * 2 + text_dim, out_dim)
        self.conv_pos_embed = ConvPositionEmbedding(out_dim)

    def forward(self, x, cond, text_embed):
        b, t, _ = x.shape
        cat = new_tensor((b, t, x.shape[-1] + cond.shape[-1] + text_embed.shape[-1]), torch.float32)
        cat._saved = tuple(_graph_of(i) for i in (x, cond, text_embed))              # torch.cat saves nothing
        x = self.proj(derive(cat, x, cond, text_embed))
        return elementwise(self.conv_pos_embed(x), x, saves=())                    # conv_pos_embed(x) + x


class TimestepEmbedding(nn.Module):
    def __init__(self, dim, freq_embed_dim=256):
        nn.Module.__init__(self)
        self.lin1 = Linear(freq_embed_dim, dim)
        self.lin2 = Linear(dim, dim)

    def forward(self, t):
        return self.lin2(elementwise(self.lin1(t)))


class AdaLayerNormZero(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.linear = Linear(dim, dim * 6)
        self.norm = LayerNorm(dim, elementwise_affine=False)

    def forward(self, x, emb):
        emb = self.linear(elementwise(emb))     # SiLU -> 6 x dim per sample: shift/scale/gate for attn and ff
        x = self.norm(x)
        x = elementwise(x, emb, saves=(x, emb))  # x * (1 + scale_msa) + shift_msa, fp32
        return x, emb


class Attention(nn.Module):
    def __init__(self, dim, heads=16, dim_head=64):
        nn.Module.__init__(self)
        self.heads = heads
        self.to_q = Linear(dim, heads * dim_head)
        self.to_k = Linear(dim, heads * dim_head)
        self.to_v = Linear(dim, heads * dim_head)
        self.to_out = Linear(heads * dim_head, dim)

    def forward(self, x, rope):
        q, k, v = self.to_q(x), self.to_k(x), self.to_v(x)
        q = elementwise(q, rope, saves=(rope,))  # apply_rotary_pos_emb: backward needs only cos/sin
        k = elementwise(k, rope, saves=(rope,))
        out = scaled_dot_product_attention(q, k, v)
        return self.to_out(out)


class FeedForward(nn.Module):
    def __init__(self, dim, mult=2):
        nn.Module.__init__(self)
        self.ff1 = Linear(dim, dim * mult)
        self.ff2 = Linear(dim * mult, dim)

    def forward(self, x):
        return self.ff2(elementwise(self.ff1(x)))     # GELU(tanh)


class DiTBlock(nn.Module):
    def __init__(self, dim, heads, dim_head, ff_mult):
        nn.Module.__init__(self)
        self.attn_norm = AdaLayerNormZero(dim)
        self.attn = Attention(dim, heads, dim_head)
        self.ff_norm = LayerNorm(dim, elementwise_affine=False)
        self.ff = FeedForward(dim, ff_mult)

    def forward(self, x, t, rope):
        norm, emb = self.attn_norm(x, emb=t)
        attn_output = self.attn(norm, rope)
        x = elementwise(attn_output, x, emb, saves=(attn_output, emb))   # x + gate_msa * attn_output (bf16)
        norm = self.ff_norm(x)
        norm = elementwise(norm, emb, saves=(norm, emb))                  # * (1 + scale_mlp) + shift_mlp
        ff_output = self.ff(norm)
        return elementwise(ff_output, x, emb, saves=(ff_output, emb))    # x + gate_mlp * ff_output


class DiT(nn.Module):
    def __init__(self, dim=1024, depth=22, heads=16, dim_head=64, ff_mult=2, mel_dim=100, text_num_embeds=2545,
                 text_dim=512, conv_layers=4, checkpoint_activations=False):
        nn.Module.__init__(self)
        self.time_embed = TimestepEmbedding(dim)
        self.text_embed = TextEmbedding(text_num_embeds, text_dim, conv_layers)
        self.input_embed = InputEmbedding(mel_dim, text_dim, dim)
        self.transformer_blocks = nn.Module()
        for i in range(depth):
            setattr(self.transformer_blocks, str(i), DiTBlock(dim, heads, dim_head, ff_mult))
        self.depth = depth
        self.norm_out = AdaLayerNormZero(dim)
        self.proj_out = Linear(dim, mel_dim)
        self.checkpoint_activations = checkpoint_activations

    def forward(self, x, cond, text, time, drop_audio_cond=False, drop_text=False):
        b, seq_len, _ = x.shape
        t = self.time_embed(time)
        text_embed = self.text_embed(text, seq_len)
        x = self.input_embed(x, cond, text_embed)
        rope = new_tensor((seq_len, 64), torch.float32)
        for i in range(self.depth):
            block = getattr(self.transformer_blocks, str(i))
            # checkpoint_activations False (the yaml): every block keeps its activations until backward
            x = block(x, t, rope)
        x, _ = self.norm_out(x, t)
        return self.proj_out(x)


class CFM(nn.Module):
    """Conditional flow matching around the DiT: noise, a random time, the interpolated input, an infilling
    mask (70-100 % of each clip hidden from the condition)."""

    def __init__(self, transformer, num_channels=100):
        nn.Module.__init__(self)
        self.transformer = transformer
        self.num_channels = num_channels

    def forward(self, inp, text, lens):
        b, seq_len, dim = inp.shape
        x1 = inp
        x0 = new_tensor(x1.shape, torch.float32)                     # torch.randn_like(x1)
        time = new_tensor((b, 256), torch.float32)
        phi = elementwise(x1, x0, saves=())                         # (1 - t) * x0 + t * x1
        flow = elementwise(x1, x0, saves=())                        # x1 - x0
        cond = elementwise(x1, saves=())                            # torch.where(rand_span_mask, 0, x1)
        pred = self.transformer(x=phi, cond=cond, text=text, time=time)
        loss = elementwise(pred, flow, dtype=torch.float32)         # F.mse_loss(pred, flow, reduction="none")
        return loss, cond, pred


# ---------------------------------------------------------------------------------------------------------
# f5_tts/model/dataset.py + trainer.py (condensed)
# ---------------------------------------------------------------------------------------------------------

HOP, SR = 256, 24000

CONFIG = {
    # F5TTS_v1_Base.yaml, copied for the fine-tune; only datasets.name and the checkpoint were changed
    "datasets": {"name": "audiobooks_pl_char", "batch_size_per_gpu": 38400, "batch_size_type": "frame",
                 "max_samples": 64, "num_workers": 16},
    "optim": {"epochs": 100, "learning_rate": 1e-5, "num_warmup_updates": 2000, "grad_accumulation_steps": 1,
              "max_grad_norm": 1.0},
    "model": {"name": "F5TTS_v1_Base", "arch": {"dim": 1024, "depth": 22, "heads": 16, "ff_mult": 2,
                                                "text_dim": 512, "conv_layers": 4,
                                                "checkpoint_activations": False},
              "mel_spec": {"n_mel_channels": 100, "hop_length": HOP, "target_sample_rate": SR}},
}


def clip_frames(rng, n):
    """Durations of the fine-tuning corpus: 3-12 s read-speech clips, in mel frames."""
    return [int(rng.uniform(3.0, 12.0) * SR / HOP) for _ in range(n)]


class DynamicBatchSampler(object):
    """Sorted by length, each batch filled while its frames stay under frames_threshold (and max_samples)."""

    def __init__(self, durations, frames_threshold, max_samples, seed=666):
        order = sorted(range(len(durations)), key=lambda i: durations[i])
        self.batches, batch, frames = [], [], 0
        for i in order:
            if frames + durations[i] <= frames_threshold and len(batch) < max_samples:
                batch.append(i)
                frames += durations[i]
            else:
                if batch:
                    self.batches.append(batch)
                batch, frames = [i], durations[i]
        if batch:
            self.batches.append(batch)
        random.Random(seed).shuffle(self.batches)

    def __iter__(self):
        return iter(self.batches)


def collate_to_gpu(durations, batch, n_mels):
    """collate_fn pads mel and text to the longest clip; the trainer moves the batch to the GPU."""
    t = max(durations[i] for i in batch)
    mel = new_tensor((len(batch), t, n_mels), torch.float32)
    text = new_tensor((len(batch), t), torch.float32)            # char ids, filler-padded (int64 in F5: small)
    lens = new_tensor((len(batch),), torch.float32)
    return {"mel": mel, "text": text, "mel_lengths": lens}


class EMA(object):
    """ema_pytorch.EMA(model, include_online_model=False): a deep copy of the model, no gradients."""

    def __init__(self, model, beta=0.9999, update_every=10, include_online_model=True):
        self.ema_model = copy.deepcopy(model)
        for p in self.ema_model.parameters():
            p.requires_grad_(False)
        self.beta, self.update_every, self.step = beta, update_every, 0

    def update(self):
        self.step += 1


class Trainer(object):
    def __init__(self, model, cfg):
        self.model = model
        self.cfg = cfg
        # accelerate launch --mixed_precision bf16: every forward of the prepared model runs under bf16 autocast
        self.mixed_precision = os.environ.get("ACCELERATE_MIXED_PRECISION", "no")
        self.is_main = True
        if self.is_main:
            self.ema_model = EMA(model, include_online_model=False)
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["optim"]["learning_rate"])
        self.grad_accumulation_steps = cfg["optim"]["grad_accumulation_steps"]
        self.global_update = 0

    def train(self, durations):
        ds = self.cfg["datasets"]
        sampler = DynamicBatchSampler(durations, ds["batch_size_per_gpu"], ds["max_samples"])
        n_mels = self.cfg["model"]["mel_spec"]["n_mel_channels"]
        for epoch in range(self.cfg["optim"]["epochs"]):
            self.model.train()
            for batch_idx in sampler:
                batch = collate_to_gpu(durations, batch_idx, n_mels)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=self.mixed_precision == "bf16"):
                    loss, cond, pred = self.model(batch["mel"], text=batch["text"], lens=batch["mel_lengths"])
                _weight_cast_cache.clear()
                loss.backward()
                self.optimizer.step()
                self.optimizer.zero_grad()
                self.ema_model.update()
                self.global_update += 1


def main():
    cfg = CONFIG
    arch = cfg["model"]["arch"]
    transformer = DiT(dim=arch["dim"], depth=arch["depth"], heads=arch["heads"], ff_mult=arch["ff_mult"],
                      text_dim=arch["text_dim"], conv_layers=arch["conv_layers"],
                      mel_dim=cfg["model"]["mel_spec"]["n_mel_channels"],
                      checkpoint_activations=arch["checkpoint_activations"])
    model = CFM(transformer=transformer, num_channels=cfg["model"]["mel_spec"]["n_mel_channels"])
    # the pretrained model_1250000.safetensors is loaded into model and EMA on the CPU side (map_location cpu)
    trainer = Trainer(model, cfg)
    durations = clip_frames(random.Random(0), 60000)              # ~120 h of clips
    trainer.train(durations)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
