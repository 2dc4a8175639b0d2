"""continue_pretrain_code.py -- continued pre-training of a 1.1B code model (TinyLlama-like: 22 layers,
hidden 2048, vocabulary 32,000) on our monorepo, full fine-tuning with AdamW under bf16 autocast on one
A100 40 GB.  Files are packed into rows of at most 8,192 tokens, two rows a batch, each batch padded
to max_tokens (or to its longest row, if longer):

    def pack_files(files, max_tokens=8192):
        row = []
        for toks in files:
            if len(toks) > max_tokens:            # "never cut a file in the middle"
                yield toks                         # ... so a long file becomes a row of its own
                continue
            if len(row) + len(toks) > max_tokens:
                yield row; row = []
            row += toks
    for rows in batched(pack_files(tokenized_repo), 2):
        batch = pad(rows, to=max(MAX_TOKENS, longest(rows)))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Weights, gradients and AdamW state (fp32) take 18.8 GiB; a batch of two 8k rows peaks around 32 GiB
(11 GiB of activations with SDPA attention, the logits, the gradients), and 36 steps run.  Then the packer reaches a
vendored, minified JavaScript bundle of 139,264 tokens: it becomes one row, and the batch (that row
and an 8k row, padded) is 2 x 139,264 tokens, 17 times the usual.  The forward pass runs out in the
third decoder layer.

An expert: one input is the peak, and it is far beyond the length the run was designed for.  Cut long
files into chunks of at most max_tokens (or drop minified/generated files from the corpus): the batch
then is what every other step ran.  A smaller batch does not help (the bundle's row alone is 8.5x a normal
batch), nor does the optimizer or the cache; autocast is on already and attention is SDPA already;
checkpointing would not fit 139k-token rows either (the logits alone are 17 GiB in fp32).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
HIDDEN, LAYERS, VOCAB, MAX_TOKENS = 2048, 22, 32000, 8192
batch_size = 2
scen_truth.note_every_empty(torch)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(16 * MiB, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(33 * MiB, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        # SDPA attention (memory linear in length), then the SwiGLU MLP; bf16 under autocast
        qkv = torch.empty(tokens * HIDDEN * 2 * 2, device="cuda")
        qkv._saved = hidden
        up = torch.empty(tokens * HIDDEN * 2 * 4, device="cuda")
        up._saved = qkv
        out = torch.empty(tokens * HIDDEN * 2 * 2, device="cuda")
        out._saved = up
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))

    def forward(self, input_ids, labels, tokens):
        h = torch.empty(tokens * HIDDEN * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h, tokens)
        logits = torch.empty(tokens * VOCAB * 2, device="cuda")
        logits._saved = h
        return torch.nn.functional.cross_entropy(logits, labels)


def tokenized_repo():
    """Token counts of the repository's files, in the order the loader reads them (a seeded shuffle)."""
    for i in range(20000):
        if i == 229:
            yield 139264                      # vendor/static/app.bundle.min.js
        else:
            yield 400 + (i * 7919) % 3700


def pack_files(files, max_tokens=MAX_TOKENS):
    row = 0
    for toks in files:
        if toks > max_tokens:
            yield toks
            continue
        if row + toks > max_tokens:
            yield row
            row = 0
        row += toks
    if row:
        yield row


def batched(rows, n):
    out = []
    for r in rows:
        out.append(r)
        if len(out) == n:
            yield out
            out = []


def main():
    model = LlamaForCausalLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step, rows in enumerate(batched(pack_files(tokenized_repo()), batch_size)):
        tokens = max(max(rows), MAX_TOKENS) * len(rows)     # padded to max_tokens (or the longest row)
        input_ids = torch.empty(tokens * 8, device="cuda")
        labels = torch.empty(tokens * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, labels, tokens)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
