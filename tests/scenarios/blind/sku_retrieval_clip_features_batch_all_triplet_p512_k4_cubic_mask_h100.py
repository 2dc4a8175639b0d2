"""train_head.py -- visual product search for a marketplace: frozen CLIP ViT-L/14 image embeddings (768-d,
precomputed to .npy for 3.1M listing photos of 410k SKUs) and a small trained projection head (768 -> 1024 ->
256, GELU, L2-normalised: 1.05M parameters, 4 MiB) with a batch-all triplet loss, the widely copied PyTorch port
of Olivier Moindrot's TensorFlow `batch_all_triplet_loss`, and a P x K sampler (P SKUs x K photos).  The first
runs used P=128, K=4 (batch 512) on an H100 and trained in minutes.  Wanting "more hard triplets per batch",
the engineer raises P to 512 (batch 2048) -- the head is tiny and the 80 GB card looked empty:

    def batch_all_triplet_loss(labels, embeddings, margin, squared=False):
        pairwise_dist = _pairwise_distances(embeddings, squared=squared)
        anchor_positive_dist = pairwise_dist.unsqueeze(2)
        anchor_negative_dist = pairwise_dist.unsqueeze(1)
        triplet_loss = anchor_positive_dist - anchor_negative_dist + margin
        mask = _get_triplet_mask(labels)
        triplet_loss = mask.float() * triplet_loss
        triplet_loss = F.relu(triplet_loss)
        ...

Every intermediate is [B, B, B]: at B=512 that was 0.5 GiB per float tensor; at B=2048 it is 8.6 billion
triplets, 32 GiB per float32 tensor and 8 GiB per bool mask (the cost is cubic: 4x the batch, 64x the memory).
The first step gets through the difference (32 GiB, plus a second 32 GiB for a moment at `+ margin`) and
the masks (8 GiB each, carved by the caching allocator out of the 32 GiB block the freed difference left), then
holds the triplet tensor and the mask (40 GiB) and fails on mask.float(): a 32 GiB request with 15 GiB free and
24 GiB cached in pieces (16 + 8 GiB).  Defragmenting would not save it: the product on the same line needs
another 32 GiB, and the forward peaks above 100 GiB.  The model, its activations and AdamW's state are a few MiB.

An expert: the loss, not the model, is cubic in the batch.  Use batch-hard mining (hardest positive and
hardest negative per anchor: B x B, 16 MiB at 2048 -- the "batch hard" of Hermans et al., or
pytorch-metric-learning's miner + TripletMarginLoss over index triplets), or keep batch-all but compute it in
blocks of anchors, accumulating the sum of positive losses and their count (the same loss, chunk x B x B
memory).  Going back to P=128 would also fit, and gives up what the change was for.
Wrong first advice: mixed precision (autocast leaves these element-wise ops as they are, and mask.float() is
float32 anyway), gradient checkpointing (the head's activations are megabytes; the intermediates are the
loss's), smaller batch with gradient accumulation (accumulation does not recreate the triplets across
micro-batches: a different objective), expandable_segments / empty_cache (the 24 GiB in pieces is real, but
with it whole the failure moves one multiplication on: a restart spent to fail again), quantization / LoRA /
8-bit optimizers / ZeRO / CPU offload (4 MiB of model), flash attention, inference_mode, a bigger GPU (forward
and backward of batch-all at 2048 need ~140 GiB; no single card has it).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: shape-aware tensor arithmetic (broadcasting, comparisons, masks), torch.eye, torch.diag,
# torch.sqrt, F.relu, F.normalize, F.gelu, nn.Linear, torch.bool/int64 (C functions and modules of PyTorch),
# compiled as part of torch's own file so that the failing line stays the program's.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
if not hasattr(torch, "bool"):
    torch.bool = "bool"
    torch._ITEMSIZE["bool"] = 1
from torch.autograd._graph import derive  # noqa: E402

_GAPS = '''
def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n


def _new(shape, dtype, *inputs, saved=None):
    out = torch.empty(max(_numel(shape), 1), dtype=dtype, device="cuda")
    out._shape = tuple(shape)
    out._saved = saved
    return derive(out, *[t for t in inputs if isinstance(t, torch.Tensor)])


def _shape(x):
    return getattr(x, "_shape", ()) if isinstance(x, torch.Tensor) else ()


def _bcast(a, b):
    sa, sb = _shape(a), _shape(b)
    n = max(len(sa), len(sb))
    sa, sb = (1,) * (n - len(sa)) + tuple(sa), (1,) * (n - len(sb)) + tuple(sb)
    return tuple(max(x, y) for x, y in zip(sa, sb))


def _dtype(a, b):
    da = a.dtype if isinstance(a, torch.Tensor) else None
    db = b.dtype if isinstance(b, torch.Tensor) else None
    for d in ("float64", "float32", "bfloat16", "float16"):
        if d in (da, db):
            return d
    return da or db


def _arith(save):
    def op(a, b):
        return _new(_bcast(a, b), _dtype(a, b), a, b, saved=save(a, b))
    return op


def _cmp(a, b):
    return _new(_bcast(a, b), torch.bool)


def _invert(a):
    return _new(_shape(a), a.dtype)


def unsqueeze(self, dim):
    s = list(_shape(self))
    s.insert(dim if dim >= 0 else len(s) + 1 + dim, 1)
    v = self.view()
    v._shape = tuple(s)
    return v


def t(self):
    v = self.view()
    v._shape = tuple(reversed(_shape(self)))
    return v


def matmul(a, b):
    return _new(_shape(a)[:-1] + _shape(b)[-1:], _dtype(a, b), a, b, saved=(a, b))


def _to(dtype):
    def conv(self):
        return _new(_shape(self), dtype, self)
    return conv


def _sum(self, dim=None):
    return _new((), self.dtype, self, saved=None)


def eye(n, device=None, dtype=None):
    return _new((n, n), dtype or torch.float32)


def diag(input):
    return _new(_shape(input)[:1], input.dtype, input)


def sqrt(input):
    return _new(_shape(input), input.dtype, input, saved=None)


def relu(input, inplace=False):
    out = _new(_shape(input), input.dtype, input)
    out._saved = out.view()           # threshold_backward reads the result
    return out


def gelu(input, approximate="none"):
    return _new(_shape(input), input.dtype, input, saved=input)


def normalize(input, p=2.0, dim=1, eps=1e-12):
    return _new(_shape(input), input.dtype, input, saved=input)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))

    def forward(self, input):
        return _new(_shape(input)[:-1] + (self.out_features,), torch.float32, input, self.weight, saved=input)
'''
_ns = {"torch": torch, "nn": nn, "derive": derive}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
_T = torch.Tensor
_T.__sub__ = _ns["_arith"](lambda a, b: None)
_T.__rsub__ = _ns["_arith"](lambda a, b: None)
_T.__add__ = _ns["_arith"](lambda a, b: None)
_T.__radd__ = _ns["_arith"](lambda a, b: None)
_T.__mul__ = _ns["_arith"](lambda a, b: b if getattr(a, "requires_grad", False) or getattr(a, "_params", ())
                           else a)   # mul saves the other operand of the one that needs a gradient
_T.__rmul__ = _T.__mul__
_T.__matmul__ = _ns["matmul"]
_T.__eq__ = _ns["_cmp"]
_T.__gt__ = _ns["_cmp"]
_T.__and__ = _ns["_arith"](lambda a, b: None)
_T.__invert__ = _ns["_invert"]
_T.__hash__ = object.__hash__
_T.unsqueeze = _ns["unsqueeze"]
_T.t = _ns["t"]
_T.float = _ns["_to"](torch.float32)
_T.bool = _ns["_to"](torch.bool)
_T.sum = _ns["_sum"]
torch.eye, torch.diag, torch.sqrt = _ns["eye"], _ns["diag"], _ns["sqrt"]
F.relu, F.gelu, F.normalize = _ns["relu"], _ns["gelu"], _ns["normalize"]
nn.Linear = _ns["Linear"]
# ----

P, K = 512, 4                 # SKUs per batch x photos per SKU
BATCH = P * K
MARGIN = 0.2


class ProjectionHead(nn.Module):
    def __init__(self, in_dim=768, hidden=1024, out_dim=256):
        nn.Module.__init__(self)
        self.fc1 = nn.Linear(in_dim, hidden)
        self.fc2 = nn.Linear(hidden, out_dim)

    def forward(self, x):
        return F.normalize(self.fc2(F.gelu(self.fc1(x))), dim=-1)


def _pairwise_distances(embeddings, squared=False):
    dot_product = embeddings @ embeddings.t()
    square_norm = torch.diag(dot_product)
    distances = square_norm.unsqueeze(0) - 2.0 * dot_product + square_norm.unsqueeze(1)
    distances = F.relu(distances)
    if not squared:
        mask = (distances == 0.0).float()
        distances = distances + mask * 1e-16
        distances = torch.sqrt(distances)
        distances = distances * (1.0 - mask)
    return distances


def _get_triplet_mask(labels):
    indices_equal = torch.eye(labels._shape[0], device=labels.device).bool()
    indices_not_equal = ~indices_equal
    i_not_equal_j = indices_not_equal.unsqueeze(2)
    i_not_equal_k = indices_not_equal.unsqueeze(1)
    j_not_equal_k = indices_not_equal.unsqueeze(0)
    distinct_indices = (i_not_equal_j & i_not_equal_k) & j_not_equal_k
    label_equal = labels.unsqueeze(0) == labels.unsqueeze(1)
    i_equal_j = label_equal.unsqueeze(2)
    i_equal_k = label_equal.unsqueeze(1)
    valid_labels = ~i_equal_k & i_equal_j
    return valid_labels & distinct_indices


def batch_all_triplet_loss(labels, embeddings, margin, squared=False):
    pairwise_dist = _pairwise_distances(embeddings, squared=squared)
    anchor_positive_dist = pairwise_dist.unsqueeze(2)
    anchor_negative_dist = pairwise_dist.unsqueeze(1)
    triplet_loss = anchor_positive_dist - anchor_negative_dist + margin
    mask = _get_triplet_mask(labels)
    triplet_loss = mask.float() * triplet_loss
    triplet_loss = F.relu(triplet_loss)
    valid_triplets = triplet_loss > 1e-16
    num_positive_triplets = valid_triplets.sum()
    num_valid_triplets = mask.sum()
    fraction_positive_triplets = num_positive_triplets  # / (num_valid_triplets.float() + 1e-16)
    triplet_loss = triplet_loss.sum()                   # / (num_positive_triplets + 1e-16)
    return triplet_loss, fraction_positive_triplets


class PKLoader(object):
    """MPerClassSampler-style P x K batches of precomputed CLIP ViT-L/14 features (np.load(mmap_mode="r"))."""

    def __iter__(self):
        for _ in range(3100000 // BATCH):
            feats = torch.empty(BATCH * 768, dtype=torch.float32, device="cuda")
            feats._shape = (BATCH, 768)
            labels = torch.empty(BATCH, dtype=torch.int64, device="cuda")
            labels._shape = (BATCH,)
            yield feats, labels


def main():
    model = ProjectionHead()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    print("head: %.2fM parameters; P=%d K=%d batch=%d" % (
        sum(p.nbytes for p in model.parameters()) / 4e6, P, K, BATCH))
    for step, (feats, labels) in enumerate(PKLoader()):
        emb = model(feats)
        loss, frac_pos = batch_all_triplet_loss(labels, emb, MARGIN)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print("step %d" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
