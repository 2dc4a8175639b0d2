"""sft.py -- full fine-tuning of Llama-3.2-1B on a mixed instruction set (answers from 200 to 3,800
tokens) on one A100 40GB: fp32 master weights under bf16 autocast, AdamW, no gradient checkpointing,
dynamic padding (each batch of 2 padded to its own longest; no packing, no grouping by length),
PyTorch 2.2 with the allocator's default settings.

Weights 4.6 GiB, AdamW moments 9.2 GiB, gradients 4.6 GiB during backward: ~19 GiB of state, ~20 GiB
left for a step's activations and float32 logits (2.6 MiB per token).  The first optimizer.step() puts
the moments into the segments the first batch's activations had just freed, so those segments stay
split for the rest of the run; every later batch has another length, and its activations, logits and
gradients are carved from whatever holes fit, with new segments for the rest.  At step 13 the
longest batch so far (2 x 3,563 tokens; its whole step needs ~37 GiB) reaches backward and the
embedding's gradient (1 GiB) needs one block: the card has 0.84 GiB left outside PyTorch's cache,
and the cache holds 6.7 GiB free, all in holes smaller than 1 GiB.

An expert: fragmentation of the caching allocator by variable-length batches, not a model that does
not fit (allocated + the request is 33 GiB of 40): PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
first (set before start).  Batching by length (or padding to a few fixed lengths) also keeps the
shapes, and the holes, regular.  Not a leak (allocated is the same after every step), not another
process, not a bigger GPU, sharding or offloading.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, LAYERS, VOCAB = 2048, 16, 128256
BATCH = 2


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(10 * MiB, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(48 * MiB, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        attn = torch.empty(tokens * HIDDEN * 2 * 6, device="cuda")          # q, k, v, attention out (bf16)
        attn._saved = hidden
        mlp = torch.empty(tokens * 8192 * 2 * 5, device="cuda")             # gate, up, act, product, down in (bf16)
        mlp._saved = attn
        return mlp


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)

    def forward(self, input_ids, tokens):
        hidden = torch.empty(tokens * HIDDEN * 2, device="cuda")
        hidden._saved = input_ids
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        logits = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")    # logits.float()
        logits._saved = hidden
        return logits


def main(lengths):
    model = LlamaForCausalLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    for step, longest in enumerate(lengths):
        tokens = BATCH * longest
        input_ids = torch.empty(tokens * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids, tokens)
        loss = F.cross_entropy(logits, input_ids)
        scen_truth.backward(loss)
        del loss, logits, input_ids
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        st = torch.cuda.memory_stats()
        print("step %d longest %d allocated %.2f reserved %.2f GiB" % (
            step, longest, st["allocated_bytes.all.current"] / 2.0 ** 30, st["reserved_bytes.all.current"] / 2.0 ** 30))


# the longest of each batch of 2, as the shuffled loader delivered them
LENGTHS = [2114, 782, 842, 2640, 1767, 2509, 2153, 1015, 744, 2692, 572, 1638, 3563, 1204, 2890]
try:
    main(LENGTHS)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
