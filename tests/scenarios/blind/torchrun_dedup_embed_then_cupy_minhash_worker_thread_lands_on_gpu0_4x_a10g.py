"""dedup_corpus.py -- near-duplicate removal for a pre-training web corpus on one g5.12xlarge
(4x A10G, 22.5 GiB each, cc 8.6), launched with `torchrun --nproc-per-node 4`.  Each rank takes a
quarter of the shards and runs two stages:
  1. PyTorch: an e5-base embedder (fp16) on its own GPU -- torch.cuda.set_device(local_rank) first;
  2. CuPy: MinHash signatures (128 permutations) and LSH banding for exact-ish dedup, run in a
     worker thread so that the next shard's parquet reading overlaps with the GPU work:

        torch.cuda.set_device(local_rank)
        ...
        with ThreadPoolExecutor(max_workers=1) as ex:
            sigs = ex.submit(minhash_lsh, token_ids).result()

The CUDA current device is per thread: torch.cuda.set_device set it for the main thread only, and
the executor's new thread starts on device 0.  CuPy allocates on its current device, so every rank's
MinHash buffers (~6 GiB each) land on GPU 0 -- beside rank 0's embedder and three extra CUDA contexts --
while GPUs 1-3 hold only their embedders.  The ranks reach the dedup stage one after another (their
shards end at different times); the fourth to arrive runs out on GPU 0.

User: "cupy OutOfMemoryError on rank 3, but rank 3's GPU is nearly empty?"
An expert, first: the ranks' CuPy work is on the wrong GPU -- select each rank's own device in the
thread that touches CUDA (cupy.cuda.Device(local_rank).use() inside minhash_lsh, or
CUDA_VISIBLE_DEVICES per rank).  Wrong advice: fewer ranks or one rank per GPU (there is one per
GPU), smaller shards, empty_cache, other processes outside the job, a bigger GPU.
"""
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

MiB = 1 << 20
GiB = 1 << 30
NPROC = 4
DOCS_PER_RANK = 10 * 1000 * 1000
PERMS, BANDS = 128, 16


def torchrun(nproc):
    """What `torchrun --nproc-per-node N` does: N copies of this script with the rank variables; when
    one fails, the others are stopped and the launch fails."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="dedup-cc-2026-48")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)


def flag(name):
    return os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), name)


def minhash_lsh(n_docs):
    """MinHash + LSH banding in CuPy (the worker thread): signatures, band hashes, the sort workspace."""
    import cupy
    sigs = cupy.empty((n_docs, PERMS), dtype="int32")                    # 4.8 GiB
    bands = cupy.empty((n_docs, BANDS), dtype="int64")                   # 1.2 GiB
    order = cupy.empty(n_docs, dtype="int64")
    return sigs, bands, order


def worker():
    import cupy
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)

    class E5Base(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.w = torch.nn.Parameter(torch.empty(110 * 1000 * 1000, dtype=torch.float16, device="cuda"),
                                        requires_grad=False)

        def forward(self, batch, seq=512):
            h = torch.empty(batch * seq * 768 * 4, dtype=torch.float16, device="cuda")
            out = torch.empty(batch * 768, dtype=torch.float16, device="cuda")
            del h
            return out

    model = E5Base().eval()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    with torch.inference_mode():
        for _ in range(20):                       # stage 1 (every 10,000th batch shown)
            model(512)
    emb_host = DOCS_PER_RANK * 768 * 2            # embeddings go to parquet on the host
    if rank > 0:                                  # the ranks' shards end one after another
        while not os.path.exists(flag("dedup-started-%d" % (rank - 1))):
            time.sleep(0.02)
    try:
        with ThreadPoolExecutor(max_workers=1) as ex:
            sigs = ex.submit(minhash_lsh, DOCS_PER_RANK).result()
    except cupy.cuda.memory.OutOfMemoryError:
        scen_truth.mark("fail", 0, DOCS_PER_RANK * PERMS * 4, rank=rank, framework="cupy")
        raise
    open(flag("dedup-started-%d" % rank), "w").close()
    while not os.path.exists(flag("dedup-started-%d" % (NPROC - 1))):      # all_gather of the band buckets
        time.sleep(0.05)
    print("rank", rank, "signatures", len(sigs), emb_host)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        sys.exit(torchrun(NPROC))
    worker()
