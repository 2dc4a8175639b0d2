"""etl_and_train.py -- an e-commerce team builds a session-based next-item recommender the NVIDIA Merlin way, on a
single-GPU g5.2xlarge (NVIDIA A10G, 24 GB).  Until now the ETL (NVTabular on a dask-cuda cluster: Categorify the
item ids, group the clickstream into sessions, write parquet) and the training (a Transformers4Rec-style XLNet,
d_model 64, 2 layers, tied item embeddings over 52,739 items: 3.5M parameters) were two notebooks.  For the
nightly Airflow job they pasted both into one script, the ETL part as NVTabular's examples set it up:

    if __name__ == "__main__":
        device_size = device_mem_size(kind="total")
        device_pool_size = int(0.8 * device_size)
        cluster = LocalCUDACluster(n_workers=1, CUDA_VISIBLE_DEVICES="0", device_memory_limit=int(0.7 * device_size))
        client = Client(cluster)
        def _rmm_pool():
            rmm.reinitialize(pool_allocator=True, initial_pool_size=(device_pool_size // 256) * 256)
        client.run(_rmm_pool)                                  # an RMM pool on every worker
        workflow = nvt.Workflow(sessions_ops)
        workflow.fit_transform(nvt.Dataset(RAW, engine="parquet")).to_parquet(OUT)
        # ---- training (was notebook 2)
        model = build_xlnet_session_model(cardinality=52739).cuda()
        for batch in loader(OUT, batch_size=512):
            loss = model(batch)
            loss.backward(); optimizer.step(); optimizer.zero_grad()

The script dies in the first training step: the cross-entropy over the item catalogue asks for 2.0 GiB with
1.4 GiB free on a 22.5 GiB card.  The training process itself holds 2.6 GiB (its CUDA context, the model, one
batch's logits).  The rest is the dask-cuda worker process that LocalCUDACluster spawned on GPU 0: its RMM pool
(initial_pool_size = 80% of the card, 18 GiB) plus its own CUDA context, still alive after the ETL finished,
because the cluster is never closed (18.5 GiB in all).  The same training alone on the card peaks at about
8 GB (the logits, their log-softmax and, in backward, their gradients).

An expert: nvidia-smi shows two python processes; the other one is this job's own dask worker, a child of the
training process.  The ETL is done: client.close(); cluster.close() (or run the ETL as its own step) before
training and the pool goes with the worker.  If the cluster has to stay up (a Merlin dataloader reading through
dask), give it a small pool (rmm_pool_size of a few GB, or no pool) instead of 80% of the card.
Wrong advice: a smaller batch, mixed precision, gradient checkpointing or a fused / chunked cross-entropy (the
training fits with room to spare once the worker is gone; cutting it down to fit in 1.4 GiB leaves 80% of the
card to an ETL that has finished), expandable_segments / empty_cache (PyTorch caches nothing; the memory is in another process),
restarting the process (the script starts the cluster again), a bigger GPU.
"""
import ctypes
import multiprocessing
import sys
import time

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: int64 tensors, nn.Embedding / nn.Linear, and the pieces of RAPIDS and
# dask-cuda the script touches.  The dask worker is a real child process (multiprocessing, spawn, daemonic, as
# distributed's Nanny starts it); its RMM pool is one cudaMalloc through the CUDA runtime, as librmm's
# pool_memory_resource makes its initial pool.
if "int64" not in torch._ITEMSIZE:
    torch._ITEMSIZE["int64"] = 8
torch.int64 = torch.long = "int64"


class Embedding(torch.nn.Module):
    def __init__(self, num_embeddings, embedding_dim):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = torch.nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32,
                                                     device="cuda"))

    def forward(self, idx):
        out = torch.empty(idx.nbytes // 8 * self.embedding_dim, dtype=torch.float32, device="cuda")
        return out


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        out = torch.empty(x.nbytes // 4 // self.in_features * self.out_features, dtype=torch.float32, device="cuda")
        out._saved = x
        return out


torch.nn.Embedding, torch.nn.Linear = Embedding, Linear
nn = torch.nn


class _RMM(object):
    """rmm.reinitialize(pool_allocator=True, initial_pool_size=N): librmm's pool grabs N bytes at once."""
    _pool = None

    def reinitialize(self, pool_allocator=False, initial_pool_size=None, managed_memory=False):
        rt = ctypes.CDLL("libcudart.so.13")
        rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        rt.cudaSetDevice(0)
        p = ctypes.c_void_p(0)
        if rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(initial_pool_size)) != 0:
            raise MemoryError("std::bad_alloc: out_of_memory: RMM failure")
        _RMM._pool = p.value


rmm = _RMM()


def _worker_main(inbox, outbox):
    """distributed.Worker's loop, as far as client.run / the workflow's tasks go: run what the client sends."""
    while True:
        fn, args = inbox.get()
        outbox.put(fn(*args))


class LocalCUDACluster(object):
    """dask_cuda.LocalCUDACluster: one worker process per visible GPU, started by a Nanny (multiprocessing spawn)."""

    def __init__(self, n_workers=1, CUDA_VISIBLE_DEVICES="0", device_memory_limit=None, local_directory=None):
        ctx = multiprocessing.get_context("spawn")
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.workers = [ctx.Process(target=_worker_main, args=(self.inbox, self.outbox),
                                    name="Dask Worker process (from Nanny)", daemon=True)]
        for w in self.workers:
            w.start()

    def close(self):
        for w in self.workers:
            w.terminate()
            w.join()


class Client(object):
    def __init__(self, cluster):
        self.cluster = cluster

    def run(self, fn, *args):
        self.cluster.inbox.put((fn, args))
        return self.cluster.outbox.get(timeout=60)

    def close(self):
        pass


def device_mem_size(kind="total"):
    """nvtabular.utils.device_mem_size: the card's total memory (NVML; no CUDA context)."""
    return torch.cuda.get_device_properties(0).total_memory


def _session_etl(raw, out):
    """The NVTabular workflow's tasks on the worker: Categorify, Groupby(session_id), list columns; its
    intermediate cuDF frames live in the worker's RMM pool."""
    time.sleep(0.2)
    return "%s -> %s: 1,912,446 sessions" % (raw, out)
# ----


RAW = "s3://shop-clickstream/raw/2025-11-*.parquet"
OUT = "/data/sessions/2025-11/"
ITEM_CARDINALITY = 52739
D_MODEL = 64
MAX_SEQUENCE_LENGTH = 20
BATCH_SIZE = 512


class XLNetBlock(nn.Module):
    def __init__(self, d, n_head):
        nn.Module.__init__(self)
        self.n_head = n_head
        self.q, self.k, self.v, self.o = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.ff1, self.ff2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, h):
        q, k, v = self.q(h), self.k(h), self.v(h)
        b_l = h.nbytes // 4 // D_MODEL
        scores = torch.empty(b_l * self.n_head * MAX_SEQUENCE_LENGTH * 2, dtype=torch.float32, device="cuda")
        a = self.o(v)
        scores._saved = (q, k, v)
        return self.ff2(self.ff1(a))


class SessionXLNet(nn.Module):
    """Transformers4Rec-style: item embedding -> XLNet (MLM) -> next-item logits over the catalogue, tied weights."""

    def __init__(self, cardinality, d_model=D_MODEL, n_layer=2, n_head=4):
        nn.Module.__init__(self)
        self.item_embedding = nn.Embedding(cardinality, d_model)
        self.block0 = XLNetBlock(d_model, n_head)
        self.block1 = XLNetBlock(d_model, n_head)
        self.output_bias = torch.nn.Parameter(torch.empty(cardinality, dtype=torch.float32, device="cuda"))
        self.cardinality = cardinality

    def forward(self, item_ids, targets):
        h = self.item_embedding(item_ids)
        h = self.block1(self.block0(h))
        rows = h.nbytes // 4 // D_MODEL
        logits = torch.empty(rows * self.cardinality, dtype=torch.float32, device="cuda")   # h @ item_embedding.T
        logits._saved = h
        logits._params = tuple(self.parameters())
        return F.cross_entropy(logits, targets)


def loader(path, batch_size):
    """merlin.dataloader.torch.Loader over the session parquet: item-id lists padded to max_sequence_length."""
    while True:
        yield (torch.empty(batch_size * MAX_SEQUENCE_LENGTH, dtype=torch.int64, device="cuda"),
               torch.empty(batch_size * MAX_SEQUENCE_LENGTH, dtype=torch.int64, device="cuda"))


def main():
    device_size = device_mem_size(kind="total")
    device_pool_size = int(0.8 * device_size)
    cluster = LocalCUDACluster(n_workers=1, CUDA_VISIBLE_DEVICES="0", device_memory_limit=int(0.7 * device_size),
                               local_directory="/tmp/dask-worker-space")
    client = Client(cluster)
    client.run(_rmm_pool, device_pool_size)            # an RMM pool on every worker
    print(client.run(_session_etl, RAW, OUT))       # workflow.fit_transform(dataset).to_parquet(OUT)

    # ---- training (was notebook 2)
    model = SessionXLNet(cardinality=ITEM_CARDINALITY).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    print("SessionXLNet: %.1fM parameters, batch %d x %d" % (sum(p.nbytes for p in model.parameters()) / 4e6,
                                                            BATCH_SIZE, MAX_SEQUENCE_LENGTH))
    for step, (item_ids, targets) in enumerate(loader(OUT, batch_size=BATCH_SIZE)):
        loss = model(item_ids, targets)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 100:
            break
    client.close()
    cluster.close()


def _rmm_pool(device_pool_size):
    """Run on every worker by client.run (the notebook's closure, given the size as an argument: the stand-in
    pickles functions by name, distributed ships closures with cloudpickle)."""
    rmm.reinitialize(pool_allocator=True, initial_pool_size=(device_pool_size // 256) * 256)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
