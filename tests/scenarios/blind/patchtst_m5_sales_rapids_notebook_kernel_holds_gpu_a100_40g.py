"""train_patchtst.py -- a PatchTST-style demand forecaster for 30k store-item series (context 512
days, patch 16, d_model 768, 12 layers, ~110M parameters) trained on one A100 40 GB, PyTorch 2.5
with PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync.  The features were built an hour earlier in
a Jupyter notebook with RAPIDS cuDF (lags, rolling means, price elasticities over 58M rows); that
kernel is still running and its RMM pool holds 17 GiB of the card.  nvidia-smi on the box:

    |  0  N/A  N/A  48213  C  .../envs/rapids/bin/python   17408MiB |   <- the notebook kernel
    |  0  N/A  N/A  51877  C  python train_patchtst.py      ...      |

The training job alone needs ~36 GiB at batch 128 (weights, AdamW state and gradients 1.6 GiB, 12
layers x 2.9 GiB of activations) and ran fine the day before.  Today the first forward fails in
the eighth layer: 40 GiB - 17 GiB (the kernel) - 0.5 GiB (context) leaves ~22.5 GiB.

An expert: the memory is another process's -- shut down the notebook kernel (or del the frames
and free RMM's pool there) and rerun; nothing in the training job needs to change.  Not a smaller
batch or checkpointing first, not empty_cache / pool trimming in this process (its pool holds
nothing unused), not restarting this process (the other one keeps its pool).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

BATCH_SIZE = 128
N_LAYERS = 12


class EncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(9 * MiB, device="cuda"))
        self.ffn = torch.nn.Parameter(torch.empty(18 * MiB, device="cuda"))

    def forward(self, x):
        scores = torch.empty(BATCH_SIZE * 23 * MiB // 2, device="cuda")   # 12 heads x 32x32 patches x channel-independent series
        scores._saved = x
        h = torch.empty(BATCH_SIZE * 23 * MiB // 2, device="cuda")
        h._saved = scores
        return h


class PatchTST(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(34 * MiB, device="cuda"))
        for i in range(N_LAYERS):
            setattr(self, "layer%d" % i, EncoderLayer())
        self.head = torch.nn.Parameter(torch.empty(48 * MiB, device="cuda"))

    def forward(self, x):
        h = x
        for i in range(N_LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        out = torch.empty(BATCH_SIZE * 28 * 4 * 1024, device="cuda")
        out._saved = h
        return out


def main():
    model = PatchTST()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for epoch in range(100):
        for step in range(200):
            x = torch.empty(BATCH_SIZE * 512 * 4 * 256, device="cuda")
            out = model(x)
            loss = torch.empty(512, device="cuda")
            loss._saved = out
            loss._params = tuple(model.parameters())
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del x, out, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
