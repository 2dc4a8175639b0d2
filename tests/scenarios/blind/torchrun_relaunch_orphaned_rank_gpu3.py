"""train.py under `torchrun --nproc_per_node 4 train.py` on a 4 x 24 GiB node -- DDP fine-tuning of a
1B-parameter model (fp32, AdamW).  Ten minutes earlier the user stopped the previous run with
Ctrl-C, then `kill -9` on torchrun when it hung in shutdown; its rank 3 never exited (it was stuck in
an NCCL call): reparented to init, it still holds ~20 GiB of GPU 3.  nvidia-smi shows it as
`python3 -u train.py`, the same command as the new ranks.  The user relaunches:

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)                       # each rank on its own GPU: correct
    dist.init_process_group("nccl")
    model = build_model().cuda()                             # 3.7 GiB of fp32 weights
    model = DDP(model, device_ids=[local_rank])

Ranks 0-2 load their copy and wait at the barrier; rank 3 finds 3.5 GiB free on GPU 3 and fails
loading the weights.  The job is configured right (one rank per GPU, set_device before any CUDA work)
and fits: GPUs 0-2 hold their ranks' 3.7 GiB each.  The memory on GPU 3 belongs to a stale process of
an earlier launch (another torchelastic run id, its parent gone), not to a rank of this job.  An
expert: find and kill the leftover process (nvidia-smi / fuser -v /dev/nvidia3, kill its pid),
then relaunch; nothing in the job needs to shrink.
"""
import os
import subprocess
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
NPROC = 4


def launcher():
    """torchrun: one worker process per rank, the rank in the environment, the same command."""
    procs = []
    for r in range(NPROC):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(NPROC),
                   LOCAL_WORLD_SIZE=str(NPROC), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="run-b71c", TORCHELASTIC_RESTART_COUNT="0")
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
        for i in range(30):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(126 * MiB, device="cuda")))


def build_model():
    return Model()


def barrier(name, rank, world):
    """dist.barrier() (the stand-in: a file per rank in the shared state directory)."""
    d = os.environ["SCEN_STATE"]
    open(os.path.join(d, "%s-%d" % (name, rank)), "w").close()
    while not all(os.path.exists(os.path.join(d, "%s-%d" % (name, r))) for r in range(world)):
        time.sleep(0.02)


def worker():
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    scen_truth.note_every_empty(torch)
    try:
        model = build_model().cuda()
        barrier("ddp_init", rank, world)
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
        barrier("done", rank, world)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(local_rank)
        raise
    return 0


def leftover():
    """The previous launch's rank 3 (test scaffolding for what the user's machine already holds):
    weights, gradients, AdamW state and cache of the earlier run on GPU 3, then stuck for good."""
    torch.cuda.set_device(3)
    held = [torch.empty(500 * MiB, device="cuda") for _ in range(40)]      # ~20 GiB
    open(os.environ["SCEN_READY"] + ".leftover", "w").close()
    while True:
        time.sleep(1)


def start_leftover():
    """Starts the leftover as an orphan: a child of a process that exits, with the command line and
    the rank variables of a worker of the earlier launch; returns once it holds its memory."""
    env = dict(os.environ, RANK="3", LOCAL_RANK="3", WORLD_SIZE=str(NPROC), LOCAL_WORLD_SIZE=str(NPROC),
               GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="run-5e02",
               TORCHELASTIC_RESTART_COUNT="0", SCEN_LEFTOVER="1")
    subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env)
    while not os.path.exists(os.environ["SCEN_READY"] + ".leftover"):
        time.sleep(0.02)
    open(os.environ["SCEN_READY"], "w").close()
    os._exit(0)


if __name__ == "__main__":
    if os.environ.get("SCEN_LEFTOVER"):
        leftover()
    elif "--start-leftover" in sys.argv:
        start_leftover()
    sys.exit(worker() if "RANK" in os.environ else launcher())
