"""infer_gnn.py -- an HL-LHC tracking group runs its trained interaction GNN (Exa.TrkX-style edge
classifier, hidden 256, 8 message-passing iterations, float32) over 10,000 simulated ttbar events at
pile-up 200 to measure tracking efficiency, on a V100 32GB of the department cluster.  The graphs were
built by the previous pipeline stage and are read from disk one event at a time: 85k-135k hits and 1.2M-
3.5M candidate edges per event, so the biggest event's message tensor (edges x 768 floats) is ~10 GiB
and its forward pass peaks at ~20 GiB.  Edge scores are collected on the GPU and written every 64 events:

    for i, event in enumerate(loader):                    # batch_size=1, one PyG Data per event
        event = event.to("cuda")
        with torch.no_grad():
            scores = torch.sigmoid(model(event.x, event.edge_index))
        buffer.append(scores)
        if len(buffer) == 64:
            np.save(out / f"scores_{i // 64:04d}.npy", torch.cat(buffer).cpu().numpy()); buffer.clear()

Hours into the run, at event ~2,670, a large event fails: it asks for an 8.9 GiB block while PyTorch
holds 27.6 GiB reserved, of which 9.4 GiB are in tensors (that event's inputs and latents, the buffered
scores), and the card has 3.6 GiB free besides.  Each buffered score tensor (5-14 MB) was served, best fit, out of a multi-GiB
block some earlier event had freed, and splits it: the segment can neither hold the next big message
tensor in one piece nor be given back to the driver (the allocator's release-and-retry frees only
segments with nothing in them).  The largest free block is 8.8 GiB, 18 GiB are cached but unused.

An expert: fragmentation of the caching allocator by variable-size events, with small long-lived
tensors pinning big segments.  First: PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or
max_split_size_mb so big blocks are not split for small tensors); moving each event's scores to the
CPU right away (scores.cpu() before buffering) removes the pins too.  Wrong first advice: a smaller
batch (one event already), no_grad/inference_mode (already no_grad), gradient checkpointing, a leak
hunt or restart (live memory does not grow: this event's tensors and at most 64 score vectors), empty_cache between events (the pinned
segments are not empty; the allocator already released the empty ones), quantization or a bigger GPU.
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

LAT = 256
ITERS = 8


# --------------------------------------------------------------------------------------------------
# stand-in gap: no shapes, PyG, torch.cat/sigmoid/scatter_add in the stand-in: these allocate what their
# PyTorch counterparts allocate (float32 unless said, sizes in elements), computing nothing.
def _f32(n):
    return torch.empty(n, dtype=torch.float32, device="cuda")


def cat(tensors, dim=0):
    return _f32(sum(t.nbytes for t in tensors) // 4)


def sigmoid(t):
    return _f32(t.nbytes // 4)


class _HostArray(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes

    def numpy(self):
        return self


def _gather(t, index):
    """t[index]: one row of t per edge endpoint, a new tensor; edge_index[0] a view of one row."""
    if isinstance(index, int):
        v = t.view()
        v.rows = t.rows
        return v
    return _f32(index.rows * t.nbytes // 4 // t.rows)


def _rows(self, n):
    self.rows = n
    return self


def scatter_add(src, index, dim_size):
    out = _f32(dim_size * src.nbytes // 4 // src.rows)
    out.rows = dim_size
    return out


torch.Tensor.rows_ = _rows
torch.cat = cat
torch.sigmoid = sigmoid
torch.Tensor.cpu = lambda self: _HostArray(self.nbytes)
torch.Tensor.__getitem__ = _gather


class Data(object):
    """torch_geometric.data.Data as far as this script uses it: node features and the candidate edges."""

    def __init__(self, num_hits, num_edges):
        self.num_hits, self.num_edges = num_hits, num_edges

    def to(self, device):
        d = Data(self.num_hits, self.num_edges)
        d.x = _f32(self.num_hits * 12)                                   # r, phi, z, cell features
        d.x.rows = self.num_hits
        d.edge_index = torch.empty(2 * self.num_edges * 8, device="cuda")   # int64
        d.edge_index.rows = self.num_edges
        return d


class MLP(torch.nn.Module):
    def __init__(self, n_in, n_out, hidden=LAT):
        torch.nn.Module.__init__(self)
        self.n_out = n_out
        self.w1 = torch.nn.Parameter(_f32(n_in * hidden), requires_grad=False)
        self.w2 = torch.nn.Parameter(_f32(hidden * n_out), requires_grad=False)

    def forward(self, x):
        hid = _f32(x.rows * LAT)
        out = _f32(x.rows * self.n_out)
        out.rows = x.rows
        del hid
        return out


class InteractionGNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.node_encoder = MLP(12, LAT)
        self.edge_encoder = MLP(24, LAT)
        self.edge_network = MLP(3 * LAT, LAT)
        self.node_network = MLP(2 * LAT, LAT)
        self.output_edge_classifier = MLP(3 * LAT, 1)

    @classmethod
    def load_from_checkpoint(cls, path):
        return cls()

    def forward(self, x, edge_index):
        src, dst = edge_index[0], edge_index[1]
        h = self.node_encoder(x)
        e = self.edge_encoder(torch.cat([x[src], x[dst]], dim=-1).rows_(edge_index.rows))
        for _ in range(ITERS):
            m = torch.cat([h[src], h[dst], e], dim=-1).rows_(edge_index.rows)
            e = self.edge_network(m)
            del m
            agg = scatter_add(e, dst, dim_size=x.rows)
            h = self.node_network(torch.cat([h, agg], dim=-1).rows_(x.rows))
            del agg
        m = torch.cat([h[src], h[dst], e], dim=-1).rows_(edge_index.rows)
        del e, h
        return self.output_edge_classifier(m)


def trackml_events(n=10_000, seed=7):
    """The graph-construction stage's output, read one event at a time (hits, candidate edges)."""
    rng = random.Random(seed)
    for _ in range(n):
        hits = rng.randint(85_000, 135_000)
        yield Data(hits, int(hits * rng.uniform(14, 26)))
# --------------------------------------------------------------------------------------------------


def save_npy(path, arr):
    pass                                                  # np.save


model = InteractionGNN.load_from_checkpoint("ignn_hidden256_pu200.ckpt").cuda().eval()
buffer = []
try:
    for i, event in enumerate(trackml_events()):
        event = event.to("cuda")
        with torch.no_grad():
            scores = torch.sigmoid(model(event.x, event.edge_index))
        buffer.append(scores)
        del event, scores
        if len(buffer) == 64:
            save_npy("scores_%04d.npy" % (i // 64), torch.cat(buffer).cpu().numpy())
            buffer.clear()
        if i % 100 == 0:
            print("event %5d  allocated %.1f GiB  reserved %.1f GiB" % (
                i, torch.cuda.memory_allocated() / 2**30, torch.cuda.memory_reserved() / 2**30))
except torch.OutOfMemoryError:
    print("event", i, "failed")
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
