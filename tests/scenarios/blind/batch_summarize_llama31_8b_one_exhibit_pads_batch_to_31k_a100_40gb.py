"""summarize_filings.py -- an analyst team summarizes 40,000 SEC 8-K filings overnight with
Llama-3.1-8B-Instruct (bf16, 15 GiB, sdpa attention) on a 40 GB A100, with plain HF generate:

    for batch in chunked(filings, 16):                       # in the order of the crawl
        enc = tok([prompt(f) for f in batch], return_tensors="pt", padding=True).to("cuda")
        out = model.generate(**enc, max_new_tokens=256, do_sample=False)

User: "It ran for two hours at a flat ~25 GiB reserved, then died on batch 1,873 trying to allocate 13 GiB.
Nothing changed in the code; is the allocator fragmenting overnight?"

What fills the memory: filings are ~1,500 tokens, so a batch is 16 x ~1.8k tokens and the prefill's
largest temporaries (the MLP's 14,336-wide gate/up projections) are ~0.8 GiB each. Batch 1,873
holds one filing with a 31,000-token exhibit pasted in (a full 10-K); `padding=True` pads all 16
prompts to it, a 496k-token prefill: its first layer alone needs 1.9 GiB of K/V, 3.8 GiB of
attention output and two 13.2 GiB MLP projections, against ~25 GiB free after the weights; the
second projection fails. One outlier input, not growth: memory was flat for 1,872 batches.

An expert, first: batch by length (sort the prompts by token count so the long one runs alone or
with peers of its size) and/or cap the input length (truncate or chunk exhibits: the summary only
needs the filing's body). Wrong advice: a smaller batch for the whole job (it would slow the 99.9%
of batches that fit to guard against one), expandable_segments or empty_cache (a single
13 GiB request, no fragmentation), flash attention (sdpa already avoids the score matrix; the MLP
is the peak), quantization or a bigger GPU, gradient checkpointing (generate runs without grad).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, INTER, LAYERS, KV_DIM = 128256, 4096, 14336, 32, 1024
LAYER_ELEMS = 218 * 1000 * 1000
BATCH = 16


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(LAYER_ELEMS * 3 // 10, dtype=torch.bfloat16, device="cuda"),
                                            requires_grad=False)
        self.mlp = torch.nn.Parameter(torch.empty(LAYER_ELEMS - LAYER_ELEMS * 3 // 10, dtype=torch.bfloat16,
                                                  device="cuda"), requires_grad=False)

    def forward(self, tokens, cache):
        k = torch.empty(tokens * KV_DIM, dtype=torch.bfloat16, device="cuda")          # this layer's K, V
        v = torch.empty(tokens * KV_DIM, dtype=torch.bfloat16, device="cuda")
        cache.append((k, v))
        attn = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")        # sdpa output
        gate = torch.empty(tokens * INTER, dtype=torch.bfloat16, device="cuda")         # MLP gate_proj
        up = torch.empty(tokens * INTER, dtype=torch.bfloat16, device="cuda")           # MLP up_proj
        del gate, up, attn
        return torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)

    def generate(self, input_len, batch, max_new_tokens=256):
        """HF generate (no_grad): one prefill over batch x input_len tokens, then one token a step."""
        with torch.no_grad():
            cache = []
            tokens = batch * input_len
            for layer in self.layers:
                h = layer(tokens, cache)
            logits = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")
            grown = torch.empty(batch * max_new_tokens * KV_DIM * 2 * LAYERS, dtype=torch.bfloat16, device="cuda")
            del h, logits, grown
            return ["summary"] * batch


def tokenized_lengths():
    """Token counts of the crawl's filings, batch by batch (the prompts' longest decides the padding)."""
    for n in range(1872):
        yield n, [1400 + (37 * n + 11 * i) % 420 for i in range(BATCH)]
    yield 1872, [1650] * 7 + [31000] + [1500] * 8       # an 8-K with a whole 10-K pasted in as an exhibit


def main():
    model = LlamaForCausalLM()
    model.eval()
    done = 0
    for n, lengths in tokenized_lengths():
        if n < 1866:                # (the first 1,866 batches behave exactly as the next six)
            continue
        padded = max(lengths)       # padding=True: every prompt padded to the longest of the batch
        model.generate(padded, BATCH, max_new_tokens=256)
        done += BATCH
        print("batch %d: %d tokens padded, reserved %.1f GiB" % (n + 1, padded,
              torch.cuda.memory_reserved() / 2 ** 30), flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
