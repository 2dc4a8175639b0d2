"""train_two_tower.py -- the retrieval team's two-tower model for a marketplace's "recommended listings" row,
trained with DDP on one p4d.24xlarge (8x A100-SXM4 40 GB):

    torchrun --nproc-per-node 8 train_two_tower.py --epochs 6

Each rank holds the whole model (a hashed user-id table 2M x 128, a hashed item-id table 2M x 128 shared
with the user's interaction history, the listing's precomputed MiniLM title vector, two MLPs: 2.15 GB of
fp32 weights), DDP's gradient buckets (another 2.15 GB, gradient_as_bucket_view left at its default) and
AdamW's two moments (4.3 GB): about 8.6 GB per rank, steady, with the cached activations of a 4096-pair
batch on top.

At the end of every epoch the script measures recall@100 against the full catalog.  Every rank encodes its
1/8 of the 20M live listings (2.5M x 256 fp32 = 2.4 GiB), then rank 0 collects them and does the search:

    gathered = [torch.empty_like(item_emb) for _ in range(world_size)] if rank == 0 else None
    dist.gather(item_emb, gathered, dst=0)
    if rank == 0:
        index = torch.cat(gathered)              # 20M x 256 fp32 = 19.1 GiB
        recall = recall_at_k(query_emb, index, k=100)
    dist.barrier()

The gather itself fits on rank 0 (8.6 GB of training state + its own shard + 19.1 GiB of received shards),
but torch.cat makes a second 19.1 GiB copy of the catalog on the same card and fails: rank 0 needs ~49 GiB
of a 39.4 GiB card while the seven other GPUs hold ~14 GiB each (25 GiB free), waiting at the barrier.
(At 12M listings, a few months ago, it still fitted.)

An expert: this is the evaluation, on rank 0 alone, not the training: the training batch, checkpointing or
mixed precision of the training change nothing, and the other ranks have ~25 GiB free each.  Do not ship the
whole index to one GPU: let each rank score the (small) query set against its own shard and gather only
the per-rank top-100 (scores + ids), merging them on rank 0 -- or build the index on the CPU / in FAISS.
(Gathering into one preallocated tensor instead of a list + torch.cat would halve the peak for a while.)
Wrong first advice: a smaller training batch, gradient checkpointing, expandable_segments / empty_cache
(the list holds live tensors), set_device (every rank is on its own GPU), a bigger GPU.
(The stand-in below is the launcher too: run without LOCAL_RANK it starts the ranks as torchrun does.
torch.distributed and torch.cat, which the stand-in torch lacks, are written here with PyTorch's shapes.)
"""
import os
import subprocess
import sys
import time

MiB = 1 << 20
GiB = 1 << 30


def torchrun(nproc):
    """What `torchrun --nproc-per-node N` does here: N copies of this script with the rank variables; when
    one fails, the others are stopped and the launch fails."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="two-tower-recs-e6")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            time.sleep(0.3)
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)


# ---- stand-ins for what the stand-in torch lacks: torch.distributed (NCCL process group, gather, barrier)
# and torch.cat.  Compiled under PyTorch's own file names, so the stack shows the frames PyTorch's would.
_C10D_SRC = '''
import os, time, types

class _ProcessGroupNCCL(object):
    def __init__(self, rank, world):
        self.rank, self.world = rank, world
        self._dir = os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "c10d-" + os.environ.get("TORCHELASTIC_RUN_ID", "x"))
        os.makedirs(self._dir, exist_ok=True)
        self._seq = 0
        self._comm = None

    def _ensure_comm(self):
        # NCCL makes its communicator at the first collective: its channel buffers on this rank's GPU
        if self._comm is None:
            lib = os.environ.get("SCEN_NCCL_LIB")
            if lib:
                import ctypes
                ctypes.CDLL(lib).nccl_comm_init_rank(self.world, self.rank, ctypes.c_size_t(4 << 20), 32)
            self._comm = True

    def _arrive(self, what):
        self._seq += 1
        open(os.path.join(self._dir, "%s-%d.%d" % (what, self._seq, self.rank)), "w").close()
        return self._seq

    def _wait_all(self, what, seq):
        while True:
            if all(os.path.exists(os.path.join(self._dir, "%s-%d.%d" % (what, seq, r))) for r in range(self.world)):
                return
            time.sleep(0.02)

_pg = [None]

def init_process_group(backend="nccl", init_method=None, rank=-1, world_size=-1, **kw):
    _pg[0] = _ProcessGroupNCCL(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]))

def get_rank(group=None):
    return _pg[0].rank

def get_world_size(group=None):
    return _pg[0].world

def gather(tensor, gather_list=None, dst=0, group=None, async_op=False):
    """On dst, the ranks' tensors land in gather_list (the caller's buffers); the others send theirs."""
    pg = _pg[0]
    pg._ensure_comm()
    if pg.rank == dst:
        if gather_list is None or len(gather_list) != pg.world:
            raise ValueError("Argument ``gather_list`` must be specified on destination rank.")
        for t in gather_list:
            if t.nbytes != tensor.nbytes:
                raise ValueError("gather_list tensors must match the input's size")
    seq = pg._arrive("gather")
    if pg.rank == dst:
        pg._wait_all("gather", seq)

def all_reduce(tensor, op=None, group=None, async_op=False):
    pg = _pg[0]
    pg._ensure_comm()
    pg._wait_all("allreduce", pg._arrive("allreduce"))

def barrier(group=None, async_op=False, device_ids=None):
    pg = _pg[0]
    pg._ensure_comm()
    pg._wait_all("barrier", pg._arrive("barrier"))
'''

_CAT_SRC = '''
def cat(tensors, dim=0, out=None):
    """torch.cat: one new tensor holding all of them, in their graph."""
    tensors = list(tensors)
    res = empty(sum(t.nbytes for t in tensors), dtype=None, device=tensors[0].device)
    res._dtype = tensors[0].dtype
    return _derive(res, *tensors)
'''


def _install_standins(torch):
    import types
    c10d = types.ModuleType("torch.distributed")
    c10d.__file__ = os.path.join(os.path.dirname(torch.__file__), "distributed", "distributed_c10d.py")
    exec(compile(_C10D_SRC, c10d.__file__, "exec"), c10d.__dict__)
    sys.modules["torch.distributed"] = c10d
    torch.distributed = c10d
    exec(compile(_CAT_SRC, torch.__file__, "exec"), torch.__dict__)


# ------------------------------------------------------------------------------------------------ the script
USER_BUCKETS = ITEM_BUCKETS = 2_097_152
ID_DIM, OUT_DIM = 128, 256
NUM_LISTINGS = 20_000_000
VAL_USERS = 50_000
ENCODE_CHUNK = 65_536


def main():
    import torch
    import scen_truth
    _install_standins(torch)
    scen_truth.note_every_empty(torch)
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    def _activation(nbytes, prev=None):
        """an output of an operation; with autograd on it keeps what it was made from for backward"""
        t = torch.empty(nbytes, device="cuda")
        t._saved = prev if torch.is_grad_enabled() else None
        return t

    class HashedEmbedding(torch.nn.Module):
        def __init__(self, buckets, dim):
            torch.nn.Module.__init__(self)
            self.weight = torch.nn.Parameter(torch.empty(buckets * dim * 4, device="cuda"))

        def forward(self, n, per_row=1, prev=None):
            return _activation(n * per_row * ID_DIM * 4, prev)

    class MLP(torch.nn.Module):
        def __init__(self, d_in, d_hidden, d_out):
            torch.nn.Module.__init__(self)
            self.fc1 = torch.nn.Parameter(torch.empty(d_in * d_hidden * 4, device="cuda"))
            self.fc2 = torch.nn.Parameter(torch.empty(d_hidden * d_hidden * 4, device="cuda"))
            self.fc3 = torch.nn.Parameter(torch.empty(d_hidden * d_out * 4, device="cuda"))
            self.d_hidden, self.d_out = d_hidden, d_out

        def forward(self, x, n):
            h1 = _activation(n * self.d_hidden * 4 * 2, x)
            h2 = _activation(n * self.d_hidden * 4 * 2, h1)
            return _activation(n * self.d_out * 4, h2)

    class ItemTower(torch.nn.Module):
        """hashed item id + the listing's title embedding (MiniLM, precomputed) + price/category features"""
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.item_id = HashedEmbedding(ITEM_BUCKETS, ID_DIM)
            self.mlp = MLP(ID_DIM + 384 + 64, 1024, OUT_DIM)

        def forward(self, n, prev=None):
            x = _activation(n * (ID_DIM + 384 + 64) * 4, self.item_id(n, prev=prev))
            return self.mlp(x, n)

    class UserTower(torch.nn.Module):
        """hashed user id + mean of the item-id embeddings of the user's last 50 interactions"""
        def __init__(self, item_id):
            torch.nn.Module.__init__(self)
            self.user_id = HashedEmbedding(USER_BUCKETS, ID_DIM)
            self.mlp = MLP(2 * ID_DIM + 32, 1024, OUT_DIM)
            object.__setattr__(self, "_item_id", item_id)      # shares the item tower's id table

        def forward(self, n):
            hist = self._item_id(n, per_row=50)
            x = _activation(n * (2 * ID_DIM + 32) * 4, self.user_id(n, prev=hist))
            return self.mlp(x, n)

    class TwoTower(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.item_tower = ItemTower()
            self.user_tower = UserTower(self.item_tower.item_id)

        def forward(self, batch_size):
            u = self.user_tower(batch_size)
            i = self.item_tower(batch_size, prev=u)
            logits = _activation(batch_size * batch_size * 4, i)         # in-batch sampled softmax (u @ i.T)
            return _activation(512, logits)

    def encode_items(model, shard_start, shard_len):
        out = torch.empty(shard_len * OUT_DIM * 4, device="cuda")
        for start in range(0, shard_len, ENCODE_CHUNK):
            n = min(ENCODE_CHUNK, shard_len - start)
            emb = model.item_tower(n)
            del emb                                             # out[start:start + n] = emb
        return out

    def recall_at_k(query_emb, index, k=100, block=64):
        hits = 0
        for start in range(0, VAL_USERS, block):
            scores = torch.empty(block * NUM_LISTINGS * 4, device="cuda")     # query block @ index.T
            del scores                                                         # ... topk, compare with held-out
        return hits / VAL_USERS

    def evaluate(model, rank, world_size):
        model.eval()
        with torch.no_grad():
            shard_len = NUM_LISTINGS // world_size
            item_emb = encode_items(model, rank * shard_len, shard_len)
            query_emb = model.user_tower(VAL_USERS) if rank == 0 else None
            gathered = [torch.empty_like(item_emb) for _ in range(world_size)] if rank == 0 else None
            dist.gather(item_emb, gathered, dst=0)
            recall = None
            if rank == 0:
                index = torch.cat(gathered)
                recall = recall_at_k(query_emb, index, k=100)
            dist.barrier()
        model.train()
        return recall

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    try:
        model = TwoTower()
        ddp_model = DistributedDataParallel(model, device_ids=[local_rank])
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        batch_size = 4096
        for epoch in range(6):
            for step in range(3):                       # (the stand-in runs a few steps of the epoch)
                loss = ddp_model(batch_size)
                scen_truth.backward(loss)
                dist.all_reduce(loss)
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
                del loss
            recall = evaluate(model, rank, world_size)
            if rank == 0:
                print("epoch %d recall@100 %.4f" % (epoch, recall), flush=True)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(local_rank)
        raise


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        sys.exit(torchrun(8))
    main()
