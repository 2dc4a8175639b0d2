"""embed_server.py -- a document-embedding endpoint (a 560M-parameter rotary encoder in fp16, eager
attention, 16 heads) behind a micro-batcher that pads each batch to its longest document; the
tokenizer is called without truncation, so nothing caps the input length:

    @app.post("/embed")
    def embed(docs):
        batch = tok(docs, padding="longest", return_tensors="pt").to("cuda")    # truncation off
        with torch.inference_mode():
            return model(**batch).last_hidden_state[:, 0].float().cpu()

Hundreds of batches of 8 documents of a few hundred tokens go through at ~2 GiB.  Then a client
posts a 20,000-token contract in a batch of 4: one layer's attention scores (4 x 16 x 20k x 20k x
2 bytes, 47.7 GiB) are twice the card.  An expert: cap the input length (truncation=True,
max_length=8192, or split long documents into passages); SDPA/flash attention makes the scores
O(n) and helps next.  This is inference: not checkpointing, not a smaller model.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
HEADS, HIDDEN, LAYERS = 16, 1024, 24


class EncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
        self.ffn = torch.nn.Parameter(torch.empty(28 * MiB, device="cuda"))

    def forward(self, h, bsz, seq):
        qkv = torch.empty(bsz * seq * HIDDEN * 3 * 2, device="cuda")
        scores = torch.empty(bsz * HEADS * seq * seq * 2, device="cuda")     # softmax(q k^T), eager
        ctx = torch.empty(bsz * seq * HIDDEN * 2, device="cuda")
        del scores, qkv
        return torch.empty(bsz * seq * HIDDEN * 2, device="cuda")


class Encoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(250002 * HIDDEN * 2 // 4, device="cuda"))
        self.layers = [EncoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids, bsz, seq):
        h = torch.empty(bsz * seq * HIDDEN * 2, device="cuda")
        for layer in self.layers:
            h = layer(h, bsz, seq)
        return h


def requests():
    """The micro-batcher's batches: (documents, longest length in tokens)."""
    for i in range(600):
        if i == 480:
            yield 4, 20000                      # the contract, padded with three short notes
        else:
            yield 8, 128 + (i * 53) % 640


def main():
    model = Encoder().eval()
    for bsz, seq in requests():
        with torch.inference_mode():
            input_ids = torch.empty(bsz * seq * 8, device="cuda")
            out = model(input_ids, bsz, seq)
            emb = torch.empty(bsz * HIDDEN * 4, device="cuda")        # [:, 0].float()
            del out, input_ids, emb
        if seq > 600:
            time.sleep(0.001)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
