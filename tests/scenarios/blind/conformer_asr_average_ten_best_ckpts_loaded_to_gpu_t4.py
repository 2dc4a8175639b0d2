"""average_and_decode.py -- after training a 600M-parameter Conformer-CTC (ESPnet-like recipe) on a
cluster, the user averages the 10 best checkpoints by validation accuracy (the recipe's
keep_nbest_models=10, as ESPnet and NeMo do) and decodes the test sets on a T4 (15 GiB) inference box
with PyTorch 1.13.  The checkpoints were saved from the training GPUs, so torch.load restores each
onto cuda:0.  Their own averaging script:

    model = ConformerCTC(cfg).to("cuda")                   # 2.2 GiB fp32
    def average_checkpoints(paths):
        states = []
        for i, p in enumerate(paths):
            print(f"loading {p} ({i + 1}/{len(paths)})")
            states.append(torch.load(p))                   # no map_location: back onto the GPU
        return {k: sum(s[k] for s in states) / len(states) for k in states[0]}
    model.load_state_dict(average_checkpoints(best10)); model.eval()

The live model and five loaded state dicts (13.2 GiB) fit; the sixth checkpoint's load fails part way.
The job is loading -- nothing has run yet, no batch, no optimizer.

An expert: the state dicts kept in `states` are full copies of the model's weights on the GPU -- load
them into CPU memory (map_location="cpu") and average there (ESPnet's average_nbest_models does), or
keep a running sum so at most one checkpoint is loaded at a time.  Not a smaller batch, checkpointing,
mixed precision, quantization or a bigger card for a ten-way average.
"""
import json
import os
import sys
import tempfile

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

BLOCKS = 24
BLOCK_PARAMS = (("ff1", 32), ("mhsa", 16), ("conv", 12), ("ff2", 32))      # MiB of fp32 each


class ConformerBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for name, mib in BLOCK_PARAMS:
            setattr(self, name, nn.Parameter(torch.empty(mib * MiB, device="cuda")))


class ConformerCTC(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.frontend = nn.Parameter(torch.empty(20 * MiB, device="cuda"))      # conv2d subsampling
        self.blocks = [ConformerBlock() for _ in range(BLOCKS)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block_%d" % i, b)
        self.ctc_head = nn.Parameter(torch.empty(40 * MiB, device="cuda"))        # 5,000 BPE x 2,048


def average_checkpoints(paths):
    states = []
    for i, p in enumerate(paths):
        print("loading %s (%d/%d)" % (os.path.basename(p), i + 1, len(paths)))
        states.append(torch.load(p))
    avg = {}
    for k in states[0]:
        avg[k] = states[0][k]          # sum(s[k] for s in states) / len(states)
    return avg


def _training_run_saved(exp_dir, model):
    """Test scaffolding, not the user's code: the training run's 10 best checkpoints on disk (the
    stand-in's torch.save format: the size of each tensor), as saved from the training GPUs."""
    sizes = {"frontend": model.frontend.nbytes, "ctc_head": model.ctc_head.nbytes}
    for i, blk in enumerate(model.blocks):
        for name, _ in BLOCK_PARAMS:
            sizes["block_%d.%s" % (i, name)] = getattr(blk, name).nbytes
    paths = []
    for ep in (31, 33, 34, 36, 37, 38, 40, 41, 43, 44):
        path = os.path.join(exp_dir, "valid.acc.ep%d.pth" % ep)
        with open(path, "w") as f:
            json.dump(sizes, f)
        paths.append(path)
    return paths


def main(exp_dir):
    model = ConformerCTC().to("cuda")
    best10 = _training_run_saved(exp_dir, model)
    avg = average_checkpoints(best10)
    model.load_state_dict(avg)
    model.eval()
    print("averaged %d checkpoints" % len(best10))


try:
    with tempfile.TemporaryDirectory() as d:
        main(d)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
