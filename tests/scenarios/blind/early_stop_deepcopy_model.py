"""finetune_ner.py -- fine-tuning a 1.3B-parameter encoder for token classification (fp32, AdamW) on
a 24 GiB card, with early stopping written after a blog post: validate every 200 steps and keep a
copy of the best model to return at the end.  The loop comes from an old PyTorch 1.x recipe that
zeroes the gradients in place:

    best_model, best_f1 = None, -1.0
    for step, batch in enumerate(loader, 1):
        loss = model(**batch).loss; loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=False)
        if step % 200 == 0:
            f1 = evaluate(model, val_loader)                 # under torch.no_grad()
            if f1 > best_f1:
                best_f1, best_model = f1, copy.deepcopy(model)     # on the GPU, .grad copied too

Weights 5 GiB, gradients 5 GiB (kept, zeroed), AdamW moments 10 GiB; a step's activations (2.5 GiB)
come and go from the cache.  Two hundred steps run flat at 23 GiB of the card; the first validation
improves on -1 and deep-copies the model on the GPU: its parameters and, because they exist, their
gradients, 10 GiB, where 1 GiB is free and 2.5 GiB cached.  It fails part way.  A one-off copy,
nothing grew before it, no other process.  An expert: keep the snapshot off the GPU
(best_state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}, or torch.save
to disk and load it back at the end); not a smaller batch, not checkpointing, not a restart.
"""
import copy
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
LAYERS = 40
scen_truth.note_every_empty(torch)


class Encoder(torch.nn.Module):
    def __init__(self, params=None):
        torch.nn.Module.__init__(self)
        for i in range(LAYERS):
            p = params[i] if params else torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
            setattr(self, "layer%d" % i, p)

    def forward(self, batch):
        h = batch
        for _ in range(10):
            a = torch.empty(256 * MiB, device="cuda")
            if torch.is_grad_enabled():
                a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


# copy.deepcopy(model) as PyTorch runs it: nn.Module's and Tensor.__deepcopy__'s frames are the
# framework's, so this stand-in is compiled as part of torch's own file (as scen_truth does): the
# failing Python line stays the program's `copy.deepcopy(model)`.  Every parameter is copied on its
# device, with its .grad when it has one (Tensor.__deepcopy__ copies the gradient as well).
_DEEPCOPY = """
def __deepcopy__(self, memo):
    params = []
    for p in self.parameters():
        q = torch.nn.Parameter(torch.empty_like(p))
        if p.grad is not None:
            q.grad = torch.empty_like(p.grad)
        params.append(q)
    return type(self)(params)
"""
_ns = {"torch": torch}
exec(compile(_DEEPCOPY, torch.__file__, "exec"), _ns)
Encoder.__deepcopy__ = _ns["__deepcopy__"]


def evaluate(model, step):
    model.eval()
    with torch.no_grad():
        for _ in range(5):
            model(torch.empty(4 * MiB, device="cuda"))
    model.train()
    return 0.71 + step * 1e-5


def main():
    model = Encoder().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    best_model, best_f1 = None, -1.0
    for step in range(1, 5001):
        batch = torch.empty(4 * MiB, device="cuda")
        loss = model(batch)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        del loss, batch
        if step % 200 == 0:
            f1 = evaluate(model, step)
            if f1 > best_f1:
                best_f1, best_model = f1, copy.deepcopy(model)
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
