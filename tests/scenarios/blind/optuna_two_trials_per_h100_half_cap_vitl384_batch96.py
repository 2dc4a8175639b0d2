"""hpo_worker.py -- hyper-parameter search for a ViT-L/16 fine-tune at 384 px (a 1,000-class product
catalogue), Optuna with a shared RDB storage, TWO trial workers per H100 80GB to keep the cards busy
(the ViT is small, most trials need 20-30 GB).  Each worker starts with

    torch.cuda.set_per_process_memory_fraction(0.5)     # two workers share one GPU: 40 GB each, no collisions

and then runs `study.optimize(objective, n_trials=50)`:

    def objective(trial):
        batch_size = trial.suggest_categorical("batch_size", [32, 48, 64, 96])
        lr = trial.suggest_float("lr", 1e-5, 1e-3, log=True)
        model = timm.create_model("vit_large_patch16_384", pretrained=True, num_classes=1000).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=lr)
        for images, labels in loader(batch_size):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(images), labels)
            loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

The worker on the other half of the card is running a batch-32 trial (about 22 GB).

The user: "trial 17 (batch_size=96) crashed its worker with CUDA OOM in the first forward pass, but
nvidia-smi shows 17 GB free on that GPU."

What happens: the free memory is real, but this worker may only reserve half the card (40 GB) and
batch 96 needs about 46 GB: 1.2 GB of fp32 weights plus ~1.9 GB of saved bf16 activations per block
(96 images x 577 tokens) over 24 blocks.  PyTorch's allocator refuses the request itself at block
~21, without asking the driver.

An expert: the cap is deliberate -- it is what lets two trials share the card; the other worker may draw
batch 96 next and needs its half.  Keep this trial inside its 40 GB: activation checkpointing of the
ViT blocks (timm's set_grad_checkpointing()) or a smaller micro-batch with gradient accumulation
(2 x 48 keeps the effective batch the search asked for).  Not raising or removing the cap, not
stopping the other worker, not bf16 (it runs under autocast already), not inference mode, not the
cache or fragmentation.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

TOKENS, WIDTH, DEPTH = 577, 1024, 24
ACT_PER_TOKEN = 34 * WIDTH // 2          # bf16 values a block saves for backward, per token (~17 x width)


class Block(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn = nn.Parameter(torch.empty(4 * WIDTH * WIDTH * 4, device="cuda"))
        self.mlp = nn.Parameter(torch.empty(8 * WIDTH * WIDTH * 4, device="cuda"))

    def forward(self, x, batch_size):
        saved = torch.empty(batch_size * TOKENS * ACT_PER_TOKEN, dtype=torch.bfloat16, device="cuda")
        saved._saved = x
        out = torch.empty(batch_size * TOKENS * WIDTH, dtype=torch.bfloat16, device="cuda")
        out._saved = saved
        return torch.autograd._graph.derive(out, x)


class Blocks(nn.Module):
    pass


class VisionTransformer(nn.Module):
    def __init__(self, num_classes):
        nn.Module.__init__(self)
        self.patch_embed = nn.Parameter(torch.empty(3 * 16 * 16 * WIDTH * 4, device="cuda"))
        self.pos_embed = nn.Parameter(torch.empty(TOKENS * WIDTH * 4, device="cuda"))
        self.blocks = Blocks()
        for i in range(DEPTH):
            setattr(self.blocks, str(i), Block())
        self.head = nn.Parameter(torch.empty(WIDTH * num_classes * 4, device="cuda"))

    def forward(self, images, batch_size):
        x = torch.empty(batch_size * TOKENS * WIDTH, dtype=torch.bfloat16, device="cuda")
        x._saved = images
        for i in range(DEPTH):
            x = getattr(self.blocks, str(i))(x, batch_size)
        logits = torch.empty(batch_size * 1000 * 4, device="cuda")
        logits._saved = x
        return torch.autograd._graph.derive(logits, x)


def create_model(name, pretrained=True, num_classes=1000):
    return VisionTransformer(num_classes)


def loader(batch_size, steps):
    for _ in range(steps):
        yield torch.empty(batch_size * 3 * 384 * 384 * 2, device="cuda"), torch.empty(batch_size * 8, device="cuda")


class Trial(object):
    def __init__(self, number, params):
        self.number, self.params = number, params

    def suggest_categorical(self, name, choices):
        return self.params[name]

    def suggest_float(self, name, low, high, log=False):
        return self.params[name]


def objective(trial):
    batch_size = trial.suggest_categorical("batch_size", [32, 48, 64, 96])
    lr = trial.suggest_float("lr", 1e-5, 1e-3, log=True)
    model = create_model("vit_large_patch16_384", pretrained=True, num_classes=1000)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    for images, labels in loader(batch_size, steps=3):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images, batch_size), labels)
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del images, labels, loss
    return 0.0


def optimize(trials):
    for t in trials:
        objective(t)


def main():
    torch.cuda.set_per_process_memory_fraction(0.5)   # two workers share one GPU
    # test scaffolding: the truth mark at the refused allocation itself
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    # this worker's share of the study: trial 9 (batch 48) went through; trial 17 drew batch 96
    optimize([Trial(9, {"batch_size": 48, "lr": 3e-4}), Trial(17, {"batch_size": 96, "lr": 1e-4})])


try:
    main()
except torch.OutOfMemoryError:
    raise                            # marked by the observer above
sys.exit(0)
