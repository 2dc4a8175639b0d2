"""translate_docs.py -- batch translation of support articles with NLLB-200 3.3B (fp16, 6.5 GiB) on a
24 GiB card, Hugging Face style, run with plain `LD_PRELOAD=liboomguard.so`:

    model = AutoModelForSeq2SeqLM.from_pretrained("nllb-200-3.3B", torch_dtype=torch.float16).cuda()
    out = model.generate(**batch, num_beams=16, max_new_tokens=256)    # 32 sentences of up to 200 tokens

Quality reviewers asked for "more beams", so num_beams went from 4 to 16.  generate() expands every
sentence into 16 beams: 512 sequences.  At the first decoder step each of the 24 decoder layers
caches the cross-attention keys and values of the encoder output for all 512 sequences (512 x 200
tokens x 2048 x 2 (K, V) x fp16 = 800 MiB a layer, 18.75 GiB for the 24 layers); with the weights and
the expanded encoder output the card runs out at layer 22.  With num_beams=4 the same batch takes
4.7 GiB of cache and fits.

An expert: the beam width multiplies everything generate() keeps per sequence; fewer beams (4-5 are
the usual quality plateau for NMT), or fewer sentences per batch.  Not an autograd problem
(generate runs under no_grad), not fragmentation, not a leak; training remedies are meaningless.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

D_MODEL = 2048
N_ENC, N_DEC = 24, 24


class EncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(50 * MiB, dtype=torch.float16, device="cuda"))

    def forward(self, h):
        out = torch.empty(h.nbytes, device="cuda")
        return out


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(67 * MiB, dtype=torch.float16, device="cuda"))

    def forward(self, h, encoder_hidden_states, layer_past):
        if not layer_past:
            # cross-attention K and V of the encoder output, computed once and cached for every step
            layer_past.append(torch.empty(2 * encoder_hidden_states.nbytes, device="cuda"))
        layer_past.append(torch.empty(2 * h.nbytes, device="cuda"))          # self-attention K, V of this step
        return torch.empty(h.nbytes, device="cuda")


class M2M100ForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(256206 * D_MODEL, dtype=torch.float16, device="cuda"))
        self.encoder_layers = [EncoderLayer() for _ in range(N_ENC)]
        self.decoder_layers = [DecoderLayer() for _ in range(N_DEC)]
        for i, m in enumerate(self.encoder_layers):
            setattr(self, "encoder_%d" % i, m)
        for i, m in enumerate(self.decoder_layers):
            setattr(self, "decoder_%d" % i, m)

    def encode(self, input_ids, batch, src_len):
        h = torch.empty(batch * src_len * D_MODEL, dtype=torch.float16, device="cuda")
        for layer in self.encoder_layers:
            h = layer(h)
        return h

    def forward(self, decoder_input_ids, encoder_hidden_states, past_key_values, n_seq):
        h = torch.empty(n_seq * D_MODEL, dtype=torch.float16, device="cuda")
        for layer, layer_past in zip(self.decoder_layers, past_key_values):
            h = layer(h, encoder_hidden_states, layer_past)
        logits = torch.empty(n_seq * 256206, dtype=torch.float32, device="cuda")
        return logits

    def generate(self, input_ids, num_beams=1, max_new_tokens=256, batch=1, src_len=1):
        encoder_out = self.encode(input_ids, batch, src_len)
        return self._beam_search(encoder_out, num_beams, max_new_tokens, batch, src_len)

    def _beam_search(self, encoder_out, num_beams, max_new_tokens, batch, src_len):
        # expand the encoder output to every beam (repeat_interleave: a copy)
        encoder_hidden_states = torch.empty(encoder_out.nbytes * num_beams, device="cuda")
        n_seq = batch * num_beams
        past_key_values = [[] for _ in range(N_DEC)]
        beam_scores = torch.empty(n_seq * 4, device="cuda")
        tokens = torch.empty(n_seq * 8, device="cuda")
        for step in range(max_new_tokens):
            logits = self(tokens, encoder_hidden_states, past_key_values, n_seq)
            tokens = torch.empty(n_seq * 8, device="cuda")
            del logits
        return tokens


def from_pretrained(name, torch_dtype=None):
    return M2M100ForConditionalGeneration()


def main():
    model = from_pretrained("facebook/nllb-200-3.3B", torch_dtype=torch.float16).cuda()
    model.eval()
    articles = [list(range(32)) for _ in range(500)]
    translated = []
    for batch_ids in articles:
        with torch.no_grad():
            out = model.generate(batch_ids, num_beams=16, max_new_tokens=256, batch=32, src_len=200)
        translated.append(out)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
