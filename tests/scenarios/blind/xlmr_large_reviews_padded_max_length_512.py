"""train_sentiment.py -- 3-class sentiment on multilingual product reviews (1.2M reviews, median 60
tokens, 95th percentile 210) by fine-tuning xlm-roberta-large (560M parameters, fp32: an fp16 run
diverged, so we went back to full precision) on one A10G (24 GB).  transformers 4.39 (eager attention
for XLM-R), AdamW, batch 16 -- already halved from 32 after the first OOM:

    def tokenize(ex):
        return tok(ex["text"], truncation=True, padding="max_length", max_length=512)
    ds = ds.map(tokenize, batched=True)
    loader = DataLoader(ds, batch_size=16, shuffle=True, collate_fn=default_data_collator)

It still dies in the first forward pass, around layer 19 of 24.  Every batch is 16 x 512 tokens
although almost every review is under 210: the encoder keeps about 1.1 GiB of activations per layer
for backward (the 16 heads' 512 x 512 attention probabilities, their dropout mask and output, the
4096-wide FFN activations), nearly all of it for padding.

An expert: pad each batch to its own longest text (padding=True / DataCollatorWithPadding, or
padding="longest"), ideally with length-grouped batches (group_by_length=True): the batches shrink to a
few hundred tokens and the O(n^2) attention parts by much more; a lower max_length (256) is the
blunt version.  Mixed precision or checkpointing would also help but are not the first thing to
change.  An 8-bit optimizer, LoRA, quantization, sharding or CPU offload miss the point (the optimizer
state does not exist yet; the activations of padding fill the card); it is training, not inference.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN = 1024
HEADS = 16
LAYERS = 24
FFN = 4096
VOCAB = 250002


def fp32(nbytes):
    return torch.nn.Parameter(torch.empty(nbytes // 4, dtype=torch.float32, device="cuda"))


def act(elems, prev, dtype=torch.float32):
    """An activation autograd saves for backward, in the graph after `prev`."""
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev
    return t


class XLMRobertaSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = fp32(HIDDEN * HIDDEN * 4)
        self.key = fp32(HIDDEN * HIDDEN * 4)
        self.value = fp32(HIDDEN * HIDDEN * 4)

    def forward(self, hidden_states, attention_mask, batch, seq):
        tok = batch * seq * HIDDEN
        q = act(tok, hidden_states)
        k = act(tok, q)
        v = act(tok, k)
        attention_scores = torch.empty(batch * HEADS * seq * seq, dtype=torch.float32, device="cuda")   # q @ k^T / sqrt(d)
        attention_scores = torch.empty(batch * HEADS * seq * seq, dtype=torch.float32, device="cuda")   # + attention_mask
        attention_probs = act(batch * HEADS * seq * seq, v)                                            # softmax
        del attention_scores
        dropout_mask = act(batch * HEADS * seq * seq, attention_probs, torch.uint8)
        attention_probs = act(batch * HEADS * seq * seq, dropout_mask)                                 # dropout
        context = act(tok, attention_probs)                                                            # probs @ v
        return context


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = XLMRobertaSelfAttention()
        self.attention_output = fp32(HIDDEN * HIDDEN * 4 + 3 * HIDDEN * 4)
        self.intermediate = fp32(HIDDEN * FFN * 4 + FFN * 4)
        self.output = fp32(FFN * HIDDEN * 4 + 3 * HIDDEN * 4)

    def forward(self, hidden_states, attention_mask, batch, seq):
        tok = batch * seq * HIDDEN
        context = self.attention(hidden_states, attention_mask, batch, seq)
        h = act(tok, context)                                   # dense
        h = act(batch * seq * HIDDEN // 4, h, torch.uint8)      # dropout mask
        h = act(tok, h)                                         # LayerNorm(h + residual)
        inter = act(batch * seq * FFN, h)                       # intermediate dense
        inter = act(batch * seq * FFN, inter)                   # GELU
        out = act(tok, inter)                                   # output dense
        out = act(batch * seq * HIDDEN // 4, out, torch.uint8)  # dropout mask
        return act(tok, out)                                    # LayerNorm


class XLMRobertaForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels=3):
        torch.nn.Module.__init__(self)
        self.word_embeddings = fp32(VOCAB * HIDDEN * 4)
        self.position_embeddings = fp32(514 * HIDDEN * 4)
        self.layers = []
        for i in range(LAYERS):
            layer = XLMRobertaLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.classifier = fp32(HIDDEN * HIDDEN * 4 + HIDDEN * num_labels * 4)

    def forward(self, input_ids, attention_mask, labels):
        batch, seq = input_ids["batch"], input_ids["seq"]
        hidden = act(batch * seq * HIDDEN, None)                # embeddings + LayerNorm + dropout
        for layer in self.layers:
            hidden = layer(hidden, attention_mask, batch, seq)
        logits = act(batch * 3, hidden)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(self.parameters())
        return loss


def tokenize(texts, truncation=True, padding="max_length", max_length=512):
    """The tokenizer's output as the collator stacks it: every row padded to max_length."""
    longest = max(len(t.split()) for t in texts)
    seq = max_length if padding == "max_length" else min(longest, max_length)
    return {"batch": len(texts), "seq": seq}


def reviews():
    lengths = [60, 35, 120, 48, 210, 75, 22, 90, 64, 41, 150, 58, 33, 80, 97, 51]
    while True:
        yield ["w " * n for n in lengths]


def main():
    model = XLMRobertaForSequenceClassification(num_labels=3)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    batch_size = 16
    max_length = 512
    for step, texts in enumerate(reviews()):
        enc = tokenize(texts[:batch_size], truncation=True, padding="max_length", max_length=max_length)
        input_ids = torch.empty(batch_size * max_length * 8, dtype=torch.uint8, device="cuda")
        enc_mask = torch.empty(batch_size * max_length * 8, dtype=torch.uint8, device="cuda")
        loss = model(enc, enc_mask, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, enc_mask
        if step > 1000:
            break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
