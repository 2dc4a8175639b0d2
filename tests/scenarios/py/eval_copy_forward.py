"""train.py -- fine-tuning a 1B-parameter model (fp32 weights 4 GiB, AdamW 8 GiB) on a 24 GiB card; every
20 steps the loop evaluates a deep copy of the model so that evaluation "cannot disturb training", run with
plain `LD_PRELOAD=liboomguard.so`:

    for step, batch in enumerate(loader):
        loss = model(batch).loss; loss.backward(); optimizer.step(); model.zero_grad(set_to_none=True)
        if step % 20 == 19:
            eval_model = copy.deepcopy(model).eval()     # a second 4 GiB copy on the GPU
            with torch.no_grad():
                for b in val_loader: logits = eval_model(b)
            del eval_model

At step 20 the copy is made and the first validation batch (its 8 GiB of logits) fails; evaluating the
training model itself (model.eval(), no_grad, model.train()) would fit.  An expert: do not copy the model
to evaluate it; not a leak, not a restart, not a smaller training batch, not a bigger GPU.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 20
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(200 * MiB, device="cuda"))

    def forward(self, h):
        out = torch.empty((1024 if not torch.is_grad_enabled() else 100) * MiB, device="cuda")
        if torch.is_grad_enabled():
            out._saved = h                              # kept for backward in training
        return out


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, Layer())

    def forward(self, x):
        h = x
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        if not torch.is_grad_enabled():
            logits = torch.empty(8192 * MiB, device="cuda")    # the validation batch's logits
            logits._saved = h
            return logits
        loss = torch.empty(512, device="cuda")
        loss._saved = h
        return loss


def main():
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(2000):
        x = torch.empty(8 * MiB, device="cuda")
        loss = model(x)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)               # the gradients go (the stand-in optimizer's zero_grad keeps them)
        del loss, x
        if step % 20 == 19:
            eval_model = copy.deepcopy(model)
            with torch.no_grad():
                for b in range(10):
                    logits = eval_model(torch.empty(32 * MiB, device="cuda"))
                    del logits
            del eval_model


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
