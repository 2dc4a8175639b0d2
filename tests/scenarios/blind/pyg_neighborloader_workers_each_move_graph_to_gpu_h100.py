"""train_linkpred.py -- link prediction on a user-item interaction graph (48M nodes, 1.1B edges) with a
GraphSAGE recommender, PyTorch Geometric, one H100 80GB.  Sampling was the bottleneck, so the author
moved it to the GPU inside the loader's workers (spawn, since CUDA must not be forked):

    def worker_init_fn(worker_id):
        ds = torch.utils.data.get_worker_info().dataset
        ds.rowptr, ds.col = ds.rowptr.cuda(), ds.col.cuda()           # "GPU neighbour sampling"
    loader = DataLoader(EdgeSeeds(graph), batch_size=8192, num_workers=10, persistent_workers=True,
                        multiprocessing_context="spawn", worker_init_fn=worker_init_fn, collate_fn=sample)

User's words: "GPU utilisation went up, then the first step died with OOM.  nvidia-smi lists eleven
python processes on the card -- are those zombies from an earlier run?"

What fills the card: each of the 10 workers is a process of this job with its own CUDA context (0.5
GiB), its own copy of the graph's CSR on the GPU (int32 col 4.1 GiB + rowptr 0.2 GiB) and its sampler's cache (~1.2 GiB): ~6 GiB each, 60 GiB for the ten.  The
training process keeps the node features on the GPU (48M x 64 bf16, 5.7 GiB), the model, its optimizer
and ~17 GiB of activations for the sampled subgraphs: it fails in its first forward.

An expert, first: keep CUDA out of the workers -- sample on the CPU in the workers (pin_memory=True) or
do the GPU sampling in the main process with one copy of the CSR (num_workers=0 for the GPU sampler);
fewer workers only shrinks the waste in proportion.  Wrong advice: killing the "other processes" (they
are this job's workers), a smaller batch or gradient checkpointing, a bigger GPU.
"""
import multiprocessing
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
NUM_WORKERS, BATCH_SIZE = 10, 8192


def worker_loop(worker_id, ready, stop):
    """torch.utils.data's _worker_loop: worker_init_fn moves the CSR to the GPU, then collate_fn samples."""
    rowptr = torch.empty(48_000_000 * 4 + 4, device="cuda")          # int32 rowptr
    col = torch.empty(1_100_000_000 * 4, device="cuda")              # int32 col: 4.1 GiB
    scratch = [torch.empty(200 * MiB, device="cuda") for _ in range(6)]   # sampler frontier / dedup buffers
    del scratch
    ready.put(worker_id)
    stop.wait()


class SAGERecommender(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.convs = torch.nn.Parameter(torch.empty(3 * 2 * 256 * 256 * 4, device="cuda"))
        self.predictor = torch.nn.Parameter(torch.empty(256 * 256 * 4, device="cuda"))

    def forward(self, x, hops):
        h = x
        for size in hops:
            a = torch.empty(size, device="cuda")
            a._saved = h
            h = a
        return h


class DataLoader(object):
    def __init__(self, num_workers):
        ctx = multiprocessing.get_context("spawn")
        self.ready, self.stop = ctx.Queue(), ctx.Event()
        self.workers = [ctx.Process(target=worker_loop, args=(i, self.ready, self.stop), daemon=True)
                        for i in range(num_workers)]

    def __iter__(self):
        for w in self.workers:
            w.start()
        for _ in self.workers:
            self.ready.get()
        while True:
            yield torch.empty(BATCH_SIZE * 3 * 15 * 10 * 8, device="cuda")   # sampled subgraph ids (IPC)

    def shutdown(self):
        self.stop.set()
        for w in self.workers:
            w.join(5)


def main():
    scen_truth.note_every_empty(torch)
    x = torch.empty(48_000_000 * 64 * 2, device="cuda")             # node features, bf16, on the GPU
    model = SAGERecommender()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = DataLoader(NUM_WORKERS)
    try:
        for step, batch in enumerate(loader):
            out = model(batch, [8 * GiB, 6 * GiB, 3 * GiB])
            loss = torch.empty(512, device="cuda")
            loss._saved, loss._params = out, out._params
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out, loss, batch
            if step == 20:
                break
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    finally:
        loader.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
