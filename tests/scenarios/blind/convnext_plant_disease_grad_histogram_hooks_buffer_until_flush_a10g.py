"""train_leaves.py -- ConvNeXt-Base (85M parameters, ImageNet-22k weights) fine-tuned on a
plant-disease dataset (38 classes, 384 px, batch 48), fp32 + AdamW, on an AWS g5.2xlarge (A10G,
22.5 GiB).  To debug a divergence the user added gradient histograms for Weights & Biases, with a
hook on every parameter that buffers the gradients and a flush every `log_every = 100` steps:

    grad_buffer = defaultdict(list)
    for name, p in model.named_parameters():
        p.register_hook(lambda g, name=name: grad_buffer[name].append(g))     # "cheap: just a reference"
    ...
    if step % log_every == 0:
        wandb.log({f"grad/{n}": wandb.Histogram(torch.stack(gs).cpu()) for n, gs in grad_buffer.items()})
        grad_buffer.clear()

The hook gets the very tensor autograd then stores in p.grad; optimizer.zero_grad() (set_to_none)
drops p.grad, but the buffer still holds it, so every step keeps one full set of gradients on the
GPU: 326 MiB a step.  The training step itself is flat at ~9.5 GiB at its peak (weights, gradients,
AdamW moments, activations); the ~12.5 GiB above it lasts about 40 steps, and the job dies between
steps 40 and 50 of every run,
long before the first flush at step 100 -- in the next step's backward or forward, wherever the
allocation that does not fit happens to fall.

What the user says: "it always dies around step 40, never in the first epoch's logging -- the
dataloader must have a huge image somewhere."  What an expert says first: memory grows by the same
amount every step: something keeps tensors across iterations -- here the gradient buffer.  Reduce in
the hook (keep g.norm().item() or a torch.histc of it on the CPU, or g.detach().cpu()), or log
every step without buffering.  Wrong advice: a smaller batch, mixed precision or checkpointing
(they shrink the flat part, and the buffer still fills whatever is left), empty_cache or the
allocator's settings (the memory is live), a bigger card (it only moves the step where it dies).
"""
import collections
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
MiB = 1 << 20
BATCH = 48
log_every = 100


class ConvNeXtStage(nn.Module):
    def __init__(self, pbytes, abytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(pbytes, device="cuda"))
        self.abytes = abytes

    def forward(self, h):
        out = torch.empty(self.abytes, device="cuda")
        out._saved = h
        return out


class ConvNeXt(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.stem = ConvNeXtStage(1 * MiB, 1152 * MiB)
        self.stages = nn.Module()
        specs = [(2 * MiB, 896 * MiB)] * 3 + [(6 * MiB, 448 * MiB)] * 3 + [(24 * MiB, 224 * MiB)] * 6 \
            + [(16 * MiB, 224 * MiB)] * 6 + [(20 * MiB, 96 * MiB)] * 3
        for i, (pb, ab) in enumerate(specs):
            setattr(self.stages, "block%d" % i, ConvNeXtStage(pb, ab))
        self.nblocks = len(specs)
        self.head = ConvNeXtStage(1 * MiB, 2 * MiB)

    def forward(self, x):
        h = self.stem(x)
        for i in range(self.nblocks):
            h = getattr(self.stages, "block%d" % i)(h)
        return self.head(h)


def register_grad_hooks(model, hook):
    """p.register_hook(hook) for every parameter (the stand-in's autograd runs no hooks itself:
    run_grad_hooks calls them with each new gradient, as the engine does)."""
    model._grad_hooks = [(name, p, hook) for name, p in zip(range(10 ** 6), model.parameters())]


def run_grad_hooks(model):
    for name, p, hook in model._grad_hooks:
        hook(name, p.grad)


def main():
    model = ConvNeXt().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    grad_buffer = collections.defaultdict(list)
    register_grad_hooks(model, lambda name, g: grad_buffer[name].append(g))
    for step in range(1, 20001):
        images = torch.empty(BATCH * 3 * 384 * 384 * 4, device="cuda")
        out = model(images)
        loss = torch._derive(torch.empty(4, device="cuda"), out)
        loss._saved = out
        scen_truth.backward(loss)
        run_grad_hooks(model)
        optimizer.step()
        optimizer.zero_grad()
        del images, out, loss
        if step % log_every == 0:
            grad_buffer.clear()                 # wandb.log(histograms of the stacked buffers)
        if step % 10 == 0:
            print("step %d  allocated %.2f GiB" % (step, torch.cuda.memory_allocated() / (1 << 30)))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
