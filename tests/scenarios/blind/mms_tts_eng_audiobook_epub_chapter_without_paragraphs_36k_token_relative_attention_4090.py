"""epub_to_audiobook.py -- a volunteer's script that reads a public-domain EPUB aloud with Meta's MMS-TTS
(facebook/mms-tts-eng: a VITS model, 36M parameters, fp32, 16 kHz) on a desktop RTX 4090 (24 GiB),
following the model card, one paragraph per forward pass:

    model = VitsModel.from_pretrained("facebook/mms-tts-eng").to("cuda")
    tokenizer = AutoTokenizer.from_pretrained("facebook/mms-tts-eng")
    for chapter in book.chapters:
        for paragraph in chapter.text.split("\\n\\n"):               # the EPUB's <p> blocks
            inputs = tokenizer(paragraph, return_tensors="pt").to("cuda")
            with torch.no_grad():
                wav = model(**inputs).waveform
            chunks.append(wav.cpu())

Chapters 1-6 are ordinary paragraphs (~600 characters: 1,201 tokens, the tokenizer puts a blank
between characters).  Chapter 7 of this EPUB has no <p> tags -- its 18,000 characters come back as one
"paragraph": 36,001 tokens in one pass.  VITS's text encoder uses full self-attention with relative
position logits: for 2 heads the score matrix is 2 x 36,001^2 x 4 bytes = 9.7 GiB (it is made), and
the relative logits against 2N-1 positions are twice that, 19.3 GiB, with 13.5 GiB free: the first
layer of the text encoder fails.  (Even past it, the same chapter as one pass would make a HiFi-GAN
pass over 20 minutes of audio.)  Nothing leaks; every earlier paragraph needed a few hundred MiB.

An expert says first: this single input is far too long -- split the text into sentences (or cap
each chunk at a few hundred characters) and concatenate the audio: attention memory is quadratic in
the input, so 600-character chunks need ~12 MiB of scores.  Wrong advice: a smaller batch (batch is
one paragraph), inference_mode (no_grad already on), gradient checkpointing (no training),
expandable_segments / empty_cache (nothing is cached or fragmented), a bigger GPU or quantizing a
36M-parameter model, fp16 (halves it, the chapter is still one 36k-token pass), or flash attention as
the fix (VITS's relative-position attention has no such kernel, and the one-pass chapter would still
be wrong).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F32 = torch.float32
HIDDEN = 192
HEADS = 2
SR = 16000


def _p(module, name, n):
    setattr(module, name, torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda")))


class VitsAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for n in ("q_proj", "k_proj", "v_proj", "out_proj"):
            _p(self, n, HIDDEN * HIDDEN + HIDDEN)
        _p(self, "emb_rel_k", 9 * 96)
        _p(self, "emb_rel_v", 9 * 96)

    def forward(self, hidden_states, seq_len):
        q = torch.empty(seq_len * HIDDEN, dtype=F32, device="cuda")
        k = torch.empty(seq_len * HIDDEN, dtype=F32, device="cuda")
        v = torch.empty(seq_len * HIDDEN, dtype=F32, device="cuda")
        attn_weights = torch.empty(HEADS * seq_len * seq_len, dtype=F32, device="cuda")          # bmm(q, k^T)
        relative_logits = torch.empty(HEADS * seq_len * (2 * seq_len - 1), dtype=F32, device="cuda")
        rel_pos_bias = torch.empty(HEADS * seq_len * seq_len, dtype=F32, device="cuda")           # to absolute
        del relative_logits
        probs = torch.empty(HEADS * seq_len * seq_len, dtype=F32, device="cuda")                  # softmax
        del attn_weights, rel_pos_bias
        out = torch.empty(seq_len * HIDDEN, dtype=F32, device="cuda")
        del probs, q, k, v
        return out


class VitsEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = VitsAttention()
        self.feed_forward = torch.nn.Module()
        _p(self.feed_forward, "conv_1", HIDDEN * 768 * 3)
        _p(self.feed_forward, "conv_2", 768 * HIDDEN * 3)

    def forward(self, h, seq_len):
        a = self.attention(h, seq_len)
        f = torch.empty(seq_len * 768, dtype=F32, device="cuda")
        del f
        return a


class VitsTextEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        _p(self, "embed_tokens", 38 * HIDDEN)
        self.layers = torch.nn.Module()
        for i in range(6):
            setattr(self.layers, str(i), VitsEncoderLayer())

    def forward(self, input_ids, seq_len):
        h = torch.empty(seq_len * HIDDEN, dtype=F32, device="cuda")
        for i in range(6):
            h = getattr(self.layers, str(i))(h, seq_len)
        return h


class VitsModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.text_encoder = VitsTextEncoder()
        self.flow = torch.nn.Module()
        _p(self.flow, "couplings", 7_000_000)
        self.duration_predictor = torch.nn.Module()
        _p(self.duration_predictor, "flows", 1_200_000)
        self.decoder = torch.nn.Module()                 # HiFi-GAN: 13.9M
        _p(self.decoder, "upsampler", 13_900_000)
        self.posterior_encoder = torch.nn.Module()
        _p(self.posterior_encoder, "wavenet", 7_200_000)

    def forward(self, input_ids, seq_len):
        h = self.text_encoder(input_ids, seq_len)
        frames = seq_len * 2                              # ~2 spectrogram frames per token after durations
        samples = frames * 256
        z = torch.empty(frames * 192, dtype=F32, device="cuda")
        acts = [torch.empty(samples * c // r, dtype=F32, device="cuda") for c, r in ((256, 64), (128, 8), (64, 4), (32, 1))]
        del acts
        waveform = torch.empty(samples, dtype=F32, device="cuda")
        del z, h
        return waveform


def tokenize(text):
    return 2 * len(text) + 1                              # characters with a blank between each (add_blank)


def load_book():
    chapters = []
    for c in range(1, 7):
        chapters.append(["paragraph %d.%d " % (c, p) + "x" * 580 for p in range(40)])
    chapters.append(["chapter seven, no <p> tags " + "y" * 17_973])       # 18,000 characters, one block
    return chapters


def main():
    model = VitsModel().eval()
    chunks = []
    try:
        for c, chapter in enumerate(load_book(), 1):
            for paragraph in chapter:
                seq_len = tokenize(paragraph)
                input_ids = torch.empty(seq_len * 8, dtype=torch.uint8, device="cuda")       # int64 ids
                with torch.no_grad():
                    wav = model(input_ids, seq_len)
                chunks.append(wav.nbytes)                  # wav.cpu()
                del wav, input_ids
            sys.stderr.write("chapter %d: %d paragraphs done\n" % (c, len(chapter)))
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
