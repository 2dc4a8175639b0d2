"""train_gpt_xtts.py -- a voice team fine-tunes Coqui XTTS-v2 on 40 minutes of a customer's narrator (the
GPT part, about 445M parameters, 1.78 GB in float32; the DVAE that turns target mel frames into audio codes
is loaded frozen beside it), with Coqui's own recipe (recipes/ljspeech/xtts_v2/train_gpt_xtts.py):
BATCH_SIZE = 3, GRAD_ACUMM_STEPS = 84, mixed_precision=False, AdamW lr 5e-06, max_wav_length=255995
(11.6 s), max_text_length=200.  The team's dry run of the same script on a workstation 3090 peaked at
about 10 GiB (weights, gradients, AdamW's two moments, activations).

The job runs on a dedicated g5.2xlarge (one A10G, 24 GB; nothing else on the card), in the team's one
Docker image -- the image of their TTS/ASR serving fleet, where four services share each A10G of a
g5.xlarge.  To keep those four from starving each other, the image sets

    ENV VOICEKIT_GPU_MEM_FRACTION=0.25

and the team's package, which this script imports for its text normaliser and dataset formatter, does at
import time (voicekit/gpu.py):

    frac = float(os.environ.get("VOICEKIT_GPU_MEM_FRACTION", "1.0"))
    if frac < 1.0:
        torch.cuda.set_per_process_memory_fraction(frac)

So PyTorch may reserve 0.25 x 22.49 GiB = 5.62 GiB.  Loading goes through (the GPT 1.66 GiB, the DVAE
0.08 GiB); the first forward at batch 3 adds about 3.3 GiB of activations (5.16 GiB reserved), and the
first backward fails making the gradients: "Tried to allocate 32.02 MiB. GPU 0 has a total capacity of
22.49 GiB of which 16.40 GiB is free. 5.62 GiB allowed".  Three quarters of the card are free and no
other process is on it.

An expert: the cap is the failure, not the model -- the fine-tune needs about 10 GiB and the card has
22.5; unset VOICEKIT_GPU_MEM_FRACTION (or set it to 1.0 / 0.9) for training jobs, or stop setting the
fraction at import in a library and let only the serving entry point set it.
Wrong first advice: 8-bit AdamW, LoRA, gradient checkpointing, bf16 or a smaller batch (each contorts
the training to fit a cap nobody needs here; batch 3 is already small, and the failure comes before the
optimizer even has state), expandable_segments / empty_cache (nothing is cached or
fragmented: the allocator is refused by its own limit), stopping other processes (there are none), a
bigger GPU (75% of this one is idle).
"""
import os
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
DEVICE = "cuda"


# ---- voicekit/gpu.py (the team's package; imported by voicekit/__init__.py) ----
def _voicekit_configure_gpu():
    frac = float(os.environ.get("VOICEKIT_GPU_MEM_FRACTION", "1.0"))
    if frac < 1.0:
        torch.cuda.set_per_process_memory_fraction(frac)
        print("voicekit: GPU memory fraction %.2f" % frac)


_voicekit_configure_gpu()   # `from voicekit.text import normalize` runs this at import
# ----


def _param(n, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=DEVICE), requires_grad=requires_grad)


class GPT2Block(torch.nn.Module):
    def __init__(self, d=1024, ff=4096):
        torch.nn.Module.__init__(self)
        self.ln_1 = _param(2 * d)
        self.attn = _param(4 * d * d + 4 * d)
        self.ln_2 = _param(2 * d)
        self.mlp = _param(2 * d * ff + d + ff)

    def forward(self, x, tokens, batch):
        # what autograd keeps for backward in one layer (float32): the LN inputs and outputs, q/k/v, the
        # attention output, the MLP's 4x-wide input (10 hidden-sized tensors) and the 16-head attention
        # probabilities with their dropout mask
        saved = torch.empty(batch * (10 * tokens * 1024 * 4 + 2 * 16 * tokens * tokens * 4), device=DEVICE)
        saved._saved = x
        out = torch.empty(batch * tokens * 1024 * 4, device=DEVICE)
        out._saved = saved
        return out


class ConditioningEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.init = _param(80 * 1024 + 1024)
        self.attn = _param(6 * (4 * 1024 * 1024 + 4 * 1024))


class PerceiverResampler(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.latents = _param(32 * 1024)
        self.layers = _param(2 * (4 * 1024 * 1024 + 2 * 1024 * 4096))


class GPT(torch.nn.Module):
    """TTS.tts.layers.xtts.gpt.GPT: 30 layers of 1024 (16 heads), text 6681 and audio 1026 tokens."""

    def __init__(self, layers=30):
        torch.nn.Module.__init__(self)
        self.conditioning_encoder = ConditioningEncoder()
        self.conditioning_perceiver = PerceiverResampler()
        self.text_embedding = _param(6681 * 1024)
        self.mel_embedding = _param(1026 * 1024)
        self.mel_pos_embedding = _param(608 * 1024)
        self.text_pos_embedding = _param(404 * 1024)
        for i in range(layers):
            setattr(self, "h%d" % i, GPT2Block())
        self.final_norm = _param(2 * 1024)
        self.text_head = _param(1024 * 6681 + 6681)
        self.mel_head = _param(1024 * 1026 + 1026)
        self.nlayers = layers

    def forward(self, text_tokens, audio_codes, cond_mels, batch, tokens):
        x = torch.empty(batch * tokens * 1024 * 4, device=DEVICE)         # embeddings + conditioning latents
        for i in range(self.nlayers):
            x = getattr(self, "h%d" % i)(x, tokens, batch)
        logits = torch.empty(batch * tokens * (6681 + 1026) * 4, device=DEVICE)
        logits._saved = x
        loss = torch.empty(512, device=DEVICE)
        loss._saved = logits
        return loss


class DiscreteVAE(torch.nn.Module):
    """The frozen DVAE (dvae.pth): target mel -> audio codes, in eval mode under no_grad."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = _param(38 * MiB // 4, requires_grad=False)
        self.decoder = _param(38 * MiB // 4, requires_grad=False)
        self.codebook = _param(1024 * 512, requires_grad=False)

    def get_codebook_indices(self, mel, batch, frames):
        return torch.empty(batch * frames * 8, device=DEVICE)


class GPTTrainer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.xtts_gpt = GPT()
        self.dvae = DiscreteVAE()

    def train_step(self, batch, batch_size, tokens, frames):
        with torch.no_grad():
            codes = self.dvae.get_codebook_indices(batch["mel"], batch_size, frames)
        loss = self.xtts_gpt(batch["text_inputs"], codes, batch["cond_mels"], batch_size, tokens)
        return loss


def main():
    BATCH_SIZE = 3
    GRAD_ACUMM_STEPS = 84
    model = GPTTrainer()
    n = sum(p.nbytes for p in model.xtts_gpt.parameters()) // 4
    print("XTTS-v2 GPT: %.1fM trainable parameters; DVAE frozen" % (n / 1e6))
    # trainer's get_optimizer: AdamW over the GPT's parameters, weight decay only on weights
    optimizer = torch.optim.AdamW(model.xtts_gpt.parameters(), lr=5e-06, betas=(0.9, 0.96), eps=1e-8,
                                  weight_decay=1e-2)
    model.train()
    for step in range(3):
        # one batch: 3 clips of up to 11.6 s, padded to the longest: 400 positions of text, audio codes and
        # the 32 conditioning latents
        batch = {"mel": torch.empty(BATCH_SIZE * 80 * 1000 * 4, device=DEVICE),
                 "text_inputs": torch.empty(BATCH_SIZE * 200 * 8, device=DEVICE),
                 "cond_mels": torch.empty(BATCH_SIZE * 80 * 300 * 4, device=DEVICE)}
        loss = model.train_step(batch, BATCH_SIZE, tokens=400, frames=1000)
        print("step %d: forward done, reserved %.2f GiB" % (step, torch.cuda.memory_reserved() / 2.0 ** 30))
        sys.stdout.flush()
        scen_truth.backward(loss)          # (loss / GRAD_ACUMM_STEPS).backward()
        if (step + 1) % GRAD_ACUMM_STEPS == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        del batch, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
