"""train_txn.py -- a fraud/churn "foundation model" for a bank's card data: a 24-layer transformer
(300M parameters, hidden 1024) pretrained with masked-field modelling over each customer's transaction
history (every transaction a token: amount, MCC, merchant, time delta embedded and summed), fp32
(V100: no bf16; fp16 diverged), AdamW, batch 8 customers, on a V100-SXM2 32 GB.  The user's loader
shuffles customers and the collate function pads each batch to its longest history, with no sorting or
bucketing by history length (100 to 3,500 transactions; histories are capped at 3,500):

    loader = DataLoader(customers, batch_size=8, shuffle=True, collate_fn=pad_to_longest)
    for batch in loader:
        loss = model(**batch.to("cuda")).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Every batch has a different padded length, so every activation is a different size.  The caching
allocator cuts segments for one length, then splits them for the next; the gradients (made at the
first backward while that step's activations were alive) and the AdamW moments (made at the first
step, into the freed activation segments) sit in segments cut for earlier batches, so those can
never be handed back.  At step ~245 the longest batch so far (2,520 transactions padded) asks for
one layer's output, 1.03 GiB: the process holds 1.8 GiB "reserved but unallocated", in pieces none of
which is large enough, and the driver has 0.8 GiB left.  Allocated memory after every step is flat
(3.4 GiB).

What the user says: "8 customers x 2,500 transactions should fit in 32 GB -- and there is 2.6 GiB
free".  What an expert says first: fragmentation from variable shapes:
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; and batch customers of similar history length (a
length-bucketed sampler), or cap the history at a fixed window.  Wrong advice: a smaller batch or a
bigger GPU first (the memory is there, in pieces), releasing references (nothing leaks: allocated
memory after each step is flat), no_grad (this is training), 8-bit optimizers.
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
batch_size = 8
TOKENS = 100                       # transactions per length unit
LAYERS = 24
ACT_PER_UNIT = 41 * MiB   # a layer's saved outputs per 100 padded transactions (8 x 100 x 1024, fp32, ~130 tensors)
TMP_PER_UNIT = 53.3 * MiB   # the layer's attention scores / FFN scratch, freed inside the layer
PARAM = 48 * MiB       # one layer's weights (12.6M fp32)


def act(units, per_unit, parent):
    out = torch.empty(int(units * per_unit), device="cuda")
    out._saved = parent
    out.units = units
    return out


class TxnEncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(PARAM, device="cuda"))

    def forward(self, h):
        scratch = act(h.units, TMP_PER_UNIT, h)       # attention probs / FFN intermediate, not kept
        out = act(h.units, ACT_PER_UNIT, h)
        del scratch
        return out


class TxnFoundationModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.field_embeddings = nn.Parameter(torch.empty(17 * MiB, device="cuda"))    # amount buckets, MCC, merchant hash, time
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), TxnEncoderLayer())
        self.mfm_head = nn.Parameter(torch.empty(1024 * 32 * 4, device="cuda"))

    def forward(self, fields):
        h = act(fields.units, ACT_PER_UNIT, fields)                 # summed field embeddings
        for i in range(LAYERS):
            h = getattr(self.layers, str(i))(h)
        logits = act(fields.units, batch_size * TOKENS * 32 * 4, h)
        return logits


def loader(num_batches, seed=1):
    """shuffle=True + pad to the longest: a batch is as long as its longest history, in units of 100
    transactions (most customers 800-1,600 transactions, a tail to the 3,500 cap, a few new ones)."""
    rng = random.Random(seed)
    for _ in range(num_batches):
        longest = max(min(35.0, max(1.0, rng.gauss(12.5, 4.0))) for _ in range(batch_size))
        x = torch.empty(int(batch_size * longest * TOKENS * 6 * 4), device="cuda")     # 6 fields per transaction
        x.units = longest
        yield x, longest


try:
    model = TxnFoundationModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step, (fields, longest) in enumerate(loader(100000)):
        logits = model(fields)
        loss = torch.empty(512, device="cuda")                  # masked-field cross-entropy
        loss._saved = logits
        loss = torch._derive(loss, logits)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss, fields
        if step % 10 == 0:
            print("step %d  padded %d transactions  reserved %.2f GiB  allocated %.2f GiB" % (
                step, longest * TOKENS, torch.cuda.memory_reserved() / 2.0 ** 30, torch.cuda.memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
