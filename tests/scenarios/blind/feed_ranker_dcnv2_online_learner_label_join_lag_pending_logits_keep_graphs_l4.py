"""online_ranker.py -- a short-video feed's ranking service that learns online.  One process on an NVIDIA L4
(24 GB, 23,034 MiB) serves and trains a DCN-v2 CTR model: 26 sparse features in dense nn.EmbeddingBag tables
(6M hashed rows x 64 dims, 1.43 GiB in float32), 13 dense features, 3 cross layers over the 1,677-wide input,
an MLP 1024-512-256, Adagrad (395M parameters; weights, dense gradients and accumulators 4.4 GiB).
Requests arrive as micro-batches of 2,048 impressions, about 6 per second.  The label ("watched >= 3 s")
arrives ~12 s later on a Kafka topic; the team wanted to skip a second forward
pass at training time, so the service keeps the served logits, graph and all, until the label joins:

    def serve(self, batch):
        logits = self.model(batch.dense, batch.sparse)          # autograd on: we train on this later
        self.pending[batch.request_id] = (logits, batch.ts)
        return torch.sigmoid(logits.detach()).cpu()

    def on_labels(self, request_id, labels):                    # the label-join consumer
        logits, _ = self.pending.pop(request_id)
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()
        self.opt.step(); self.opt.zero_grad(set_to_none=False)

It ran for nine days: about 72 batches wait for their label at any time (8.9 GiB of saved activations,
126 MiB per batch: the pooled embeddings, the cross layers' inputs and outputs, the MLP's).  At 03:10 the
label topic's consumer group rebalanced and no label joined for half a minute; serving went on, the pending
dict grew by one graph per batch, and 70 batches (12 s) later a forward failed: a 13 MiB cross-layer output
with nothing free on the card, 17.3 GiB of it held by the 141 graphs waiting in self.pending.

An expert: the memory is the autograd graphs parked in `pending`, bounded only by how late the labels are,
which the service does not control.  Keep what is needed to recompute, not the graph: serve under
torch.inference_mode(), store the inputs (ids and dense features: ~0.5 MB per batch, host memory) with the
request id, and run the forward again when the label joins (the usual online-training setup on joined logs);
give the pending buffer a TTL / maximum size and drop or spill what outlives it.  Wrong first advice: a
smaller micro-batch or gradient checkpointing (each graph gets smaller, the number of graphs is still
unbounded: the next longer stall fails the same way), mixed precision, expandable_segments or empty_cache
(nothing is cached or fragmented: the memory is live tensors), a bigger GPU (buys a few more seconds of lag),
quantization or CPU offload of the 1.4 GiB model, restarting (loses the state, the next lag repeats it).
"""
import collections
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as part of torch's own files so that the failing line stays the program's
_BCE = """
def binary_cross_entropy_with_logits(input, target, reduction="mean"):
    loss = torch.empty(1, dtype=torch.float32, device=input.device)
    loss._saved = input
    return derive(loss, input)
"""
if not hasattr(F, "binary_cross_entropy_with_logits"):
    _ns = {"torch": torch, "derive": torch.autograd._graph.derive}
    exec(compile(_BCE, F.__file__, "exec"), _ns)
    F.binary_cross_entropy_with_logits = _ns["binary_cross_entropy_with_logits"]

_ADAGRAD = """
class Adagrad(Optimizer):
    # torch.optim.Adagrad: the `sum` accumulator of every parameter is made in __init__
    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10):
        Optimizer.__init__(self, params, dict(lr=lr, lr_decay=lr_decay, weight_decay=weight_decay,
                                              initial_accumulator_value=initial_accumulator_value, eps=eps))
        for p in self.param_groups[0]["params"]:
            self.state[p] = {"step": 0, "sum": torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device)}

    def _update(self):
        for p in self.param_groups[0]["params"]:
            self.state[p]["step"] += 1
"""
if not hasattr(torch.optim, "Adagrad"):
    import torch.optim.optimizer as _opt_mod
    _ns = {"torch": torch, "Optimizer": torch.optim.Optimizer}
    exec(compile(_ADAGRAD, _opt_mod.__file__, "exec"), _ns)
    torch.optim.Adagrad = _ns["Adagrad"]
# ----

F32 = torch.float32
B = 2048                  # impressions per micro-batch
NUM_SPARSE, EMB_DIM, NUM_DENSE = 26, 64, 13
ROWS = [500_000] * 6 + [300_000] * 8 + [50_000] * 12      # hashed vocabularies, 6.0M rows in all
IN_DIM = NUM_SPARSE * EMB_DIM + NUM_DENSE                   # 1677


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"))


class EmbeddingBagCollection(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, rows in enumerate(ROWS):
            setattr(self, "t%02d" % i, _param(rows * EMB_DIM))    # nn.EmbeddingBag(rows, 64, mode="sum")

    def forward(self, sparse):
        pooled = torch.empty(B * NUM_SPARSE * EMB_DIM, dtype=F32, device="cuda")   # [B, 26, 64]
        return pooled


class CrossLayer(torch.nn.Module):
    """DCN-v2 cross layer, full rank: x_{l+1} = x0 * (W x_l + b) + x_l."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.W = _param(IN_DIM * IN_DIM)
        self.b = _param(IN_DIM)

    def forward(self, x0, xl):
        wx = torch.empty(B * IN_DIM, dtype=F32, device="cuda")       # W x_l + b, saved for backward
        wx._saved = xl
        out = torch.empty(B * IN_DIM, dtype=F32, device="cuda")      # x0 * wx + x_l
        out._saved = (wx, x0)
        return out


class Linear(torch.nn.Module):
    def __init__(self, fan_in, fan_out):
        torch.nn.Module.__init__(self)
        self.fan_out = fan_out
        self.weight = _param(fan_in * fan_out)
        self.bias = _param(fan_out)

    def forward(self, x):
        y = torch.empty(B * self.fan_out, dtype=F32, device="cuda")
        y._saved = x
        return y


class DCNv2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.sparse_arch = EmbeddingBagCollection()
        for i in range(3):
            setattr(self, "cross%d" % i, CrossLayer())
        self.mlp0 = Linear(IN_DIM, 1024)
        self.mlp1 = Linear(1024, 512)
        self.mlp2 = Linear(512, 256)
        self.head = Linear(256, 1)

    def forward(self, dense, sparse):
        emb = self.sparse_arch(sparse)
        x0 = torch.empty(B * IN_DIM, dtype=F32, device="cuda")       # cat([dense, emb.flatten(1)], 1)
        x0._saved = (emb, dense)
        x = x0
        for i in range(3):
            x = getattr(self, "cross%d" % i)(x0, x)
        x = self.mlp0(x)
        x = self.mlp1(x)
        x = self.mlp2(x)
        return self.head(x)                                             # [B, 1] logits


class Batch(object):
    def __init__(self, request_id, ts):
        self.request_id, self.ts = request_id, ts
        self.dense = torch.empty(B * NUM_DENSE, dtype=F32, device="cuda")
        self.sparse = torch.empty(B * NUM_SPARSE * 8, dtype=torch.uint8, device="cuda")  # int64 ids, [B, 26]


class OnlineRanker(object):
    def __init__(self):
        self.model = DCNv2().cuda()
        self.opt = torch.optim.Adagrad(self.model.parameters(), lr=0.01)
        self.pending = collections.OrderedDict()        # request_id -> (logits, ts), until the label joins
        self.served = 0
        self.trained = 0

    def serve(self, batch):
        logits = self.model(batch.dense, batch.sparse)      # autograd on: we train on this later
        self.pending[batch.request_id] = (logits, batch.ts)
        self.served += 1
        return logits.detach()                             # torch.sigmoid(...).cpu() to the caller

    def on_labels(self, request_id):
        logits, _ = self.pending.pop(request_id)
        labels = torch.empty(B, dtype=F32, device="cuda")
        loss = F.binary_cross_entropy_with_logits(logits, labels)
        loss.backward()                                     # the graph is freed with the entry
        self.opt.step()
        self.opt.zero_grad(set_to_none=False)              # dense grads of the tables, kept and reused
        self.trained += 1


_svc = []


def main():
    svc = OnlineRanker()
    _svc.append(svc)
    nparams = sum(p.nbytes for p in svc.model.parameters()) // 4
    print("DCN-v2 loaded: %.1fM parameters (%.2f GiB), Adagrad" % (nparams / 1e6, nparams * 4 / 2 ** 30))
    label_delay = 72          # batches served before a batch's label joins (~12 s at 6 batches/s)
    ts = 0.0
    rid = 0
    # steady state, as it ran for nine days: every served batch's label joins ~15 s later
    for _ in range(400):
        rid += 1
        ts += 1 / 6.0
        svc.serve(Batch(rid, ts))
        if len(svc.pending) > label_delay:
            svc.on_labels(next(iter(svc.pending)))
    print("steady: served %d, trained %d, pending %d, allocated %.2f GiB" % (
        svc.served, svc.trained, len(svc.pending), torch.cuda.memory_allocated() / 2 ** 30))
    # 03:10 -- the label topic's consumer group rebalances: no label joins, serving goes on
    print("label consumer: rebalancing, no labels joined")
    while True:
        rid += 1
        ts += 1 / 6.0
        svc.serve(Batch(rid, ts))
        if svc.served % 20 == 0:
            print("served %d, pending %d, allocated %.2f GiB" % (
                svc.served, len(svc.pending), torch.cuda.memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    if _svc:
        print("OOM at served %d, pending %d" % (_svc[0].served, len(_svc[0].pending)), file=sys.stderr)
    raise
sys.exit(0)
