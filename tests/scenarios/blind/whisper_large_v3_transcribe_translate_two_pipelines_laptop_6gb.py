"""subtitle_tool.py -- a desktop tool that makes both original-language and English subtitles for a
folder of interviews, on a laptop's RTX 3060 (6 GB; Xorg and the desktop shell hold ~340 MiB).  The
author followed the model card (fp16, as it recommends) and believed the task is fixed per pipeline:

    asr = pipeline("automatic-speech-recognition", model="openai/whisper-large-v3",
                   torch_dtype=torch.float16, device="cuda:0")
    translator = pipeline("automatic-speech-recognition", model="openai/whisper-large-v3",
                          torch_dtype=torch.float16, device="cuda:0",
                          generate_kwargs={"task": "translate"})

Each pipeline loads its own copy of the same 1.55B-parameter model (2.86 GiB in fp16).  The second
load runs out of memory in its decoder layers, before a single file has been transcribed.  One copy
and the batch of 30-second chunks fit with room to spare.

An expert: one model -- the task is a generate() argument (`asr(audio, generate_kwargs={"task":
"translate"})`), or build the second pipeline from the first's model and processor
(`pipeline(..., model=asr.model, tokenizer=asr.tokenizer, feature_extractor=asr.feature_extractor)`).
Not loading in half precision (it already is fp16), not a smaller batch or checkpointing (nothing has
run yet), not stopping the desktop (340 MiB would not cover a second copy), not expandable_segments
or empty_cache.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class EncoderLayer(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.self_attn = nn.Parameter(torch.empty(6553600, dtype=dtype, device="cuda"), requires_grad=False)
        self.fc = nn.Parameter(torch.empty(13107200, dtype=dtype, device="cuda"), requires_grad=False)


class DecoderLayer(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.self_attn = nn.Parameter(torch.empty(6553600, dtype=dtype, device="cuda"), requires_grad=False)
        self.encoder_attn = nn.Parameter(torch.empty(6553600, dtype=dtype, device="cuda"), requires_grad=False)
        self.fc = nn.Parameter(torch.empty(13107200, dtype=dtype, device="cuda"), requires_grad=False)


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.encoder = nn.Module()
        self.decoder = nn.Module()
        self.embed_tokens = nn.Parameter(torch.empty(66060288, dtype=dtype, device="cuda"), requires_grad=False)
        for i in range(32):
            setattr(self.encoder, "layers_%d" % i, EncoderLayer(dtype))
        for i in range(32):
            setattr(self.decoder, "layers_%d" % i, DecoderLayer(dtype))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        model = cls(torch_dtype or torch.float32)
        model.eval()
        return model


class AutomaticSpeechRecognitionPipeline(object):
    def __init__(self, model, generate_kwargs=None):
        self.model = model
        self.generate_kwargs = dict(generate_kwargs or {})


def pipeline(task, model, torch_dtype=None, device=None, generate_kwargs=None):
    m = WhisperForConditionalGeneration.from_pretrained(model, torch_dtype=torch_dtype)
    return AutomaticSpeechRecognitionPipeline(m, generate_kwargs)


def main():
    asr = pipeline("automatic-speech-recognition", model="openai/whisper-large-v3",
                   torch_dtype=torch.float16, device="cuda:0")
    translator = pipeline("automatic-speech-recognition", model="openai/whisper-large-v3",
                          torch_dtype=torch.float16, device="cuda:0",
                          generate_kwargs={"task": "translate"})
    return asr, translator


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
