"""score_poses.py -- DiffDock-style docking on one A10G (a cloud g5 instance, 22.5 GiB usable of its 24 GB): the score model
samples 40 ligand poses against a large receptor (a 1,800-residue complex, ESM embeddings already on
the GPU), then the confidence model ranks them.  The user wrote the fallback every notebook has:

    model.eval()
    with torch.no_grad():
        try:
            conf = confidence(receptor, ligand, n_poses=40)
        except torch.OutOfMemoryError:
            print("OOM at 40 poses, retrying with 20")
            conf = confidence(receptor, ligand, n_poses=20)        # inside the except block

The confidence model keeps every layer's node features for its readout (the features of all 6
layers are concatenated), and each layer builds its cross-edge tensor-product messages for all
poses at once (8 GiB at 40 poses).  At 40 poses the 6th layer's features do not fit.  The retry at
20 poses would fit on its own (peak ~12 GiB), but it runs inside the except block: the exception's
traceback still holds the failed call's frame, its 5 layers' features and its message tensor (~20
GiB), so the first message of the retry (4 GiB) fails at once.

An expert: move the retry out of the except block (note the failure, leave the block, let the
traceback go, then retry at 20 poses), or score the poses in chunks from the start.  Not empty_cache
(the memory is live, held by the traceback), not expandable_segments, not inference_mode (it already
runs under no_grad), not a bigger GPU or quantization for a 20M-parameter model.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N_LAYERS = 6
MSG_PER_POSE = 200 * MiB        # cross-edge tensor-product messages of one pose, one layer
FEAT_PER_POSE = 60 * MiB        # node features of one pose after one layer (kept for the readout)


class TensorProductConv(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))

    def forward(self, h, receptor, n_poses):
        msg = torch.empty(n_poses * MSG_PER_POSE, device="cuda")       # receptor x ligand cross edges
        msg._saved = receptor
        out = torch.empty(n_poses * FEAT_PER_POSE, device="cuda")      # aggregated node features
        out._saved = h
        del msg
        return out


class ConfidenceModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(N_LAYERS):
            setattr(self, "conv%d" % i, TensorProductConv())
        self.readout = torch.nn.Parameter(torch.empty(8 * MiB, device="cuda"))

    def forward(self, receptor, ligand, n_poses):
        h = ligand
        feats = []
        for i in range(N_LAYERS):
            h = getattr(self, "conv%d" % i)(h, receptor, n_poses)
            feats.append(h)                                  # every layer's features, for the readout
        return torch.empty(n_poses * 4096, device="cuda")


def main():
    confidence = ConfidenceModel()
    confidence.eval()
    receptor = torch.empty(480 * MiB, device="cuda")         # ESM embeddings + residue graph of the complex
    ligand = torch.empty(2 * MiB, device="cuda")
    n_poses = 40
    with torch.no_grad():
        try:
            conf = confidence(receptor, ligand, n_poses=n_poses)
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark()                      # test scaffolding: the truth at the first failure
            print("OOM at %d poses, retrying with %d" % (n_poses, n_poses // 2), file=sys.stderr)
            conf = confidence(receptor, ligand, n_poses=n_poses // 2)
    return conf


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
