"""summarize_service.py -- a news-summarization batch service (BART-large-class encoder-decoder, fp16,
0.8 GiB of weights) on a 24 GiB card, 32 articles of up to 1024 tokens per batch.  It ran for
months with num_beams=4; a "quality" change to the model's generation_config.json raised it to 16:

    model = AutoModelForSeq2SeqLM.from_pretrained(path, torch_dtype=torch.float16).cuda()
    # generation_config.json: {"num_beams": 16, "max_new_tokens": 142, "length_penalty": 2.0}
    for articles in batched(queue, 32):
        enc = tok(articles, truncation=True, max_length=1024, padding=True, return_tensors="pt").to("cuda")
        with torch.inference_mode():
            out = model.generate(**enc)                     # num_beams from the config: 16

generate() expands the encoder states to every beam (32 x 16 = 512 hypotheses) and the first
decoder step builds each layer's cross-attention keys and values for all of them: 2 x 1 GiB per
layer, 24 GiB for the 12 layers.  It fails at the first decoding step of the first batch, in the
eleventh layer; with 4 beams the same cache was 6 GiB and the service ran at ~9 GiB.  Nothing grows
over time, nothing leaks, no other process.  An expert: the beam width (16 -> 4, or keep 16 and
send 8 articles per batch); not a leak fix, not gradient checkpointing (no training), not a
restart, not a bigger GPU first.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
GENERATION_CONFIG = {"num_beams": 16, "max_new_tokens": 142, "length_penalty": 2.0}
BATCH, SRC, D_MODEL, LAYERS = 32, 1024, 1024, 12


class BartForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(98 * MiB, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "encoder_layer%d" % i, torch.nn.Parameter(torch.empty(24 * MiB, device="cuda")))
            setattr(self, "decoder_layer%d" % i, torch.nn.Parameter(torch.empty(32 * MiB, device="cuda")))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def encode(self, input_ids, n):
        work = torch.empty(n * SRC * D_MODEL * 2 * 8, device="cuda")           # encoder activations
        states = torch.empty(n * SRC * D_MODEL * 2, device="cuda")
        del work
        return states

    def generate(self, input_ids, n, num_beams, max_new_tokens, length_penalty):
        hyps = n * num_beams
        states = self.encode(input_ids, n)
        expanded = torch.empty(hyps * SRC * D_MODEL * 2, device="cuda")        # encoder states per beam
        del states
        cross_kv = []
        self_kv = []
        for t in range(max_new_tokens):
            for layer in range(LAYERS):
                if t == 0:
                    cross_kv.append(torch.empty(hyps * SRC * D_MODEL * 2, device="cuda"))   # cross-attn K
                    cross_kv.append(torch.empty(hyps * SRC * D_MODEL * 2, device="cuda"))   # cross-attn V
            self_kv.append(torch.empty(hyps * LAYERS * 2 * D_MODEL * 2, device="cuda"))
            scores = torch.empty(hyps * 50265 * 4, device="cuda")
            del scores
        return t + 1


def main():
    model = BartForConditionalGeneration.from_pretrained("org/news-summarizer", torch_dtype=torch.float16)
    with torch.inference_mode():
        model.generate(None, 1, num_beams=GENERATION_CONFIG["num_beams"], max_new_tokens=8,
                       length_penalty=2.0)                                   # warm-up request
    for batch in range(1000):
        input_ids = torch.empty(BATCH * SRC * 8, device="cuda")
        with torch.inference_mode():
            out = model.generate(input_ids, BATCH, **GENERATION_CONFIG)
        del input_ids, out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
