"""transcribe_episodes.ipynb (as a script) -- I transcribe our podcast back catalogue with Whisper large-v3
(fp16, 2.9 GiB) through a transformers pipeline, batch_size=16 chunks of 30 s, on the team's shared
workstation: one RTX 4090 (24 GB, 23.99 GiB as torch reports it).  My notebook runs in its own
container.

    asr = pipeline("automatic-speech-recognition", "openai/whisper-large-v3", torch_dtype=torch.float16,
                   device="cuda:0", chunk_length_s=30, batch_size=16)
    for ep in episodes:
        text = asr(ep.path)["text"]

Yesterday the whole catalogue went through; peak use was about 6 GiB.  Today the first batch dies in the
encoder's attention (eager, 16 x 20 heads x 1500^2 scores, 1.3 GiB, then its softmax): 2.6 GiB were
free when the batch started, 0.8 GiB when the softmax asked for 1.3 GiB.  nvidia-smi in my container shows 18 GiB used and lists no process of mine beyond the
pipeline's: a colleague left ComfyUI running (another container, so its pid is a host pid) with Flux
and its T5 encoder loaded -- 18 GiB.

An expert: this process needs about 6 GiB and the card has 24; someone else's process holds 18 GiB.
Get that memory back first: ask the colleague to stop ComfyUI or unload its models (or run it
--lowvram), or agree who uses the card when.  Shrinking my job (smaller batch, quantized Whisper,
flash attention) would squeeze under today's leftover but treats the wrong thing; empty_cache, a
restart of my kernel or expandable_segments free nothing of the other process's.
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

D_MODEL, HEADS, FRAMES = 1280, 20, 1500


def fp16_param(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=torch.float16, device="cuda"), requires_grad=False)


class WhisperAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.qkv_proj = fp16_param(3 * D_MODEL * D_MODEL * 2)

    def forward(self, hidden, batch):
        qkv = torch.empty(3 * batch * FRAMES * D_MODEL, dtype=torch.float16, device="cuda")
        attn_weights = torch.empty(batch * HEADS * FRAMES * FRAMES, dtype=torch.float16, device="cuda")
        attn_probs = torch.empty(batch * HEADS * FRAMES * FRAMES, dtype=torch.float16, device="cuda")  # softmax
        return torch.empty(batch * FRAMES * D_MODEL, dtype=torch.float16, device="cuda")


class WhisperEncoderLayer(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.self_attn = WhisperAttention()
        self.fc = fp16_param(nbytes - 3 * D_MODEL * D_MODEL * 2)

    def forward(self, hidden, batch):
        return self.self_attn(hidden, batch)


class WhisperEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv = fp16_param(8 * MiB)
        for i in range(32):
            setattr(self, "layer_%d" % i, WhisperEncoderLayer(38 * MiB))

    def forward(self, input_features, batch):
        conv_out = torch.empty(batch * D_MODEL * 3000, dtype=torch.float16, device="cuda")
        hidden = torch.empty(batch * FRAMES * D_MODEL, dtype=torch.float16, device="cuda")
        for i in range(32):
            hidden = getattr(self, "layer_%d" % i)(hidden, batch)
        return hidden


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = WhisperEncoder()
        self.decoder_and_head = fp16_param(2957 * MiB - 8 * MiB - 32 * 38 * MiB)

    def generate(self, input_features, batch):
        encoder_outputs = self.encoder(input_features, batch)
        return ["..."] * batch


class AutomaticSpeechRecognitionPipeline(object):
    def __init__(self, model, batch_size=16, chunk_length_s=30):
        self.model, self.batch_size, self.chunk_length_s = model, batch_size, chunk_length_s

    def __call__(self, path, n_chunks):
        texts = []
        with torch.inference_mode():
            for start in range(0, n_chunks, self.batch_size):
                batch = min(self.batch_size, n_chunks - start)
                input_features = torch.empty(batch * 128 * 3000, dtype=torch.float16, device="cuda")   # log-mel
                texts.extend(self.model.generate(input_features, batch))
        return {"text": " ".join(texts)}


def main():
    asr = AutomaticSpeechRecognitionPipeline(WhisperForConditionalGeneration().eval(), batch_size=16,
                                             chunk_length_s=30)
    episodes = [("ep101_supply_chains.mp3", 118), ("ep102_open_weights.mp3", 131)]   # 30-s chunks each
    for path, n_chunks in episodes:
        text = asr(path, n_chunks)["text"]


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
