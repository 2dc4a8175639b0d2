"""finetune_mnli.py -- a learning-rate sweep of DeBERTa-v3-large (435M parameters) on MNLI, submitted as a Slurm
job array on a shared cluster whose nodes have 4x A100-SXM4-40GB:

    #SBATCH --array=0-7 --gres=gpu:1 --cpus-per-task=8 --time=12:00:00
    srun python finetune_mnli.py --lr ${LRS[$SLURM_ARRAY_TASK_ID]} --seed $SLURM_ARRAY_TASK_ID

Each array task is a job of its own (SLURM_JOB_ID 5512841, 5512842, 5512843, ...) and Slurm gives each one GPU:
task 0 got GPU 0, task 1 GPU 1, task 2 GPU 2 (CUDA_VISIBLE_DEVICES=2, SLURM_JOB_GPUS=2).  The cluster does not
constrain devices with cgroups, so a job can see the whole node.  The script was grown from a notebook whose
first cell was

    os.environ["CUDA_VISIBLE_DEVICES"] = "0"      # "use the first GPU"

and that line is still the script's first statement: it overwrites what Slurm set, so every task of the array
that lands on this node runs on physical GPU 0.  Tasks 0 and 1 started first and are training there (DeBERTa-v3
-large fine-tuning: fp32 weights 1.6 GiB, gradients 1.6 GiB, AdamW 3.2 GiB, ~11 GiB of activations cached by
the allocator in bf16 autocast at batch 32 x 256 tokens: ~17.4 GiB each with its CUDA context, 35.8 GiB of the
40 GiB).  Task 2 (this process) starts on the same card: its weights fit in the ~3.7 GiB left beside its own
context, its first forward pass (24 layers keeping ~0.45 GiB of activations each) fails in layer 5.  GPUs 2
and 3, which Slurm gave to tasks 2 and 3, sit idle.

(In this stand-in the two earlier array tasks are two processes started first, detached from this one as
slurmstepd's children would be: the same script with their own --lr/--seed and their own Slurm environment,
holding their memory on the shared simulated GPU until this process is gone.)

What an expert says first: the memory is held by two other processes -- your own sweep's other array tasks --
on the same GPU; the job itself fits an A100-40GB comfortably (task 0 runs fine alone).  Delete the hard-coded
CUDA_VISIBLE_DEVICES line and let Slurm's binding stand (each task then gets its own GPU).  Wrong advice: a
smaller batch, gradient checkpointing, mixed precision (already bf16 autocast), ZeRO/FSDP, a bigger GPU,
expandable segments or empty_cache -- and killing the other processes, which are the sweep's own healthy runs.
"""
import os

os.environ["CUDA_VISIBLE_DEVICES"] = "0"      # from the prototype notebook: "use the first GPU"

import argparse
import sys
import tempfile
import time

MiB = 1 << 20
GiB = 1 << 30

parser = argparse.ArgumentParser()
parser.add_argument("--lr", type=float, default=3e-5)
parser.add_argument("--seed", type=int, default=2)
parser.add_argument("--batch-size", type=int, default=32)
parser.add_argument("--max-length", type=int, default=256)
args = parser.parse_args()

EARLIER = os.environ.get("SCEN_EARLIER_TASK_OF")     # set only for the stand-ins of tasks 0 and 1


def start_earlier_tasks():
    """Scaffolding: the array tasks 0 and 1, already running on GPU 0 when task 2 starts.  Each is this script
    with its own arguments and Slurm environment, detached (double fork) so that, as under slurmstepd, it is
    no child of this process.  Returns the folder where they say they are ready."""
    sync = tempfile.mkdtemp(prefix="sweep-sync-")
    me = os.getpid()
    tasks = [("1e-05", "0", "5512841", "0"), ("2e-05", "1", "5512842", "1")]
    for lr, task, jobid, gpus in tasks:
        env = dict(os.environ)
        env.update({"SCEN_EARLIER_TASK_OF": "%d:%s" % (me, sync), "SLURM_JOB_ID": jobid,
                    "SLURM_ARRAY_TASK_ID": task, "SLURM_JOB_GPUS": gpus, "SLURM_STEP_GPUS": gpus,
                    "GPU_DEVICE_ORDINAL": gpus, "CUDA_VISIBLE_DEVICES": gpus})
        env.pop("SCEN_TRUTH", None)
        pid = os.fork()
        if pid == 0:
            if os.fork() == 0:
                os.setsid()
                os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), "--lr", lr, "--seed", task],
                          env)
            os._exit(0)
        os.waitpid(pid, 0)
        # one after the other, as the array's tasks started
        for _ in range(3000):
            if os.path.exists(os.path.join(sync, "ready.%s" % task)):
                break
            time.sleep(0.01)
    return sync


if EARLIER is None:
    start_earlier_tasks()

import torch  # noqa: E402

import scen_truth  # noqa: E402

if EARLIER is None:
    scen_truth.note_every_empty(torch)

HIDDEN, LAYERS, INTER, HEADS = 1024, 24, 4096, 16


class DebertaV2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # query/key/value and output projections (v3 shares them with the relative-position terms)
        self.in_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 3 * 4, device="cuda"))
        self.out_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))

    def forward(self, hidden, bsz, seq):
        """Disentangled attention in bf16: q/k/v, the content-to-content scores, the content-to-position and
        position-to-content scores, the softmax: each kept for backward (the stand-in chains what an
        operation saved through `_saved`, as autograd's graph holds it)."""
        tokens = bsz * seq
        t = hidden
        for n in (tokens * HIDDEN * 3,                          # q, k, v
                  bsz * HEADS * seq * seq,                      # content-to-content scores
                  bsz * HEADS * seq * seq,                      # content-to-position
                  bsz * HEADS * seq * seq,                      # position-to-content
                  bsz * HEADS * seq * seq,                      # softmax
                  tokens * HIDDEN):                             # context
            nxt = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            nxt._saved = t
            t = nxt
        return t


class DebertaV2Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = DebertaV2Attention()
        self.intermediate = torch.nn.Parameter(torch.empty(HIDDEN * INTER * 4, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty(INTER * HIDDEN * 4, device="cuda"))

    def forward(self, hidden, bsz, seq):
        tokens = bsz * seq
        t = self.attention(hidden, bsz, seq)
        for n in (tokens * INTER, tokens * INTER, tokens * HIDDEN):   # GELU input, GELU output, layer output
            nxt = torch.empty(n, dtype=torch.bfloat16, device="cuda")
            nxt._saved = t
            t = nxt
        return t


class DebertaV2Encoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layer = torch.nn.Module()                   # nn.ModuleList: children "0" ... "23"
        for i in range(LAYERS):
            setattr(self.layer, str(i), DebertaV2Layer())

    def forward(self, hidden, bsz, seq):
        for i in range(LAYERS):
            hidden = getattr(self.layer, str(i))(hidden, bsz, seq)
        return hidden


class DebertaV2ForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # 128k-token vocabulary x 1024 (0.5 GiB fp32) and the relative-position embeddings
        self.word_embeddings = torch.nn.Parameter(torch.empty(128100 * HIDDEN * 4, device="cuda"))
        self.rel_embeddings = torch.nn.Parameter(torch.empty(512 * HIDDEN * 4, device="cuda"))
        self.encoder = DebertaV2Encoder()
        self.classifier = torch.nn.Parameter(torch.empty(HIDDEN * 3 * 4, device="cuda"))

    def forward(self, input_ids, bsz, seq):
        emb = torch.empty(bsz * seq * HIDDEN, dtype=torch.bfloat16, device="cuda")
        emb._saved = input_ids
        hidden = self.encoder(emb, bsz, seq)
        loss = torch.empty(128, device="cuda")
        loss._saved = hidden
        return loss


def wait_for_main(spec):
    """Scaffolding for the earlier tasks: say ready, keep training (holding the memory) until task 2 is gone."""
    main_pid, sync = spec.split(":", 1)
    open(os.path.join(sync, "ready.%d" % args.seed), "w").close()
    for _ in range(6000):
        try:
            os.kill(int(main_pid), 0)
        except OSError:
            return
        time.sleep(0.01)


def main():
    model = DebertaV2ForSequenceClassification().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    bsz, seq = args.batch_size, args.max_length
    for step in range(12272):                          # 392,702 MNLI pairs / 32 per step
        input_ids = torch.empty(bsz * seq * 8, device="cuda")          # the batch's int64 token ids
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, bsz, seq)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del loss, input_ids
        if EARLIER is not None and step == 1:
            wait_for_main(EARLIER)
            return


if EARLIER is not None:
    main()
    sys.exit(0)

try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
