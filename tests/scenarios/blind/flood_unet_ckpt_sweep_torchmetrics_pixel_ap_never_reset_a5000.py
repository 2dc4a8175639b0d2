"""eval_ckpts.py -- a flood-mapping team picks the checkpoint of their Sentinel-1 flood-extent U-Net
(segmentation_models_pytorch Unet, ResNet-34 encoder, 2 SAR channels in, 24.4M parameters, float32) by
pixel-level average precision on their validation set: 544 chips of 512x512 with about 10% no-data pixels
(label -1).  Training saved a checkpoint every 5 epochs; this script, on the group's RTX A5000 (24 GB),
loops over them in one process:

    ap = BinaryAveragePrecision(thresholds=None, ignore_index=-1).cuda()     # exact AP, no binning
    for path in sorted(glob("runs/s1flood/epoch_*.pt")):
        model.load_state_dict(torch.load(path, map_location="cpu")["model"])
        with torch.inference_mode():
            for x, y in val_loader:                       # 16 chips a batch
                ap.update(model(x.cuda()).sigmoid(), y.cuda())
        results[path] = ap.compute().item()

The metric object is made once, outside the loop, and never reset.  A torchmetrics metric with
thresholds=None keeps every prediction and every target it was given in its list states (the preds in
float32, the targets as the int64 masks they were passed: 12 bytes per valid pixel, 1.43 GiB per pass over
the validation set), and compute() concatenates them all, argsorts them and builds the curve with several
int64 temporaries of the same length.  Without a reset, checkpoint k's compute() runs over k passes'
pixels: it is also wrong (the AP of a mix of checkpoints).  Checkpoints 5, 10 and 15 go through (the third
peaks at 18.8 GiB); at epoch_020 the states hold 5.7 GiB and compute(), with 21.2 GiB allocated, fails
making the int64 copy of the 513M sorted targets (3.8 GiB; 1.1 GiB free, 1.2 GiB cached in pieces).

An expert: the memory is the metric's accumulated state from the earlier checkpoints, a Python object kept
alive across iterations: call ap.reset() after each compute() (or build the metric inside the loop); then
each checkpoint peaks at 6.4 GiB, on any number of checkpoints.  Alternatives that also bound
it: binned AP (thresholds=200 keeps a fixed 200x2x2 confusion state), compute_on_cpu=True.  Wrong first
advice: a smaller batch (the batch is not what grows), splitting the compute or expandable_segments /
empty_cache (the bytes are live, and the result is wrong anyway), inference_mode (already on), mixed
precision, a bigger GPU (fails a few checkpoints later).
"""
import atexit
import json
import os
import shutil
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
CHIP = 512 * 512
VAL_CHIPS = 544
VALID = 0.90             # pixels that are not no-data
DISTINCT = 0.5           # share of distinct float32 scores among the sorted predictions


# ---- torchmetrics, as far as this script uses it (the library's Metric with list states) -------------------
def dim_zero_cat(x):
    """torchmetrics.utilities.data.dim_zero_cat: one tensor out of the list state (torch.cat)."""
    return torch.empty(sum(t.nbytes for t in x), dtype=torch.uint8, device="cuda")


class Metric(object):
    def __init__(self):
        self._defaults = {}
        self._update_count = 0

    def add_state(self, name, default, dist_reduce_fx=None):
        self._defaults[name] = default
        setattr(self, name, list(default))

    def cuda(self):
        return self

    def reset(self):
        self._update_count = 0
        for name, default in self._defaults.items():
            setattr(self, name, list(default))


class BinaryAveragePrecision(Metric):
    def __init__(self, thresholds=None, ignore_index=None):
        Metric.__init__(self)
        self.thresholds, self.ignore_index = thresholds, ignore_index
        print("UserWarning: Metric `BinaryAveragePrecision` will save all targets and predictions in the buffer."
              " For large datasets, this may lead to large memory footprint.")
        self.add_state("preds", default=[], dist_reduce_fx="cat")
        self.add_state("target", default=[], dist_reduce_fx="cat")

    def update(self, preds, target):
        preds, target = _binary_precision_recall_curve_format(preds, target, self.ignore_index)
        self._update_count += 1
        self.preds.append(preds)
        self.target.append(target)

    def compute(self):
        state = (dim_zero_cat(self.preds), dim_zero_cat(self.target))
        return _binary_average_precision_compute(state)


def _binary_precision_recall_curve_format(preds, target, ignore_index):
    n = preds.nbytes // 4
    keep = int(n * VALID)
    idx = torch.empty(n, dtype=torch.uint8, device="cuda")             # target != ignore_index
    preds = torch.empty(keep * 4, dtype=torch.uint8, device="cuda")    # preds[idx]
    target = torch.empty(keep * 8, dtype=torch.uint8, device="cuda")   # target[idx] (int64)
    del idx
    return preds, target


def _binary_clf_curve(preds, target):
    n = preds.nbytes // 4
    desc_score_indices = torch.empty(n * 8, dtype=torch.uint8, device="cuda")     # argsort, int64
    preds = torch.empty(n * 4, dtype=torch.uint8, device="cuda")                  # preds[desc_score_indices]
    target = torch.empty(n * 8, dtype=torch.uint8, device="cuda")                 # target[desc_score_indices]
    del desc_score_indices
    diff = torch.empty(n * 4, dtype=torch.uint8, device="cuda")                   # preds[1:] - preds[:-1]
    distinct_value_indices = torch.empty(int(n * DISTINCT) * 8, dtype=torch.uint8, device="cuda")
    del diff
    threshold_idxs = torch.empty(int(n * DISTINCT) * 8, dtype=torch.uint8, device="cuda")   # F.pad
    target = torch.empty(n * 8, dtype=torch.uint8, device="cuda")                 # (target == 1).long()
    cum = torch.empty(n * 4, dtype=torch.uint8, device="cuda")                    # _cumsum(target * 1.0)
    tps = torch.empty(int(n * DISTINCT) * 4, dtype=torch.uint8, device="cuda")
    del cum
    fps = torch.empty(int(n * DISTINCT) * 4, dtype=torch.uint8, device="cuda")
    return fps, tps, threshold_idxs


def _binary_average_precision_compute(state):
    preds, target = state
    fps, tps, thresholds = _binary_clf_curve(preds, target)
    precision = torch.empty(fps.nbytes, dtype=torch.uint8, device="cuda")
    recall = torch.empty(fps.nbytes, dtype=torch.uint8, device="cuda")
    return torch.empty(4, dtype=torch.uint8, device="cuda")


# ---- segmentation_models_pytorch.Unet(encoder_name="resnet34", in_channels=2, classes=1) -------------------
class Unet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = torch.nn.Module()
        self.encoder.weight = torch.nn.Parameter(torch.empty(21_300_000 * 4, device="cuda"))
        self.decoder = torch.nn.Module()
        self.decoder.weight = torch.nn.Parameter(torch.empty(3_150_000 * 4, device="cuda"))

    def forward(self, x):
        b = x.nbytes // (2 * CHIP * 4)
        skips = [torch.empty(b * ch * (512 // s) ** 2 * 4, dtype=torch.uint8, device="cuda")
                 for ch, s in ((64, 2), (64, 4), (128, 8), (256, 16), (512, 32))]
        h = skips.pop()
        for ch, s in ((256, 16), (128, 8), (64, 4), (32, 2), (16, 1)):
            h = torch.empty(b * ch * (512 // s) ** 2 * 4, dtype=torch.uint8, device="cuda")
            if skips:
                skips.pop()
        return torch.empty(b * CHIP * 4, dtype=torch.uint8, device="cuda")


def sigmoid(t):
    return torch.empty(t.nbytes, dtype=torch.uint8, device="cuda")


def val_loader(batch_size=16):
    for start in range(0, VAL_CHIPS, batch_size):
        b = min(batch_size, VAL_CHIPS - start)
        yield b


# the training run's checkpoints on disk (stand-in: written here, once)
ckpt_dir = tempfile.mkdtemp(prefix="s1flood-")
atexit.register(shutil.rmtree, ckpt_dir, True)
for epoch in range(5, 105, 5):
    with open(os.path.join(ckpt_dir, "epoch_%03d.pt" % epoch), "w") as f:
        json.dump({"model.encoder.weight": 21_300_000 * 4, "model.decoder.weight": 3_150_000 * 4}, f)

try:
    model = Unet().cuda().eval()
    ap = BinaryAveragePrecision(thresholds=None, ignore_index=-1).cuda()
    results = {}
    for name in sorted(os.listdir(ckpt_dir)):
        path = os.path.join(ckpt_dir, name)
        sd = torch.load(path, map_location="cpu")
        model.load_state_dict({"weight": sd["model.encoder.weight"]})
        with torch.inference_mode():
            for b in val_loader():
                x = torch.empty(b * 2 * CHIP, dtype=torch.float32, device="cuda")   # x.cuda()
                y = torch.empty(b * CHIP * 8, dtype=torch.uint8, device="cuda")      # y.cuda(), int64 masks
                ap.update(sigmoid(model(x)), y)
        results[name] = ap.compute()
        print(name, "AP computed; allocated %.2f GiB, peak %.2f GiB" % (
            torch.cuda.memory_allocated() / (1 << 30), torch.cuda.max_memory_allocated() / (1 << 30)))
        torch.cuda.reset_peak_memory_stats()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
