"""train_seg.py -- a 264M-parameter segmentation transformer trained with DDP on one Slurm node with four
RTX A5000s (24 GB), resumed after the job hit its time limit:

    #SBATCH --nodes=1 --ntasks-per-node=4 --gres=gpu:4
    srun python train_seg.py --resume /shared/ckpt/segformer/last.pt

    def main():
        ckpt = torch.load(args.resume)                  # model + AdamW state, 3 GiB, saved by rank 0
        setup_distributed()                             # init_process_group; set_device(SLURM_LOCALID)
        model = SegTransformer().cuda()                 # on the rank's own GPU
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])    # moments cast to each parameter's device
        model = DDP(model, device_ids=[local_rank])
        for batch in loader: ...                        # ckpt stays referenced in main() for the whole run

The fresh run (no --resume) trains at about 17.5 GiB per card.  The resumed run dies in rank 0's first
forward pass on GPU 0, 8 GiB into its 12 GiB of activations; ranks 1-3 wait in the first all-reduce
until srun kills them.  nvidia-smi on the node shows all four python processes on GPU 0.  The
checkpoint was saved from cuda:0, and torch.load restores every tensor to the device it was saved
from -- whatever device was current: each rank put its own 3 GiB copy of the checkpoint (and a CUDA
context) on GPU 0, before it selected its own card, and keeps it alive through `ckpt`.  GPU 0 carries
the three other ranks' 10.4 GiB besides rank 0's own 3 GiB copy.

An expert: load the checkpoint with map_location="cpu" (or map_location=f"cuda:{local_rank}"), and
`del ckpt` once the model and optimizer have their state.  Calling set_device earlier would not move
what torch.load restores to cuda:0; a smaller batch, checkpointing or mixed precision shrink a step
that fits; the other processes are this job's own ranks, not someone else's to stop.
"""
import json
import os
import signal
import subprocess
import sys
import time

MiB = 1 << 20

LAYERS = 24
LAYER_PARAMS = 42 * MiB                  # fp32 bytes of one block (11M parameters): 1008 MiB in all
LAYER_ACT = 512 * MiB                    # activations saved per block: batch 8 of 1024 x 1024 crops


def srun(argv):
    """What `srun python train_seg.py --resume ...` does on this node: four tasks, each with its Slurm
    variables; when a task fails, the step's other tasks are killed and srun exits with its status."""
    ckpt = os.environ["CKPT"]
    if not os.path.exists(ckpt):
        # the checkpoint the previous job saved (torch.save from rank 0 on cuda:0): tensor sizes by name
        sizes = {}
        for i in range(LAYERS):
            sizes["model.block%d.weight" % i] = LAYER_PARAMS
            sizes["optimizer.block%d.exp_avg" % i] = LAYER_PARAMS
            sizes["optimizer.block%d.exp_avg_sq" % i] = LAYER_PARAMS
        with open(ckpt, "w") as f:
            json.dump(sizes, f)
    os.makedirs(os.environ["RENDEZVOUS_DIR"], exist_ok=True)
    tasks = []
    for r in range(4):
        env = dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS="4", SLURM_NODEID="0",
                   SLURM_STEP_ID="0", SLURM_NTASKS_PER_NODE="4", CUDA_VISIBLE_DEVICES="0,1,2,3")
        tasks.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), "--resume", ckpt], env=env))
    status = 0
    while status == 0 and any(t.poll() is None for t in tasks):
        for r, t in enumerate(tasks):
            if t.poll() not in (None, 0):
                print("srun: error: task %d: Exited with exit code %d" % (r, t.returncode), file=sys.stderr)
                status = t.returncode
                break
        time.sleep(0.05)
    for t in tasks:
        if t.poll() is None:
            t.send_signal(signal.SIGTERM)
    for t in tasks:
        t.wait()
        status = status or t.returncode
    return 1 if status else 0


def barrier(name, rank, world, timeout=120):
    """The process group's rendezvous/barrier (c10d store on MASTER_ADDR), through files."""
    d = os.environ["RENDEZVOUS_DIR"]
    open(os.path.join(d, "%s.%d" % (name, rank)), "w").close()
    t0 = time.time()
    while not all(os.path.exists(os.path.join(d, "%s.%d" % (name, r))) for r in range(world)):
        if time.time() - t0 > timeout:
            raise RuntimeError("[Rank %d] Watchdog caught collective operation timeout: %s" % (rank, name))
        time.sleep(0.02)


def train(resume):
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class Block(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.weight = torch.nn.Parameter(torch.empty(LAYER_PARAMS, device="cuda"))

        def forward(self, x):
            h = torch.empty(LAYER_ACT, device="cuda")
            h._saved = x
            return h

    class SegTransformer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.blocks = []
            for i in range(LAYERS):
                b = Block()
                setattr(self, "block%d" % i, b)
                self.blocks.append(b)

        def forward(self, images):
            h = images
            for b in self.blocks:
                h = b(h)
            loss = torch.empty(512, device="cuda")
            loss._saved = h
            return loss

    def load_optimizer_state(optimizer, state):
        """optimizer.load_state_dict(ckpt["optimizer"]): each moment cast to its parameter's device (a
        copy when the checkpoint's tensor is on another GPU)."""
        for i, p in enumerate(optimizer.param_groups[0]["params"]):
            moments = {}
            for k in ("exp_avg", "exp_avg_sq"):
                t = state["optimizer.block%d.%s" % (i, k)]
                moments[k] = t if t.device == p.device else torch.empty_like(p)
            optimizer.state[p] = dict(step=41000, **moments)

    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    local_rank = int(os.environ["SLURM_LOCALID"])

    ckpt = torch.load(resume)                       # restored to cuda:0, where it was saved from

    # setup_distributed()
    barrier("init_process_group", rank, world)
    torch.cuda.set_device(local_rank)

    model = SegTransformer().cuda()
    model.load_state_dict(dict((k[len("model."):], v) for k, v in ckpt.items() if k.startswith("model.")))
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5, weight_decay=0.01)
    load_optimizer_state(optimizer, ckpt)
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    barrier("ddp_init", rank, world)

    batch_size = 8
    for step in range(41001, 160000):
        images = torch.empty(batch_size * 3 * 1024 * 1024 * 2, device="cuda")
        loss = model(images)
        scen_truth.backward(loss)
        barrier("allreduce_%d" % step, rank, world)     # DDP's gradient all-reduce
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, images


if __name__ == "__main__":
    if sys.argv[1:2] == ["--srun"]:
        sys.exit(srun(sys.argv[2:]))
    try:
        train(sys.argv[sys.argv.index("--resume") + 1])
    except Exception as e:
        import torch
        if isinstance(e, torch.OutOfMemoryError):
            import scen_truth
            scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
