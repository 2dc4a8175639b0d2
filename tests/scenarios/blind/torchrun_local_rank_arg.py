"""train.py under `torchrun --nproc_per_node 2 train.py` on a node with two 24 GiB GPUs.  The script
still takes its device from an argparse option that the old torch.distributed.launch passed and
torchrun does not (torchrun sets LOCAL_RANK in the environment only):

    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    torch.cuda.set_device(args.local_rank)                 # 0 on every rank
    with main_process_first():                            # rank 0 loads (and caches) first
        model = load_model().to("cuda")                    # 12 GiB fp32 weights

Both ranks land on GPU 0 (GPU 1 stays empty).  Rank 0 loads its 12 GiB and waits at the barrier;
rank 1 then fails loading its copy.  The other process on the GPU is this job's own rank 0: killing
it is no fix, nor is a smaller model.  An expert: use LOCAL_RANK (torch.cuda.set_device(
int(os.environ["LOCAL_RANK"]))) so each rank gets its own GPU.
"""
import os
import subprocess
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def launcher(nproc=2):
    """torchrun: one worker process per rank, the rank in the environment, the same command."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env))
    rc = 0
    while procs:                        # the first worker that fails brings the others down
        for p in list(procs):
            st = p.poll()
            if st is None:
                continue
            procs.remove(p)
            if st != 0:
                rc = 1
                for q in procs:
                    q.terminate()
        time.sleep(0.05)
    return rc


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(48):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(256 * MiB, device="cuda")))


def load_model():
    return Model()


def barrier(name, rank, world):
    """dist.barrier() (the stand-in: a file per rank in the shared state directory)."""
    d = os.environ["SCEN_STATE"]
    open(os.path.join(d, "%s-%d" % (name, rank)), "w").close()
    while not all(os.path.exists(os.path.join(d, "%s-%d" % (name, r))) for r in range(world)):
        time.sleep(0.02)


def worker():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=0)
    args = parser.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(args.local_rank)
    try:
        if rank != 0:
            barrier("main_first", rank, world)            # main_process_first: wait for rank 0
        model = load_model().to("cuda")
        if rank == 0:
            barrier("main_first", rank, world)
        barrier("ready", rank, world)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(args.local_rank)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(worker() if "RANK" in os.environ else launcher())
