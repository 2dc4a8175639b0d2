"""train_dlrm.py -- a DLRM click-through model on Criteo 1TB (26 categorical features hashed into 128-dim
float32 tables: four of 8.4M rows, 22 of ~0.55M rows, 21.8 GiB of embeddings; 13-512-256-128 bottom MLP and
1024-1024-512-256-1 top MLP) on one A100 40 GB.  Sparse embedding gradients and a row-wise Adagrad keep the
training at ~25 GiB with batch 65,536, and it has run for two days.  The node was preempted, so I resume:

    model = DLRM(tables=CRITEO_TABLES).to("cuda")
    optimizer = RowWiseAdagrad(model.parameters(), lr=0.01)
    if args.resume:
        ckpt = torch.load(args.resume)          # ckpt_step120000.pt, saved from the GPU with torch.save
        model.load_state_dict(ckpt["model"]); optimizer.load_state_dict(ckpt["optim"])

The restart dies with CUDA out of memory inside torch.load, before a single batch.  The checkpoint was saved
from CUDA tensors, so torch.load puts every tensor back on the GPU, next to the freshly built 21.8 GiB model:
two copies of the tables do not fit in 40 GB.

An expert: torch.load(args.resume, map_location="cpu") (optionally mmap=True), then load_state_dict copies
each table into the model that is already on the GPU.  Nothing about batch size, activations, precision or
optimizer state helps: the job has not run a step yet; a bigger GPU or sharding would only hide the second
copy.
"""
import os
import sys
import tempfile

import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

BIG_TABLE = 8400000 * 128 * 4 // MiB * MiB
SMALL_TABLE = 550000 * 128 * 4 // MiB * MiB
CRITEO_TABLES = [BIG_TABLE] * 4 + [SMALL_TABLE] * 22


class EmbeddingBag(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))


class MLP(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))


class DLRM(torch.nn.Module):
    def __init__(self, tables):
        torch.nn.Module.__init__(self)
        for i, n in enumerate(tables):
            setattr(self, "emb_%d" % i, EmbeddingBag(n))
        self.bottom_mlp = MLP(1 * MiB)
        self.top_mlp = MLP(9 * MiB)


class RowWiseAdagrad(torch.optim.Optimizer):
    """One accumulator per embedding row (fbgemm's row-wise Adagrad): 4 bytes a row."""

    def __init__(self, params, lr=0.01):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr))
        for p in self.param_groups[0]["params"]:
            self.state[p] = {"sum": torch.empty(max(p.nbytes // 128, 512), device="cuda")}


def write_previous_runs_checkpoint(path):
    """(test scaffolding) the checkpoint the preempted run saved: the model's and the optimizer's tensors."""
    class Saved(object):
        def __init__(self, n):
            self.nbytes = n
    names = ["model.emb_%d.weight" % i for i in range(len(CRITEO_TABLES))]
    sizes = dict(zip(names, CRITEO_TABLES))
    sizes["model.bottom_mlp.weight"] = 1 * MiB
    sizes["model.top_mlp.weight"] = 9 * MiB
    for i, n in enumerate(CRITEO_TABLES):
        sizes["optim.state.%d.sum" % i] = n // 128
    torch.save(dict((k, Saved(v)) for k, v in sizes.items()), path)


def main(resume):
    model = DLRM(tables=CRITEO_TABLES).to("cuda")
    optimizer = RowWiseAdagrad(model.parameters(), lr=0.01)
    if resume:
        ckpt = torch.load(resume)
        model.load_state_dict(ckpt)
    return model, optimizer


ckpt_dir = tempfile.mkdtemp(prefix="dlrm-ckpt-")
resume = os.path.join(ckpt_dir, "ckpt_step120000.pt")
write_previous_runs_checkpoint(resume)
try:
    main(resume)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
finally:
    os.unlink(resume)
    os.rmdir(ckpt_dir)
sys.exit(0)
