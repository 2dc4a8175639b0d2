"""finetune_summarizer.py -- fine-tuning flan-t5-large (783M parameters, fp32: about 3 GiB) to summarise
customer-support chats, on one 24 GB card.  The chats are short (about 200 tokens on average, the
longest under 700; the summaries about 40), but the preprocessing was copied from a tutorial:

    def preprocess(batch):
        model_inputs = tokenizer(batch["dialogue"], max_length=1024, padding=<to max_length>, truncation=True)
        labels = tokenizer(text_target=batch["summary"], max_length=256, padding=<to max_length>, truncation=True)
    train_ds = raw_ds.map(preprocess, batched=True)
    loader = DataLoader(train_ds, batch_size=8, shuffle=True)      # default collate: every batch 8 x 1024
    for batch in loader:
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

T5 has no fused attention (its relative position bias goes into the scores), so each encoder layer
keeps, for backward, the fp32 scores, their softmax and the dropped-out probabilities of 8 x 16 heads
x 1024 x 1024 (512 MiB each), plus the feed-forward's 2816-wide activations: about 2.4 GiB per layer,
almost all of it spent on padding.  The very first forward runs out in the 9th of the 24 encoder
layers (the softmax's 512 MiB), before the decoder starts; no optimizer state exists yet.

An expert: pad each batch to its own longest input (DataCollatorForSeq2Seq, padding="longest"; or just
max_length=768/128 with dynamic padding), which cuts the sequence about five-fold and the attention
memory about 25-fold; a shorter max_length is the other half of the same fix.  Gradient
checkpointing and bf16 would also help but leave the job computing on padding.  Not flash attention
(T5's position bias rules it out), not an 8-bit optimizer, LoRA or ZeRO (the weights and optimizer
are not what fills the card), not inference mode, not the allocator's cache or fragmentation.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
MAX_SOURCE_LEN = 1024
MAX_TARGET_LEN = 256
D_MODEL, N_HEADS, D_FF, N_LAYERS, VOCAB = 1024, 16, 2816, 24, 32128


def preprocess(batch):
    model_inputs = tokenizer(batch["dialogue"], max_length=MAX_SOURCE_LEN, padding="max_length", truncation=True)
    labels = tokenizer(text_target=batch["summary"], max_length=MAX_TARGET_LEN, padding="max_length", truncation=True)
    model_inputs["labels"] = labels["input_ids"]
    return model_inputs


class AutoTokenizer(object):
    """What the job uses of the Hugging Face tokenizer: token ids, padded as asked (stand-in: lengths)."""

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, texts=None, text_target=None, max_length=None, padding=False, truncation=False):
        seqs = texts if texts is not None else text_target
        out = []
        for s in seqs:
            n = min(len(s.split()) * 4 // 3 + 2, max_length)
            pad_to = max_length if padding in ("max_length",) else n
            out.append([1] * n + [0] * (pad_to - n))
        return {"input_ids": out, "attention_mask": [[1 if t else 0 for t in ids] for ids in out]}


def linear(n_in, n_out):
    return nn.Parameter(torch.empty(n_in * n_out * 4, device="cuda"))


class T5Attention(nn.Module):
    def __init__(self, cross=False):
        nn.Module.__init__(self)
        self.q, self.k, self.v, self.o = (linear(D_MODEL, D_MODEL) for _ in range(4))

    def forward(self, hidden, position_bias):
        bsz = hidden.nbytes // (MAX_SOURCE_LEN * D_MODEL * 4)
        seq = MAX_SOURCE_LEN
        q = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")
        q._saved = hidden
        k = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")
        k._saved = q
        v = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")
        v._saved = k
        scores = torch.empty(bsz * N_HEADS * seq * seq * 4, device="cuda")     # q @ k^T, then += position_bias
        scores._saved = v
        attn_weights = torch.empty(bsz * N_HEADS * seq * seq * 4, device="cuda")   # softmax(scores.float())
        attn_weights._saved = scores
        drop_mask = torch.empty(bsz * N_HEADS * seq * seq, device="cuda")          # dropout's bool mask
        drop_mask._saved = attn_weights
        attn_dropped = torch.empty(bsz * N_HEADS * seq * seq * 4, device="cuda")
        attn_dropped._saved = drop_mask
        ctx = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")
        ctx._saved = attn_dropped
        out = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")
        out._saved = ctx
        return out


class T5DenseGatedActDense(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.wi_0, self.wi_1, self.wo = linear(D_MODEL, D_FF), linear(D_MODEL, D_FF), linear(D_FF, D_MODEL)

    def forward(self, hidden):
        tokens = hidden.nbytes // (D_MODEL * 4)
        h0 = torch.empty(tokens * D_FF * 4, device="cuda")
        h0._saved = hidden
        gelu = torch.empty(tokens * D_FF * 4, device="cuda")
        gelu._saved = h0
        h1 = torch.empty(tokens * D_FF * 4, device="cuda")
        h1._saved = gelu
        prod = torch.empty(tokens * D_FF * 4, device="cuda")
        prod._saved = h1
        mask = torch.empty(tokens * D_FF, device="cuda")
        mask._saved = prod
        dropped = torch.empty(tokens * D_FF * 4, device="cuda")
        dropped._saved = mask
        out = torch.empty(tokens * D_MODEL * 4, device="cuda")
        out._saved = dropped
        return out


class T5Block(nn.Module):
    def __init__(self, decoder=False):
        nn.Module.__init__(self)
        self.self_attn = T5Attention()
        if decoder:
            self.cross_attn = T5Attention(cross=True)
        self.ff = T5DenseGatedActDense()

    def forward(self, hidden, position_bias):
        normed = torch.empty(hidden.nbytes, device="cuda")           # T5LayerNorm
        normed._saved = hidden
        attn_out = self.self_attn(normed, position_bias)
        hidden = torch.empty(attn_out.nbytes, device="cuda")         # residual
        hidden._saved = attn_out
        normed2 = torch.empty(hidden.nbytes, device="cuda")
        normed2._saved = hidden
        ff_out = self.ff(normed2)
        out = torch.empty(ff_out.nbytes, device="cuda")
        out._saved = ff_out
        return out


class T5Stack(nn.Module):
    def __init__(self, decoder=False):
        nn.Module.__init__(self)
        self.blocks = [T5Block(decoder) for _ in range(N_LAYERS)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block_%d" % i, b)

    def forward(self, input_ids, attention_mask):
        bsz = len(input_ids)
        seq = len(input_ids[0])
        hidden = torch.empty(bsz * seq * D_MODEL * 4, device="cuda")          # embed_tokens
        position_bias = torch.empty(bsz * N_HEADS * seq * seq * 4, device="cuda")   # bias + extended mask
        for block in self.blocks:
            hidden = block(hidden, position_bias)
        return hidden


class T5ForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.shared = linear(VOCAB, D_MODEL)
        self.encoder = T5Stack()
        self.decoder = T5Stack(decoder=True)
        self.lm_head = linear(D_MODEL, VOCAB)

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, input_ids, attention_mask, labels):
        encoder_hidden = self.encoder(input_ids, attention_mask)
        decoder_hidden = self.decoder(labels, None)
        logits = torch.empty(len(labels) * len(labels[0]) * VOCAB * 4, device="cuda")
        logits._saved = decoder_hidden
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        return loss


def chats(n):
    topics = ["refund for a double charge", "password reset loop", "parcel stuck in customs", "plan downgrade"]
    return [{"dialogue": " ".join(["Customer: hi, about my %s ..." % topics[i % 4]] * (10 + i % 25)),
             "summary": "Customer asked about the %s; agent resolved it." % topics[i % 4]} for i in range(n)]


def batches(ds, batch_size):
    for i in range(0, len(ds["input_ids"]), batch_size):
        yield {k: v[i:i + batch_size] for k, v in ds.items()}


tokenizer = AutoTokenizer.from_pretrained("google/flan-t5-large")


def main():
    raw = chats(256)
    train_ds = preprocess({"dialogue": [r["dialogue"] for r in raw], "summary": [r["summary"] for r in raw]})
    model = T5ForConditionalGeneration.from_pretrained("google/flan-t5-large")
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    per_device_train_batch_size = 8
    for epoch in range(3):
        for batch in batches(train_ds, per_device_train_batch_size):
            loss = model(**batch)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
