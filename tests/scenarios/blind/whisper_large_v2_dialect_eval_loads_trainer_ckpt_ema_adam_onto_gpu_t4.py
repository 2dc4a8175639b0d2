"""eval_dialect_asr.py -- scoring a fine-tuned Whisper large-v2 (1.55B parameters) on the held-out
dialect test set (Swiss-German field recordings) on the lab's spare T4 (15 GiB).  The model was
fine-tuned on a rented A100 80GB with a hand-written loop that saves one file per epoch:

    torch.save({"model": model.state_dict(), "ema": ema.state_dict(),
                "optimizer": optimizer.state_dict(), "epoch": epoch}, f"ckpt/epoch{epoch}.pt")

The evaluation script, written by a second student, does what the loop's README says:

    model = WhisperForConditionalGeneration(config).cuda().eval()     # fp32, 5.8 GiB
    ckpt = torch.load("ckpt/epoch7.pt")                               # <- dies here
    model.load_state_dict(ckpt["ema"])                                # the EMA weights score best

torch.load restores every tensor onto the device it was saved from (cuda:0): the file holds the
model (5.8 GiB), the EMA copy (5.8 GiB) and AdamW's two moments (11.5 GiB), 23 GiB in all, on top
of the 5.8 GiB model already built on the card.  The model's own weights and the first 8.7 GiB of
the checkpoint fit in the T4's 14.5 GiB; the load fails half way through the EMA tensors,
before one utterance is decoded.  Inference itself (fp32 weights, a 30 s window, batch 8 under
inference_mode) needs about 7 GiB: the job fits the T4 easily once the load is right.

What the user says: "large-v2 is too big for a T4?  it does inference on 8 GB cards."  What an
expert says first: load the checkpoint into host memory, torch.load(path, map_location="cpu"),
and copy only the EMA state dict into the model (better still: save an inference-only file of
the EMA weights, in fp16).  Wrong advice: a smaller batch or shorter audio (nothing has run yet),
quantization or a bigger card (the model fits), gradient checkpointing (no training), the
allocator's settings or empty_cache (nothing is cached: every byte is a live checkpoint tensor),
other processes (there are none).
"""
import json
import os
import sys
import tempfile

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20

D_MODEL = 1280
VOCAB = 51865
LAYERS = 32                     # encoder and decoder each
# per layer, fp32: self-attention 4 x 1280^2, MLP 2 x 1280 x 5120 (~ 78 MiB); the decoder's cross-attention more
ENC_LAYER = 75 * MiB
DEC_LAYER = 100 * MiB
EMBED = VOCAB * D_MODEL * 4     # token embedding, tied with the output projection


class WhisperLayer(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(nbytes, device="cuda"))


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = nn.Module()
        self.decoder = nn.Module()
        self.encoder.conv = WhisperLayer(25 * MiB)
        for i in range(LAYERS):
            setattr(self.encoder, "layers_%d" % i, WhisperLayer(ENC_LAYER))
        self.decoder.embed_tokens = WhisperLayer(EMBED)
        for i in range(LAYERS):
            setattr(self.decoder, "layers_%d" % i, WhisperLayer(DEC_LAYER))


def state_sizes(model):
    return dict(("param%d" % i, p.nbytes) for i, p in enumerate(model.parameters()))


def stand_in_checkpoint(path, sizes):
    """What the A100 run's torch.save wrote (the stand-in's torch.load reads {name: bytes})."""
    ck = {}
    for prefix in ("model", "ema"):
        for i, (n, b) in enumerate(sizes.items()):
            ck["%s.%s" % (prefix, n)] = b
    for i, (n, b) in enumerate(sizes.items()):
        ck["optimizer.state.%d.exp_avg" % i] = b
        ck["optimizer.state.%d.exp_avg_sq" % i] = b
    with open(path, "w") as f:
        json.dump(ck, f)


def main():
    model = WhisperForConditionalGeneration().cuda().eval()
    print("model on cuda: %.2f GiB" % (torch.cuda.memory_allocated() / (1 << 30)))
    ckpt_dir = tempfile.mkdtemp(prefix="ckpt")
    path = os.path.join(ckpt_dir, "epoch7.pt")
    stand_in_checkpoint(path, state_sizes(model))

    ckpt = torch.load(path)                                   # every tensor back onto cuda:0
    ema = dict((k.split(".", 1)[1], v) for k, v in ckpt.items() if k.startswith("ema."))
    model.load_state_dict(ema)
    del ckpt, ema

    with torch.inference_mode():
        for _ in range(3):
            mel = torch.empty(8 * 80 * 3000 * 4, device="cuda")
            enc = torch.empty(8 * 1500 * D_MODEL * 4 * 6, device="cuda")
            del mel, enc
    print("WER computed")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
