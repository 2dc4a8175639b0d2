"""train_graphcast.py -- a GraphCast-style mesh GNN weather model (36.7M parameters, 1-degree grid, 65,160
grid nodes, 40,962 mesh nodes, 16 processor layers) that I retrain on ERA5 on one 80 GB A100:

    for step, (x, y) in enumerate(train_loader):              # batch 1, one 6-hour step
        loss = weighted_mse(model(x), y); loss.backward()
        optimizer.step(); optimizer.zero_grad()
        if step % 1000 == 999:
            validate(model, val_loader)

    def validate(model, loader):
        model.eval()
        for x0, targets in loader:                             # 12 steps = 3 days
            state, preds = x0, []
            for t in range(12):
                state = model(state)                           # autoregressive rollout
                preds.append(state)
            log_rmse(preds, targets)
        model.train()

Training is fine: one step's forward keeps ~17.5 GiB of activations for backward and peaks near 19 GiB.
At the first validation, after 999 good steps, it dies with CUDA out of memory in the fifth rollout step,
inside a processor layer.  model.eval() does not turn autograd off: every rollout step is recorded in the
graph, each prediction is the next step's input and preds keeps them all, so step k holds k x 17.5 GiB of
saved activations nobody will ever backpropagate through.

An expert: the validation is inference -- wrap it in torch.no_grad()/torch.inference_mode() (or at least
detach each state); then a rollout needs one step's working set.  Not a smaller batch (it is 1), not
gradient checkpointing (nothing runs backward here), not a bigger GPU, quantization or sharding: the
36.7M-parameter model and its AdamW state are 0.55 GiB.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Encoder(torch.nn.Module):            # grid -> mesh
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))

    def forward(self, x):
        edges = torch.empty(1280 * MiB, device="cuda")      # grid2mesh edge messages and their MLP intermediates
        edges._saved = x
        h = torch.empty(768 * MiB, device="cuda")           # mesh latents and MLP intermediates
        h._saved = edges
        return h


class ProcessorLayer(torch.nn.Module):     # one message-passing layer on the multimesh
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(7 * MiB, device="cuda"))

    def forward(self, h):
        msg = torch.empty(640 * MiB, device="cuda")         # 327,660 mesh edges x 512 latent, MLP intermediates
        msg._saved = h
        out = torch.empty(256 * MiB, device="cuda")         # node update
        out._saved = msg
        return out


class Decoder(torch.nn.Module):            # mesh -> grid, 227 variables
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(12 * MiB, device="cuda"))

    def forward(self, h):
        e = torch.empty(1024 * MiB, device="cuda")
        e._saved = h
        y = torch.empty(512 * MiB, device="cuda")
        y._saved = e
        return y


class GraphCast(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = Encoder()
        self.layers = [ProcessorLayer() for _ in range(16)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.decoder = Decoder()

    def forward(self, x):
        h = self.encoder(x)
        for layer in self.layers:
            h = layer(h)
        return self.decoder(h)


def weighted_mse(pred, y):
    loss = torch.empty(512, device="cuda")
    loss._saved = pred
    loss._params = pred._params
    return loss


def validate(model, loader):
    model.eval()
    for x0, targets in loader:
        state, preds = x0, []
        for t in range(12):
            state = model(state)
            preds.append(state)
    model.train()


def main():
    model = GraphCast()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(1000):
        x = torch.empty(60 * MiB, device="cuda")              # 65,160 nodes x 227 vars x 2 times, fp32
        y = torch.empty(60 * MiB, device="cuda")
        loss = weighted_mse(model(x), y)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del loss, x, y
        if step % 1000 == 999:
            val_loader = [(torch.empty(60 * MiB, device="cuda"), None)]
            validate(model, val_loader)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
