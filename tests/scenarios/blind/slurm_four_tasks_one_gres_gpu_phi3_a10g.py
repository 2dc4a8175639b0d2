"""train_phi3.py -- fine-tuning Phi-3-mini (3.8B, bf16, 7.1 GiB) on our Slurm cluster's g5.2xlarge queue:
one A10G (24 GB) per node.  The batch script was copied from the g5.12xlarge queue (4x A10G per node)
and only --gres was changed:

    #SBATCH --partition=g5-2xl --nodes=1 --ntasks-per-node=4 --gres=gpu:1
    srun python train_phi3.py

    dist.init_process_group("nccl")            # rank/world from SLURM_PROCID / SLURM_NTASKS
    torch.cuda.set_device(int(os.environ["SLURM_LOCALID"]) % torch.cuda.device_count())
    model = AutoModelForCausalLM.from_pretrained("microsoft/Phi-3-mini-4k-instruct",
                                                 torch_dtype=torch.bfloat16).cuda()
    model = DDP(model, device_ids=[torch.cuda.current_device()])

srun starts four tasks and --gres=gpu:1 gives the node's one GPU to all four: each sees it as cuda:0,
each loads its own copy of the model.  Three copies fit (3 x 7.6 GiB with contexts); the fourth task
dies in from_pretrained: "Tried to allocate 54 MiB, 24 GiB total, 44 MiB free", and nvidia-smi shows
four python processes on the card, all of them this job.  (The other three would fail at NCCL's first
collective anyway: NCCL refuses two ranks on one GPU.)

An expert: the memory is taken by the job's own other ranks on the same GPU; launch one task per GPU
(--ntasks-per-node=1 here, or ask for --gres=gpu:4 on the 4-GPU queue).  set_device cannot help (there
is one GPU), and a smaller batch, quantization, checkpointing or killing "other processes" (they are
this job's ranks) are wrong first answers.
"""
import os
import subprocess
import sys
import time

import torch
from torch import nn
import scen_truth

vocab = 32064


class Phi3DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        bf16 = torch.bfloat16
        self.qkv_proj = nn.Parameter(torch.empty(3072 * 9216, dtype=bf16))
        self.o_proj = nn.Parameter(torch.empty(3072 * 3072, dtype=bf16))
        self.gate_up_proj = nn.Parameter(torch.empty(3072 * 16384, dtype=bf16))
        self.down_proj = nn.Parameter(torch.empty(8192 * 3072, dtype=bf16))


class Phi3ForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(vocab * 3072, dtype=torch.bfloat16))
        self.layers = []
        for i in range(32):
            layer = Phi3DecoderLayer()
            self.layers.append(layer)
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(vocab * 3072, dtype=torch.bfloat16))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()


def wait_for(paths, timeout=60):
    t0 = time.time()
    while time.time() - t0 < timeout:
        for p in paths:
            if os.path.exists(p):
                return p
        time.sleep(0.05)
    return None


def srun():
    """What `srun` does here: four tasks of the same command, SLURM_PROCID 0..3, all on this node's GPU."""
    procs = []
    for r in range(4):
        env = dict(os.environ, SLURM_PROCID=str(r), SLURM_LOCALID=str(r), SLURM_NTASKS="4",
                   SLURM_NTASKS_PER_NODE="4", SLURM_STEP_ID="0")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    rcs = [p.wait() for p in procs]
    return max(rcs)


def task():
    rank = int(os.environ["SLURM_PROCID"])
    sync = os.environ["SCEN_STATE"]
    # the tasks reach from_pretrained one after another (rank 0 downloads, the others wait at a barrier
    # then read the cache); here each waits for the previous one to have loaded, to keep the order fixed
    if rank > 0 and wait_for([os.path.join(sync, "loaded.%d" % (rank - 1)),
                              os.path.join(sync, "failed")]) != os.path.join(sync, "loaded.%d" % (rank - 1)):
        return 1
    torch.cuda.set_device(int(os.environ["SLURM_LOCALID"]) % torch.cuda.device_count())
    try:
        model = Phi3ForCausalLM.from_pretrained("microsoft/Phi-3-mini-4k-instruct", torch_dtype=torch.bfloat16)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        open(os.path.join(sync, "failed"), "w").close()
        raise
    open(os.path.join(sync, "loaded.%d" % rank), "w").close()
    # DDP(model) -> the first collective: waits for every rank; a rank that died ends the step
    if wait_for([os.path.join(sync, "loaded.3"), os.path.join(sync, "failed")]) != os.path.join(sync, "loaded.3"):
        return 1
    del model
    return 0


if "SLURM_PROCID" not in os.environ:
    sys.exit(srun())
scen_truth.note_every_empty(torch)
sys.exit(task())
