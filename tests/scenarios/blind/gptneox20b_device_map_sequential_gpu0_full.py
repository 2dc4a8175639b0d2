"""batch_summarize.py -- offline summarisation of support tickets with GPT-NeoX-20B (fp16, 38 GiB of
weights) split over the two 24 GiB RTX 3090s of a workstation by Accelerate, with plain
`LD_PRELOAD=liboomguard.so`:

    model = AutoModelForCausalLM.from_pretrained(
        "EleutherAI/gpt-neox-20b", torch_dtype=torch.float16,
        device_map="sequential")               # from an old tutorial; no max_memory
    tok.padding_side = "left"
    for batch in batches(tickets, 4):          # 4 tickets of up to 1,024 tokens each
        with torch.inference_mode():
            out = model.generate(**tok(batch, return_tensors="pt", padding=True).to("cuda:0"),
                                 max_new_tokens=256, do_sample=False)

"sequential" fills GPU 0 with as many layers as fit before moving to GPU 1: the embeddings and 26 of
the 44 layers (22.7 GiB) land on GPU 0, which keeps about 0.8 GiB free; GPU 1 gets the other 18
layers and the output head (15.9 GiB) and keeps 7.6 GiB free.  Generation puts each layer's KV
cache, attention scores and MLP temporaries on that layer's GPU; the prefill of the first batch fails
on GPU 0 within its first ten layers while GPU 1 is a third empty.  Balanced, each card would hold
about 19.3 GiB of weights plus its half of the KV cache (2.6 GiB at 1,280 tokens) and the temporaries,
and the job fits.

An expert: balance the split -- device_map="balanced" (or "balanced_low_0"), or max_memory={0:
"16GiB", 1: "22GiB"} so that GPU 0, which also holds the inputs and the first layers' caches, keeps
headroom.  Already inference_mode; batch 4 and greedy decoding are modest; not another process; not
a cache or fragmentation problem.  8-bit weights would also fit but change the model; a bigger GPU is
not needed -- the second one is a third free.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 44
ON_GPU0 = 26                       # what device_map="sequential" put on GPU 0
BATCH, PROMPT, HIDDEN, HEADS = 4, 1024, 6144, 64
scen_truth.note_every_empty(torch)


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self, device):
        torch.nn.Module.__init__(self)
        self.dev = device
        # attention (4 x 6144^2) and MLP (2 x 6144 x 24576) in fp16: 870 MiB
        self.attention = torch.nn.Parameter(torch.empty(145 * MiB, dtype=torch.float16, device=device),
                                            requires_grad=False)
        self.mlp = torch.nn.Parameter(torch.empty(290 * MiB, dtype=torch.float16, device=device),
                                      requires_grad=False)

    def forward(self, h, cache):
        h = torch.empty(h.nbytes, device=self.dev)                            # hook moves h to this GPU
        kv = torch.empty(2 * BATCH * PROMPT * HIDDEN * 2, device=self.dev)    # this layer's KV cache (kept)
        cache.append(kv)
        scores = torch.empty(BATCH * HEADS * PROMPT * PROMPT * 2, device=self.dev)   # eager attention
        mlp = torch.empty(BATCH * PROMPT * 4 * HIDDEN * 2, device=self.dev)
        del scores, mlp
        return h


class GPTNeoXForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_in = torch.nn.Parameter(torch.empty(300 * MiB, dtype=torch.float16, device="cuda:0"),
                                           requires_grad=False)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, GPTNeoXLayer("cuda:0" if i < ON_GPU0 else "cuda:1"))
        self.embed_out = torch.nn.Parameter(torch.empty(300 * MiB, dtype=torch.float16, device="cuda:1"),
                                            requires_grad=False)

    def generate(self, input_ids, max_new_tokens=256):
        cache = []
        h = torch.empty(BATCH * PROMPT * HIDDEN * 2, device="cuda:0")            # embeddings
        for i in range(LAYERS):                                                    # prefill
            h = getattr(self, "layer%d" % i)(h, cache)
        logits = torch.empty(BATCH * 50432 * 2, device="cuda:1")
        return logits


def main():
    model = GPTNeoXForCausalLM().eval()
    for b in range(500):
        with torch.inference_mode():
            input_ids = torch.empty(BATCH * PROMPT * 8, device="cuda:0")
            out = model.generate(input_ids, max_new_tokens=256)
        del out, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
