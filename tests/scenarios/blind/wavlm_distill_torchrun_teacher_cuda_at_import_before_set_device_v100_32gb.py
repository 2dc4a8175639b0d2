"""distill.py -- layer-to-layer distillation of WavLM-Large (teacher, 316M parameters, frozen) into a
4-layer DistilHuBERT-style student on LibriSpeech 960 h, launched on a DGX-1 (8 x V100-SXM2-32GB) with

    torchrun --nproc-per-node 8 distill.py

The teacher lives in losses.py, built when the module is imported -- before main() runs
init_process_group and torch.cuda.set_device(local_rank):

    # losses.py
    TEACHER = WavLMModel.from_pretrained("microsoft/wavlm-large").cuda().eval()     # "cuda" = cuda:0 here
    def distill_loss(student_hidden, wav):
        with torch.no_grad():
            t = TEACHER(wav.to(TEACHER.device), output_hidden_states=True).hidden_states
        ...

So every rank puts its CUDA context, its copy of the teacher (1.2 GiB fp32) and the teacher's forward
(25 hidden states for 8 x 16 s of audio, the CNN front end: ~2.3 GiB in its cache) on GPU 0; only the
student goes to the rank's own GPU.  Seven peer ranks hold ~4 GiB each on GPU 0 (28 GiB); rank 0 --
whose student (3 GiB of activations for the batch) also trains on GPU 0 -- fails in its first forward.  GPUs 1-7
are nearly empty.  User's words: "it worked on 2 GPUs, on 8 rank 0 dies at step 0; nvidia-smi shows
eight python processes on GPU 0".

An expert, first: this job's own ranks are on the wrong GPU -- call torch.cuda.set_device(local_rank)
(or build the teacher lazily inside main, on f"cuda:{local_rank}") before anything touches CUDA, so each
rank's teacher and context sit on its own card.  Wrong advice: killing "the other processes" (they are
the job's own ranks), a smaller batch, empty_cache, a bigger GPU.
"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch

import scen_truth

MiB = 1 << 20
BATCH_SIZE, SECONDS, NPROC = 8, 16, 8


class WavLMModel(torch.nn.Module):
    """The frozen teacher: 316M parameters (fp32)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.feature_extractor = torch.nn.Parameter(torch.empty(17 * MiB, device="cuda"))
        self.encoder = torch.nn.Parameter(torch.empty(1190 * MiB, device="cuda"))

    def forward(self, wav, output_hidden_states=True):
        frames = BATCH_SIZE * SECONDS * 50
        # CNN front end: first conv (512 channels, stride 5), GroupNorm, GELU: 800 MiB each, then cached
        cnn = [torch.empty(BATCH_SIZE * SECONDS * 16000 // 5 * 512 * 4, device=wav.device) for _ in range(3)]
        del cnn
        hidden = [torch.empty(frames * 1024 * 4, device=wav.device) for _ in range(25)]
        scores = torch.empty(BATCH_SIZE * 16 * 800 * 800 * 4, device=wav.device)   # one layer's attention
        del scores
        return hidden


def launch():
    """torchrun: one process per GPU with its rank variables; a failed rank ends the job."""
    store = tempfile.mkdtemp(prefix="distill-store-")
    procs = []
    for r in range(NPROC):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(NPROC), LOCAL_WORLD_SIZE=str(NPROC),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="distill-wavlm",
                   DIST_FILE_STORE=store)
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)], env=env))
    rc = procs[0].wait()
    open(os.path.join(store, "done"), "w").close()               # the job is torn down
    for p in procs[1:]:
        if rc:
            p.kill()
        p.wait()
    shutil.rmtree(store, ignore_errors=True)
    return 1 if rc else 0


if __name__ == "__main__" and "LOCAL_RANK" not in os.environ:     # this process is torchrun
    sys.exit(launch())


# losses.py, run at import: every rank, before main() has chosen its GPU
TEACHER = WavLMModel().cuda().eval()


def distill_loss(student_hidden, wav):
    with torch.no_grad():
        t = TEACHER(wav, output_hidden_states=True)
    targets = [torch.empty(h.nbytes, device=torch.cuda.current_device()) for h in t[-4:]]   # .to(student)
    del t
    loss = torch.empty(512, device=torch.cuda.current_device())
    loss._saved, loss._targets = student_hidden, targets
    loss._params = student_hidden._params
    return loss


class Student(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(96 * MiB, device="cuda"))

    def forward(self, wav):
        h = wav
        for _ in range(4):                       # per layer: QKV, scores, FFN, norms saved for backward
            out = torch.empty(BATCH_SIZE * SECONDS * 50 * 768 * 4 * 40, device="cuda")     # 750 MiB
            out._saved = h
            h = out
        return h


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    store = os.environ["DIST_FILE_STORE"]                         # init_method="file://..."
    torch.cuda.set_device(local_rank)
    student = Student()
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4)
    if local_rank == 0:                                           # rank 0 enters the first all-reduce last
        while len([f for f in os.listdir(store) if f.startswith("grad-")]) < NPROC - 1:
            time.sleep(0.05)
    try:
        for step in range(200000):
            wav_teacher = torch.empty(BATCH_SIZE * SECONDS * 16000 * 4, device=0)    # wav.to(TEACHER.device)
            wav = torch.empty(BATCH_SIZE * SECONDS * 16000 * 4, device="cuda")
            loss = distill_loss(student(wav), wav_teacher)
            scen_truth.backward(loss)
            open(os.path.join(store, "grad-%d" % local_rank), "w").close()
            while not os.path.exists(os.path.join(store, "done")):   # waiting in DDP's all-reduce
                time.sleep(0.05)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(0)
        raise


if __name__ == "__main__":
    scen_truth.note_every_empty(torch)
    main()
    sys.exit(0)
