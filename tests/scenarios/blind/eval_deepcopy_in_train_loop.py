"""train_summarizer.py -- fine-tuning a 1.2B-parameter summarization model (fp32, AdamW, batch 4 x 1024
with activation checkpointing) on a 24 GiB card; the validation helper, written to "not disturb
the training model" (dropout, hooks), evaluates a fresh copy of it:

    for step, batch in enumerate(loader):
        optimizer.zero_grad()                        # grads stay allocated (set_to_none=False)
        loss = model(**batch).loss; loss.backward(); optimizer.step()
        if step % 250 == 249:
            eval_model = copy.deepcopy(model).eval()         # a second 4.5 GiB copy, on the GPU
            with torch.no_grad():
                rouge = validate(eval_model, val_loader)     # batch 32
            del eval_model

Training runs flat at ~22.5 GiB: weights 4.5 GiB, gradients 4.5 GiB (kept between steps),
AdamW's moments 9 GiB, 4 GiB of activations (cached between steps).  At step 250 the copy takes
4.5 GiB and the first validation batch's forward fails: the training state and the copy leave
~1 GiB.  Evaluating the training model itself (model.eval(); no_grad; model.train()) would need
no copy and fits.  An expert: do not copy the model for evaluation (or, if a frozen copy is really
needed, keep it off the GPU / evaluate in another process); not a smaller training batch, not
checkpointing, not a leak, not a bigger GPU.
"""
import copy
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(96 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(84 * MiB, device="cuda")        # checkpointed: the layer's input only, saved
        a._saved = h
        return a


class Summarizer(torch.nn.Module):
    def __init__(self, layers=44):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(384 * MiB, device="cuda"))
        self.layers = [Layer() for _ in range(layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids):
        h = input_ids
        for l in self.layers:
            h = l(h)
        work = torch.empty(384 * MiB, device="cuda")          # the recomputed layer + logits at the end
        work._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = work, tuple(self.parameters())
        return loss

    def __deepcopy__(self, memo):
        new = Summarizer.__new__(Summarizer)
        torch.nn.Module.__init__(new)
        new.shared = torch.nn.Parameter(torch.empty_like(self.shared))
        new.layers = []
        for i, l in enumerate(self.layers):
            c = Layer.__new__(Layer)
            torch.nn.Module.__init__(c)
            c.weight = torch.nn.Parameter(torch.empty_like(l.weight))
            new.layers.append(c)
            setattr(new, "layer%d" % i, c)
        return new


def validate(eval_model, batches):
    scores = []
    for b in range(batches):
        input_ids = torch.empty(32 * 1024 * 8, device="cuda")
        h = input_ids
        for l in eval_model.layers:
            nxt = torch.empty(640 * MiB, device="cuda")       # batch 32, no autograd: not kept
            h = nxt
        logits = torch.empty(32 * 1024 * 32128 * 4, device="cuda")
        scores.append(0.3)
        del h, nxt, logits, input_ids
    return sum(scores) / len(scores)


def main():
    model = Summarizer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for step in range(20000):
        optimizer.zero_grad(set_to_none=False)
        input_ids = torch.empty(4 * 1024 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        del loss, input_ids
        if step % 250 == 249:
            eval_model = copy.deepcopy(model).eval()
            with torch.no_grad():
                rouge = validate(eval_model, 40)
            del eval_model


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
