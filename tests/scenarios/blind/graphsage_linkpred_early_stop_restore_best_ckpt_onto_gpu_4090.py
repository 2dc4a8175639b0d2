"""train_linkpred.py -- "people you may know" link prediction: GraphSAGE (3 layers, hidden 256) over a
learnable 128-dim embedding per node of an 8M-member social graph, neighbour-sampled mini-batches of
edges with negative sampling, fp32, AdamW, on a workstation RTX 4090 (24 GiB).  Training with early
stopping on validation MRR, written by hand:

    for epoch in range(max_epochs):
        train_one_epoch(...)                       # flat ~19 GiB reserved at the step peaks
        mrr = evaluate(...)                         # under torch.no_grad()
        if mrr > best:
            best, bad = mrr, 0
            torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                        "epoch": epoch}, "best.pt")                # the "resume" format the team uses
        elif (bad := bad + 1) >= patience:
            break
    ckpt = torch.load("best.pt")                  # restore the best weights for the final test
    model.load_state_dict(ckpt["model"])
    test_mrr = evaluate(model, test_edges)

torch.save wrote CUDA tensors, so torch.load (no map_location) puts every tensor of the checkpoint back
on the GPU -- the 3.8 GiB embedding table, and the optimizer's 7.6 GiB of AdamW moments the final test
never uses -- while the live model, its gradients and its own AdamW state (15 GiB) are still resident.
Patience runs out after epoch 20; the restore dies in torch.load, on the checkpoint's second moment
of the embedding table.  Two hours of training, no test number.

What the user says: "it trained fine for 21 epochs and crashed loading a file".  What an expert says
first: load the checkpoint into CPU memory (torch.load("best.pt", map_location="cpu")) and copy only
the model's weights in; and free the training state before the final evaluation (del optimizer, drop
the gradients), or save the best weights alone (on the CPU) in the first place.  Wrong advice: a
smaller batch, fewer sampled neighbours, mixed precision, gradient checkpointing (training is over),
expandable_segments or empty_cache (the memory is live), a leak hunt (allocated memory was flat).
"""
import os
import sys
import tempfile

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
num_nodes = 8000000
emb_dim = 128
batch_size = 4096                      # positive edges per mini-batch


class SAGEConv(nn.Module):
    def __init__(self, din, dout):
        nn.Module.__init__(self)
        self.lin_l = nn.Parameter(torch.empty(din * dout * 4, device="cuda"))
        self.lin_r = nn.Parameter(torch.empty(din * dout * 4, device="cuda"))

    def forward(self, x, nbytes):
        out = torch.empty(nbytes, device="cuda")        # aggregated neighbour messages + output, saved
        out._saved = x
        return out


class LinkPredictor(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.emb = nn.Parameter(torch.empty(num_nodes * emb_dim * 4, device="cuda"))
        self.convs = nn.Module()
        self.convs.c0 = SAGEConv(128, 256)
        self.convs.c1 = SAGEConv(256, 256)
        self.convs.c2 = SAGEConv(256, 256)

    def forward(self, n_id):
        x = torch.empty(900 * MiB, device="cuda")       # emb[n_id] for the sampled 3-hop neighbourhood
        x._saved = n_id
        h = self.convs.c0(x, 1400 * MiB)
        h = self.convs.c1(h, 700 * MiB)
        h = self.convs.c2(h, 180 * MiB)
        return h


def save_checkpoint(model, optimizer, epoch, path):
    """torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch}, path)
    (the stand-in's torch.save keeps a flat dict of tensors)."""
    flat = dict(("model." + k, v) for k, v in model.state_dict().items())
    for i, s in optimizer.state_dict()["state"].items():
        flat["optimizer.state.%d.exp_avg" % i] = s["exp_avg"]
        flat["optimizer.state.%d.exp_avg_sq" % i] = s["exp_avg_sq"]
    torch.save(flat, path)


def train_one_epoch(model, optimizer, steps=20):
    for _ in range(steps):
        n_id = torch.empty(batch_size * 60 * 8, device="cuda")
        h = model(n_id)
        loss = torch.empty(512, device="cuda")          # BCE over positive and negative edge scores
        loss._saved = h
        loss = torch._derive(loss, h)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)           # (the team's habit: grads kept, zeroed)
        del n_id, h, loss


def evaluate(model):
    with torch.no_grad():
        h = model(torch.empty(batch_size * 60 * 8, device="cuda"))
        del h
    return 0.0


try:
    model = LinkPredictor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    workdir = tempfile.TemporaryDirectory(prefix="linkpred-")        # (runs/ in the real job)
    best_path = os.path.join(workdir.name, "best.pt")
    best, bad, patience = -1.0, 0, 5
    mrr_by_epoch = [0.21, 0.27, 0.31, 0.33, 0.35, 0.36, 0.37, 0.37, 0.38, 0.39, 0.39, 0.40, 0.40, 0.41,
                    0.41, 0.42, 0.42, 0.42, 0.41, 0.42, 0.41, 0.42, 0.41, 0.42]
    for epoch in range(100):
        train_one_epoch(model, optimizer)
        evaluate(model)
        mrr = mrr_by_epoch[min(epoch, len(mrr_by_epoch) - 1)]   # (the validation MRR of the run)
        if mrr > best:
            best, bad = mrr, 0
            save_checkpoint(model, optimizer, epoch, best_path)
        else:
            bad += 1
            if bad >= patience:
                print("early stop after epoch %d (best MRR %.2f)" % (epoch, best))
                break
    ckpt = torch.load(best_path)                        # no map_location: back onto the GPU
    model.load_state_dict(dict((k[len("model."):], v) for k, v in ckpt.items() if k.startswith("model.")))
    evaluate(model)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
