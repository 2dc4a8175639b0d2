"""train_cls.py -- fine-tuning a 1B-parameter document classifier (fp32, AdamW) with early stopping;
the best model and optimizer state are kept in memory "to restore at the end", on the GPU:

    best = None
    for step, batch in enumerate(loader, 1):
        loss = model(**batch).loss; loss.backward()
        optimizer.step(); optimizer.zero_grad()
        if step % eval_every == 0 and evaluate(model) > best_score:
            best = {"model": copy.deepcopy(model.state_dict()),          # 4 GiB, on the GPU
                    "optim": copy.deepcopy(optimizer.state_dict())}      # 8 GiB, on the GPU

Weights 4 GiB + grads 4 GiB + AdamW state 8 GiB; a step's activations (5 GiB) come and go from the
cache.  240 steps run flat at ~21.5 GiB; the first improvement at step 240 deep-copies 12 GiB on
the card and fails part way.  A one-off copy, not a leak: nothing grew before it.  An expert: make
the snapshot on the CPU ({k: v.detach().cpu() ...}) or save it to disk (torch.save) and reload at
the end; not a restart, not release-references, not a smaller batch.
"""
import copy
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Classifier(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        for i in range(n_layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, batch):
        h = batch
        for _ in range(20):
            a = torch.empty(256 * MiB, device="cuda")
            a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def deepcopy_state(tensors):
    """copy.deepcopy of a state dict on the GPU: a new tensor per entry, on the same device."""
    out = []
    for t in tensors:
        out.append(torch.empty_like(t))
    return out


def evaluate(step):
    return 0.5 + 0.001 * step if step == 240 else 0.0


def main():
    model = Classifier().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    best, best_score = None, 0.1
    for step in range(1, 1001):
        batch = torch.empty(4 * MiB, device="cuda")
        loss = model(batch)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch
        if step % 40 == 0:
            score = evaluate(step)
            if score > best_score:
                best_score = score
                best = {"model": deepcopy_state(model.parameters())}
                best["optim"] = deepcopy_state([s for st in optimizer.state.values()
                                                for s in (st["exp_avg"], st["exp_avg_sq"])])
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
