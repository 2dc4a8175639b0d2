"""A shared lab workstation with 4 RTX A5000 cards (24 GiB each; the desktop session on GPU 0).  A user runs the
test-time inference of a 4-fold ensemble (UperNet with a ConvNeXt-XL encoder, 1.45 GiB of fp32 weights per
fold) and, having four GPUs and four folds, puts fold k on cuda:k (PyTorch 1.13.1, the lab's old conda env):

    models = []
    for k in range(torch.cuda.device_count()):
        torch.cuda.set_device(k)
        model = build_upernet_convnext_xl().cuda()
        model.load_state_dict(torch.load(f"fold{k}/best.pt", map_location=f"cuda:{k}"))
        models.append(model.eval())
    ...                                   # then each tile goes through all four, averaged

A colleague's training run has had GPU 2 for two days (a python3 process holding 21.5 GiB: nvidia-smi
shows it; this user never looked).  Folds 0 and 1 load; on GPU 2 the model's own weights still fit in the
2 GiB left, and torch.load of the checkpoint (another 1.45 GiB, restored onto cuda:2) runs out.  GPUs 0, 1
and 3 have 20 GiB free each -- room for two folds apiece with their inference activations.

An expert: the job picked a card someone else is using -- choose the GPUs by free memory, not by index
(skip GPU 2: CUDA_VISIBLE_DEVICES=0,1,3, or place fold 2 on one of the free cards), since the colleague's
run is legitimate and stopping it is not this user's fix.  map_location="cpu" would only move the failure
to the first forward pass on GPU 2 (2 GiB cannot hold a fold and its activations); smaller batches,
autocast, quantization or a bigger card do not address a card that is occupied.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# the encoder stages, the UperNet head and the auxiliary head: 1.45 GiB of fp32 weights
LAYERS = [("encoder.stem", 3 * MiB), ("encoder.stage0", 48 * MiB), ("encoder.stage1", 190 * MiB),
          ("encoder.stage2", 760 * MiB), ("encoder.stage3", 300 * MiB), ("decode_head.psp", 76 * MiB),
          ("decode_head.fpn", 96 * MiB), ("auxiliary_head", 12 * MiB)]


class UperNetConvNeXtXL(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, nbytes in LAYERS:
            setattr(self, name.replace(".", "_"), torch.nn.Parameter(torch.empty(nbytes, device="cuda")))

    def forward(self, tiles):
        return torch.empty(tiles.nbytes // 3 * 19, device="cuda")


def build_upernet_convnext_xl():
    return UperNetConvNeXtXL()


def write_fold_checkpoints(root):
    """The training runs' best.pt of each fold (what torch.save wrote; the stand-in's format)."""
    for k in range(4):
        os.makedirs(os.path.join(root, "fold%d" % k), exist_ok=True)
        with open(os.path.join(root, "fold%d" % k, "best.pt"), "w") as f:
            json.dump(dict((name.replace(".", "_"), n) for name, n in LAYERS), f)


root = tempfile.mkdtemp(prefix="ensemble-")
write_fold_checkpoints(root)
models = []
try:
    for k in range(torch.cuda.device_count()):
        torch.cuda.set_device(k)
        model = build_upernet_convnext_xl().cuda()
        model.load_state_dict(torch.load(os.path.join(root, "fold%d" % k, "best.pt"), map_location="cuda:%d" % k))
        models.append(model.eval())
except torch.cuda.OutOfMemoryError:
    scen_truth.torch_oom_mark(torch.cuda.current_device())
    raise
sys.exit(0)
