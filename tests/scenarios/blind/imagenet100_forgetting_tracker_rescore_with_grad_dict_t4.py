"""train_prune.py -- data-pruning study on a T4 (15 GiB): ResNet-50 on ImageNet-100 at 224 px, batch 64,
fp16 autocast + GradScaler, SGD with momentum, to compute "forgetting events" per training example
(Toneva et al.) and prune the never-forgotten ones.  The baseline run without the tracker trained for
hours at a flat ~5 GiB.  The tracker the user bolted on re-scores each batch right after the optimizer
step to see which examples the update "learned" or "forgot":

    class ForgettingTracker:
        def __init__(self): self.last_correct = {}; self.events = collections.Counter()
        def update(self, idx, correct):                 # correct: bool tensor [B] on the GPU
            for j, i in enumerate(idx.tolist()):
                prev = self.last_correct.get(i)
                ...
                self.last_correct[i] = correct[j]       # a 0-d view of the batch's tensor, kept per example

    for step, (x, y, idx) in enumerate(loader):
        with autocast(): loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward(); scaler.step(opt); scaler.update(); opt.zero_grad()
        logits = model(x)                              # re-score AFTER the step -- no torch.no_grad()
        tracker.update(idx, logits.argmax(1) == y)

The re-scoring forward runs with autograd on and is never backwarded, so its graph keeps every saved
activation of the pass (~1 GiB at batch 64) -- and each `correct[j]` the dict keeps is a view whose base
sits in that graph.  Every step pins one more pass: allocated memory after each optimizer step climbs by
~1 GiB and the job dies around its 15th step, in the training forward (a stage of the backbone).

What the user says: "ResNet-50 at batch 64 in fp16 doesn't fit a T4 anymore?"  What an expert says first:
a real leak through a Python object: store plain Python bools (`correct.tolist()` / `.cpu()`) in the
tracker and run the re-scoring under torch.no_grad() (or inference_mode).  Wrong advice: a smaller batch,
expandable_segments or empty_cache (the memory is live, not cached), gradient checkpointing (the kept
graphs are not the training pass's), a bigger GPU (it only delays the crash).
"""
import collections
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
BATCH = 64
# (stage, parameter bytes fp32, activation bytes per image saved for backward, fp16)
STAGES = [("conv1", 37 * 1024, 6 * MiB), ("layer1", 870 * 1024, 4 * MiB), ("layer2", 4800 * 1024, 3 * MiB),
          ("layer3", 28 * MiB, 3 * MiB // 2), ("layer4", 57 * MiB, 1 * MiB // 2)]


class Stage(nn.Module):
    def __init__(self, pbytes, act_per_image):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(pbytes, device="cuda"))
        self.act_per_image = act_per_image

    def forward(self, x):
        out = torch.empty(x.shape_batch * self.act_per_image, device="cuda")   # conv+bn+relu outputs kept
        out._saved = x
        out.shape_batch = x.shape_batch
        return out


class ResNet50(nn.Module):
    def __init__(self, num_classes=100):
        nn.Module.__init__(self)
        for name, pb, act in STAGES:
            setattr(self, name, Stage(pb, act))
        self.fc = nn.Parameter(torch.empty(2048 * num_classes * 4, device="cuda"))

    def forward(self, x):
        h = x
        for name, _, _ in STAGES:
            h = getattr(self, name)(h)
        logits = torch.empty(x.shape_batch * 100 * 2, device="cuda")
        logits._saved = h
        logits.shape_batch = x.shape_batch
        return logits


class ForgettingTracker(object):
    def __init__(self):
        self.last_correct = {}
        self.events = collections.Counter()

    def update(self, idx, correct):
        for j, i in enumerate(idx):
            prev = self.last_correct.get(i)
            if prev is not None:
                pass                                     # (prev and not now) -> self.events[i] += 1
            self.last_correct[i] = correct.view()        # correct[j]: a view of the batch's tensor


def batches(n):
    for step in range(n):
        x = torch.empty(BATCH * 3 * 224 * 224 * 2, device="cuda")   # fp16 images after GPU normalisation
        x.shape_batch = BATCH
        yield x, list(range(step * BATCH, (step + 1) * BATCH))


try:
    model = ResNet50()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    tracker = ForgettingTracker()
    for step, (x, idx) in enumerate(batches(2000)):
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(x)
            loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)                       # scaler.scale(loss).backward()
        optimizer.step()                                # scaler.step(optimizer); scaler.update()
        optimizer.zero_grad()
        del logits, loss
        with torch.autocast("cuda", dtype=torch.float16):
            logits = model(x)                            # re-score after the update: autograd still on
        correct = torch.empty(BATCH, device="cuda")      # logits.argmax(1) == y
        correct._saved = logits
        correct = torch._derive(correct, logits)
        tracker.update(idx, correct)
        del logits, correct, x
        if step % 50 == 0:
            print("step %d" % step)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
