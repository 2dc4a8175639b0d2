"""train_tabnet.py -- a TabNet-style credit-risk model (8 decision steps, n_d = n_a = 256, ghost
batch norm) on 10M loan applications x 430 engineered features from the feature store's offline
export, on one A10G (24 GB), PyTorch 2.0.  To "avoid the DataLoader bottleneck" the user moves the
whole feature matrix to the GPU once and slices batches out of it:

    X_train = torch.tensor(train_df[FEATURES].values, dtype=torch.float32, device="cuda")   # 16 GiB
    y_train = torch.tensor(train_df["default_90d"].values, device="cuda")
    X_valid = torch.tensor(valid_df[FEATURES].values, dtype=torch.float32, device="cuda")   # 1.6 GiB
    for epoch in range(EPOCHS):
        perm = torch.randperm(len(X_train), device="cuda")
        for i in range(0, len(X_train), BATCH):                    # batch 16384
            idx = perm[i:i + BATCH]
            loss = criterion(model(X_train[idx]), y_train[idx]); loss.backward(); ...

The model is 60 MiB; one step of batch 16384 keeps ~8 GiB of activations (8 steps of attentive
transformer, sparsemax masks and feature transformer outputs).  With 17.7 GiB of data resident the
card has ~5.5 GiB left, and the first training step's forward runs out at the sixth decision step.

An expert: keep the dataset in (pinned) host memory and move one batch at a time (a DataLoader
with pin_memory, or index the host tensor and .to("cuda", non_blocking=True)); the data, not the
model or the batch, holds three quarters of the card.  A smaller batch would squeeze it in but is
not the first change; empty_cache, expandable segments, sharding, 8-bit optimizers, quantization
do nothing for it.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_TRAIN = 10000000
N_VALID = 1000000
N_FEATURES = 430
BATCH = 16384


class DecisionStep(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.feat_transformer = torch.nn.Parameter(torch.empty(6 * MiB, device="cuda"))
        self.attentive = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))

    def forward(self, x, prior):
        mask = torch.empty(BATCH * N_FEATURES * 4 * 4, device="cuda")      # attentive + sparsemax
        mask._saved = prior
        h = torch.empty(BATCH * 512 * 4 * 28, device="cuda")               # GLU blocks, ghost BN
        h._saved = mask
        return h


class TabNet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.initial_bn = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        for i in range(8):
            setattr(self, "step%d" % i, DecisionStep())
        self.final = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))

    def forward(self, x):
        h = x
        for i in range(8):
            h = getattr(self, "step%d" % i)(x, h)
        out = torch.empty(BATCH * 4, device="cuda")
        out._saved = h
        return out


def main():
    X_train = torch.empty(N_TRAIN * N_FEATURES * 4, device="cuda")
    y_train = torch.empty(N_TRAIN * 8, device="cuda")
    X_valid = torch.empty(N_VALID * N_FEATURES * 4, device="cuda")
    y_valid = torch.empty(N_VALID * 8, device="cuda")
    model = TabNet()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-2)
    for epoch in range(50):
        perm = torch.empty(N_TRAIN * 8, device="cuda")
        for i in range(0, N_TRAIN, BATCH):
            xb = torch.empty(BATCH * N_FEATURES * 4, device="cuda")        # X_train[idx]
            yb = torch.empty(BATCH * 8, device="cuda")
            out = model(xb)
            loss = torch.empty(512, device="cuda")
            loss._saved = out
            loss._params = tuple(model.parameters())
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del xb, yb, out, loss
        del perm


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
