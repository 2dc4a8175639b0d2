"""finetune.py -- full fine-tuning of a 1.3B-parameter decoder (fp32 weights, 5 GiB) with AdamW on one
24 GiB card; every epoch ends with a validation pass on a *copy* of the model, so that model.eval() and
the validation forward can never disturb the training model:

    for epoch in range(epochs):
        for batch in train_loader:
            loss = F.cross_entropy(model(batch.x), batch.y)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)     # "keep the grad buffers, saves re-allocation"
        evaluate(model, val_loader)

    def evaluate(model, loader):
        torch.cuda.empty_cache()
        eval_model = copy.deepcopy(model)              # "safe": the training model stays untouched
        eval_model.eval()
        with torch.no_grad():
            ...

Training runs fine: weights 5 GiB + gradients 5 GiB (never released: set_to_none=False) + AdamW's two
moments 10 GiB, with 2.5 GiB of activations that backward frees and the cache reuses.  At the end of
the first epoch copy.deepcopy(model) needs another 5 GiB of weights next to 20 GiB of training state
and fails part way through the copy, before any validation batch ran (the empty_cache() just before
it had already handed the cached activations back).

An expert: do not copy the model to evaluate it -- run the training model itself under
model.eval() + torch.no_grad() and switch back with model.train() (or, if a separate copy is wanted,
keep it on the CPU); dropping the gradients before evaluation (zero_grad(set_to_none=True)) frees 5
GiB as well.  Not a smaller batch, checkpointing or mixed precision (no activations are live at the
failure), not the allocator's cache or fragmentation.
"""
import copy
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))     # 32M fp32 params

    def forward(self, x):
        h = torch.empty(64 * MiB, device="cuda")       # what the layer saves for backward
        h._saved = x
        return h


class Decoder(torch.nn.Module):
    def __init__(self, n_layers=40):
        torch.nn.Module.__init__(self)
        self.layers = [DecoderLayer() for _ in range(n_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return x


def evaluate(model, loader):
    torch.cuda.empty_cache()                           # "free what we can before validation"
    eval_model = copy.deepcopy(model)                  # a second copy of the weights on the GPU
    eval_model.eval()
    n = 0
    with torch.no_grad():
        for x in loader:
            out = eval_model(x)
            n += 1
            del out
    return n


def main():
    model = Decoder()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    steps_per_epoch = 4
    for epoch in range(3):
        for step in range(steps_per_epoch):
            x = torch.empty(4 * MiB, device="cuda")      # token ids and embeddings of the batch
            logits = model(x)
            loss = F.cross_entropy(logits, None)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            del loss, logits, x
        val_loader = [torch.empty(4 * MiB, device="cuda") for _ in range(2)]
        evaluate(model, val_loader)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
