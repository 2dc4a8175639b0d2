"""train_tickets.py -- fine-tuning BAAI/bge-m3 (XLM-RoBERTa-large architecture, 568M parameters,
fp32 weights, bf16 autocast, SDPA attention) as a 12-way classifier of customer-support tickets on a
24 GiB card, batch 16.  The tickets are short (median 60 tokens, 99th percentile 400), but the
tokenisation follows a tutorial:

    enc = tokenizer(texts, padding="max_length", truncation=True,
                    max_length=tokenizer.model_max_length)          # bge-m3: 8192

so every batch is 16 x 8192 tokens, 99% of them padding, and the encoder runs on all of them: ~4.3
GiB of activations per layer for 24 layers.  The first forward pass fails in the 5th layer's FFN.

An expert: the sequences are padded to the model's maximum, not to the data: pad per batch to the
longest ticket (padding=True / DataCollatorWithPadding, or max_length=512 with truncation), ideally
with length-grouped batches; the batch is then ~16 x 128 tokens and fits many times over.  Not a
smaller batch or gradient checkpointing as the fix (they only make room for the padding), not
quantization or a bigger GPU, not the allocator's settings.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
# the truth mark's request in bytes: scen_truth.note_every_empty notes torch.empty's first argument,
# which the stand-in counts in elements of the dtype given; note the bytes (compiled as part of torch's
# file, as scen_truth's wrapper is, so that the failing Python line stays the program's)
_NOTED_BYTES = """
def noted_bytes(n, *args, **kw):
    dtype = kw.get("dtype", args[0] if args else None)
    _last.update(n=int(n) * _ITEMSIZE[dtype or "uint8"], reserved=torch.cuda.memory_reserved())
    return plain(n, *args, **kw)
"""
_ns = {"_last": scen_truth._last, "torch": torch, "plain": torch.empty, "_ITEMSIZE": torch._ITEMSIZE}
exec(compile(_NOTED_BYTES, torch.__file__, "exec"), _ns)
torch.empty = _ns["noted_bytes"]

H, FFN, LAYERS, VOCAB = 1024, 4096, 24, 250002


class Tokenizer(object):
    model_max_length = 8192

    def __call__(self, texts, padding=False, truncation=False, max_length=None, return_tensors="pt"):
        longest = max(len(t.split()) * 2 for t in texts)
        n = max_length if padding == "max_length" else min(longest, max_length or longest)
        return {"input_ids": (len(texts), n), "attention_mask": (len(texts), n)}


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(3 * H * H, dtype=torch.float32, device="cuda"))
        self.out = torch.nn.Parameter(torch.empty(H * H, dtype=torch.float32, device="cuda"))
        self.intermediate = torch.nn.Parameter(torch.empty(H * FFN, dtype=torch.float32, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty(FFN * H, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        saved = hidden
        # attention block (SDPA: no seq x seq matrix): q, k, v, attention output, dense, layernorm
        for _ in range(6):
            a = torch.empty(tokens * H, dtype=torch.bfloat16, device="cuda")
            a._saved = saved
            saved = a
        # FFN: intermediate (4 x H) before and after GELU, output dense, dropout mask, layernorm
        for width in (FFN, FFN, H, H, H):
            a = torch.empty(tokens * width, dtype=torch.bfloat16, device="cuda")
            a._saved = saved
            saved = a
        return saved


class XLMRobertaForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels=12):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(VOCAB * H, dtype=torch.float32, device="cuda"))
        self.position_embeddings = torch.nn.Parameter(torch.empty(8194 * H, dtype=torch.float32, device="cuda"))
        self.layer = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layer, str(i), XLMRobertaLayer())
        self.classifier = torch.nn.Parameter(torch.empty(H * num_labels, dtype=torch.float32, device="cuda"))

    def forward(self, input_ids, attention_mask=None):
        b, s = input_ids
        tokens = b * s
        h = torch.empty(tokens * H, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            h = getattr(self.layer, str(i))(h, tokens)
        logits = torch.empty(b * 12 * 4, device="cuda")
        logits._saved = h
        logits._params = tuple(self.parameters())
        return logits


def tickets():
    while True:
        yield ["my order %d never arrived and the tracking page says label created" % i for i in range(16)]


batch_size = 16


def train(model, tokenizer, optimizer):
    for step, texts in enumerate(tickets()):
        enc = tokenizer(texts, padding="max_length", truncation=True, max_length=tokenizer.model_max_length)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(**enc)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = logits, logits._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    model = XLMRobertaForSequenceClassification()
    tokenizer = Tokenizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    train(model, tokenizer, optimizer)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
