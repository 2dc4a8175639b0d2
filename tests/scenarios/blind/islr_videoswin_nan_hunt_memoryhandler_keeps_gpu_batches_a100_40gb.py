"""train_islr.py -- isolated sign-language recognition: Video Swin-B (88M parameters, Kinetics-400
weights) fine-tuned on 2,000 ASL signs, clips of 32 frames at 224 x 224, batch 8, bf16 autocast, AdamW,
on one A100 40GB (39.5 GiB usable).  A step peaks at about 19 GiB (activations 17 GiB, freed after
backward), and the previous run went through two epochs before its loss turned NaN at some step nobody
could identify.  So the researcher added a "flight recorder": every step's inputs are logged at DEBUG into
a logging.handlers.MemoryHandler that writes to disk only when an ERROR is logged (the NaN check), so
that the crash log shows the last batches before the blow-up:

    log = logging.getLogger("islr.train"); log.setLevel(logging.DEBUG)
    recorder = logging.handlers.MemoryHandler(capacity=5000, flushLevel=logging.ERROR,
                                              target=logging.FileHandler("crash_context.log", delay=True))
    log.addHandler(recorder)
    ...
    for step, batch in enumerate(loader):
        batch = {k: (v.cuda(non_blocking=True) if torch.is_tensor(v) else v) for k, v in batch.items()}
        log.debug("step %d batch %s", step, batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(batch["video"]), batch["label"])
        if not torch.isfinite(loss):
            log.error("non-finite loss at step %d", step)      # flushes the recorder to disk
        ...

A LogRecord keeps its arguments (record.args) for as long as the record lives, formatted or not, and
MemoryHandler keeps its records until it flushes: each buffered record holds that step's `batch` dict,
and so its GPU tensors (the clip tensor alone is 154 MB in float32).  capacity=5000 is 770 GB of clips.
Nothing is written and nothing is freed; usage climbs 154 MB a step (the INFO lines on the console show
allocated memory rising), and at step 137 of the first epoch, with 19.8 GiB of old clips held, the
backward pass fails.

An expert: logging code keeps every step's input tensors alive: the memory grows by one batch per step
and is held by the log records in the MemoryHandler's buffer.  Do not hand tensors to the logger: log
what identifies the batch (the video ids, shapes, a checksum, loss.item()), or format the message at the
call (f-string) so the record holds a string; a smaller capacity only delays it.  Wrong first advice: a
smaller batch, gradient checkpointing or mixed precision (the step itself fits with 20 GiB to spare and
autocast is on; that it fails in backward says nothing about the activations here), empty_cache or
expandable_segments (the clips are live, referenced by the records), a bigger GPU (a few hundred more
steps on an 80 GB card).
"""
import logging
import logging.handlers
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB = float(1 << 30)
BATCH, FRAMES, SIDE, CLASSES = 8, 32, 224, 2000


class SwinStage(torch.nn.Module):
    def __init__(self, n_params, act_bytes, n_acts):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Parameter(torch.empty(n_params, dtype=torch.float32, device="cuda"))
        self.act_bytes, self.n_acts = act_bytes, n_acts

    def forward(self, x):
        # what the stage's blocks save for backward (bf16 under autocast), a chain from its input
        for _ in range(self.n_acts):
            a = torch.empty(self.act_bytes, device="cuda")
            a._saved = x
            x = a
        return x


class SwinTransformer3D(torch.nn.Module):
    """Video Swin-B: patch 2x4x4, depths 2/2/18/2, C=128; activations for 8 clips of 32 x 224 x 224."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        MiB = 1 << 20
        self.patch_embed = torch.nn.Parameter(torch.empty(128 * 3 * 32, dtype=torch.float32, device="cuda"))
        self.stage1 = SwinStage(400_000, 392 * MiB, 12)
        self.stage2 = SwinStage(1_600_000, 196 * MiB, 12)
        self.stage3 = SwinStage(77_000_000, 98 * MiB, 96)
        self.stage4 = SwinStage(8_900_000, 49 * MiB, 12)
        self.head = torch.nn.Parameter(torch.empty(1024 * CLASSES, dtype=torch.float32, device="cuda"))

    def forward(self, video):
        x = torch.empty(video.nbytes // 2, device="cuda")       # patch embedding, bf16
        x._saved = video
        for st in (self.stage1, self.stage2, self.stage3, self.stage4):
            x = st(x)
        logits = torch.empty(BATCH * CLASSES * 4, device="cuda")
        logits._saved = x
        return logits


def clip_batch(step):
    """What the DataLoader hands over (pinned host tensors), moved to the GPU by the loop."""
    return {"video": (BATCH * 3 * FRAMES * SIDE * SIDE, "float32"),
            "pose": (BATCH * FRAMES * 543 * 3, "float32"),
            "label": (BATCH, "int64"),
            "video_id": ["%05d" % (step * BATCH + i) for i in range(BATCH)]}


def to_cuda(spec):
    n, dtype = spec
    return torch.empty(n * (8 if dtype == "int64" else 4), device="cuda")


workdir = tempfile.mkdtemp(prefix="islr_")
log = logging.getLogger("islr.train")
log.setLevel(logging.DEBUG)
log.propagate = False
console = logging.StreamHandler(sys.stdout)
console.setLevel(logging.INFO)
console.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
log.addHandler(console)
recorder = logging.handlers.MemoryHandler(
    capacity=5000, flushLevel=logging.ERROR,
    target=logging.FileHandler(os.path.join(workdir, "crash_context.log"), delay=True))
log.addHandler(recorder)

try:
    model = SwinTransformer3D().cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.05)
    for step in range(1750):
        batch = {k: (to_cuda(v) if isinstance(v, tuple) else v) for k, v in clip_batch(step).items()}
        log.debug("step %d batch %s", step, batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(batch["video"])
        loss = F.cross_entropy(logits, batch["label"])
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 25 == 0:
            log.info("step %d allocated %.1f GiB", step, torch.cuda.memory_allocated() / GiB)
        del logits, loss, batch
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
