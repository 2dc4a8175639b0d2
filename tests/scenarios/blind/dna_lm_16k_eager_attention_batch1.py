"""pretrain_dna.py -- continued pre-training of a 1.3B-parameter genomic language model (24 layers,
d_model 2048, 16 heads) on 16,384-token windows of the human genome, one 80 GB H100, with plain
`LD_PRELOAD=liboomguard.so`:

    model = AutoModelForMaskedLM.from_pretrained(ckpt, attn_implementation="eager")   # the custom
    model.cuda().train()                        # modeling code only implements eager attention
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    loader = DataLoader(windows, batch_size=1)  # already 1: one 16k-token window per step
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss          # per layer: scores = q @ k.T / sqrt(d); softmax; @ v
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The context was raised from 2,048 to 16,384 tokens for this stage.  Eager attention materialises the
16 x 16384 x 16384 score matrix of every layer: 8 GiB in bf16 for the scores and another 8 GiB for
the softmax probabilities, which autograd keeps for backward.  The first forward pass fails in the
9th of 24 layers with 8 GiB requests; weights are 4.5 GiB, nothing else is on the card, and the
batch is already 1.

An expert: fused (flash / memory-efficient SDPA) attention -- the scores are never materialised,
memory becomes linear in the context -- plus gradient checkpointing of the layers; beyond that,
sequence parallelism (ring attention) over several GPUs, or a shorter context.  A smaller batch is
impossible (1), mixed precision is already on, bucketing by length is moot (every window is 16k),
and it is neither a cache nor a fragmentation problem.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
SEQ, HEADS, D = 16384, 16, 2048
LAYERS = 24
scen_truth.note_every_empty(torch)


class EagerSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv_o = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))       # 4 x 2048^2 fp32

    def forward(self, h):
        qkv = torch.empty(SEQ * 3 * D * 2, device="cuda")                 # bf16 q, k, v (kept)
        qkv._saved = h
        scores = torch.empty(HEADS * SEQ * SEQ * 2, device="cuda")       # q @ k.T, bf16: 8 GiB
        probs = torch.empty(HEADS * SEQ * SEQ * 2, device="cuda")        # softmax(scores): 8 GiB, kept
        probs._saved = qkv
        del scores
        ctx = torch.empty(SEQ * D * 2, device="cuda")                     # probs @ v
        ctx._saved = probs
        return ctx


class MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.fc = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))         # 2 x 2048 x 8192 fp32

    def forward(self, h):
        up = torch.empty(SEQ * 4 * D * 2, device="cuda")                   # GELU input and output, kept
        up._saved = h
        out = torch.empty(SEQ * D * 2, device="cuda")
        out._saved = up
        return out


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = EagerSelfAttention()
        self.mlp = MLP()

    def forward(self, h):
        return self.mlp(self.attn(h))


class DNAForMaskedLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))     # k-mer vocabulary
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, Layer())

    def forward(self, ids):
        h = torch.empty(SEQ * D * 2, device="cuda")
        h._saved = ids
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        return h


def main():
    model = DNAForMaskedLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(100000):
        ids = torch.empty(SEQ * 8, device="cuda")                         # batch_size=1: one window
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(ids)
            loss = torch.empty(512, device="cuda")
            loss._saved = out
            loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, out, ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
