"""train.py -- a 500M-parameter model (fp32, AdamW) trained at batch 16, evaluated every 200 steps
at batch 96 ("evaluation needs no gradients, so the batch can be six times larger"), but the
evaluation loop forgot torch.no_grad():

    def evaluate(model, val_loader):
        model.eval()
        total = 0.0
        for batch in val_loader:                       # batch 96
            logits = model(batch["input_ids"])         # autograd on: every layer's output saved
            total += loss_fn(logits, batch["labels"]).item()
        model.train()
        return total / len(val_loader)

Training is flat at 12 GiB (weights, grads, AdamW state 8 GiB + 4 GiB of activations).  At step 200
the first evaluation batch keeps all 16 layers' activations (1.5 GiB each at batch 96) for a
backward that never comes, and fails at layer 11.  Under no_grad only one layer's output is alive
at a time (3 GiB peak).  An expert: wrap evaluation in torch.no_grad()/torch.inference_mode();
a smaller eval batch also fits; this evaluation is inference even though the job trains.
"""
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))

    def forward(self, h, batch_size):
        out = torch.empty(batch_size * 16 * MiB, device="cuda")
        out._saved = h if torch.is_grad_enabled() else None      # autograd keeps the input alive
        return out


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(16):
            setattr(self, "layer%d" % i, Layer())

    def forward(self, input_ids, batch_size):
        h = input_ids
        for i in range(16):
            h = getattr(self, "layer%d" % i)(h, batch_size)
        return h


def evaluate(model, n_batches):
    model.eval()
    total = 0.0
    for _ in range(n_batches):
        input_ids = torch.empty(96 * 4096, device="cuda")
        logits = model(input_ids, 96)
        total += 0.5                                      # loss_fn(logits, labels).item()
    model.train()
    return total / n_batches


def main():
    model = Model().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for step in range(1, 2001):
        input_ids = torch.empty(16 * 4096, device="cuda")
        logits = model(input_ids, 16)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = model.parameters(), logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        if step % 200 == 0:
            evaluate(model, 50)
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
