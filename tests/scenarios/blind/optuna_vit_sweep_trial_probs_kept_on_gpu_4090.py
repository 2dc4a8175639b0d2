"""sweep.ipynb -- a research notebook running an Optuna sweep of a ViT's width and batch size on
ImageNet-1k, every trial in the same kernel, on the lab's RTX 4090 (24 GB, torch 2.5).  For an ensemble
of the best trials later, the objective keeps each trial's softmax over the 50k validation images
(50,000 x 1,000 fp32 = 191 MiB) on the GPU, in a dict of the notebook:

    trial_probs = {}
    def objective(trial):
        width = trial.suggest_int("width", 384, 768, step=64)
        batch_size = trial.suggest_int("batch_size", 96, 320, step=16)
        model = ViT(width=width, depth=12).cuda(); opt = torch.optim.AdamW(model.parameters(), lr=...)
        train(model, opt, batch_size, steps=...)
        model.eval()
        with torch.no_grad():
            logits = torch.cat([model(x) for x in val_loader])
        trial_probs[trial.number] = logits.softmax(-1)             # 191 MiB per trial, on the GPU
        return accuracy(logits)
    study.optimize(objective, n_trials=40)

Each trial's model, optimizer and activations go when it ends; its 191 MiB of probabilities stay, and
each one also pins the cached segment it was carved from (the allocator can give back only empty
segments).  Eleven trials in, the dict holds 2 GiB and grows by 191 MiB a trial.  Trial 11 (width 768,
batch 288) runs out in the last blocks of its first forward pass; alone it peaks at ~21.4 GiB and
fits the card, and with 29 trials still to go the dict would reach 7.5 GiB.

An expert: results of finished trials do not belong on the GPU -- keep them on the CPU
(trial_probs[trial.number] = probs.cpu(), or float16 numpy), or keep only the few best trials'.
expandable_segments would recover the holes the pinned segments leave, which is not the problem.  Not
a smaller batch or checkpointing (the sweep is measuring those settings), not empty_cache (the
allocator already released every empty segment), not another process.
"""
import torch
import scen_truth

KiB = 1 << 10
MiB = 1 << 20
scen_truth.note_every_empty(torch)
DEPTH = 12
trial_probs = {}


class Block(torch.nn.Module):
    def __init__(self, width):
        torch.nn.Module.__init__(self)
        self.qkv_weight = torch.nn.Parameter(torch.empty(width * width * 3 * 4, device="cuda"))
        self.mlp_weight = torch.nn.Parameter(torch.empty(width * width * 8 * 4, device="cuda"))

    def forward(self, x, batch_size, width):
        attn = torch.empty(batch_size * width * 4 * KiB, device="cuda")     # what attention saves
        attn._saved = x
        mlp = torch.empty(batch_size * width * 4 * KiB, device="cuda")      # what the MLP saves
        mlp._saved = attn
        return mlp



class ViT(torch.nn.Module):
    def __init__(self, width, depth):
        torch.nn.Module.__init__(self)
        self.width, self.depth = width, depth
        self.blocks = torch.nn.Module()
        for i in range(depth):
            setattr(self.blocks, "b%d" % i, Block(width))
        self.head = torch.nn.Parameter(torch.empty(width * 1000 * 4, device="cuda"))

    def forward(self, images, batch_size):
        x = images
        for i in range(self.depth):
            x = getattr(self.blocks, "b%d" % i)(x, batch_size, self.width)
        logits = torch.empty(batch_size * 1000 * 4, device="cuda")
        logits._saved = x
        return logits


def train(model, opt, batch_size, steps):
    for _ in range(steps):
        images = torch.empty(batch_size * 3 * 224 * 224, dtype=torch.float16, device="cuda")
        logits = model(images, batch_size)
        loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, logits, images


def objective(number, width, batch_size):
    model = ViT(width=width, depth=DEPTH).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    train(model, opt, batch_size, steps=2)
    model.eval()
    with torch.no_grad():
        chunks = []
        for _ in range(200):                                  # the 50k validation images, batch 250
            chunks.append(torch.empty(250 * 1000 * 4, device="cuda"))
        logits = torch.empty(50000 * 1000 * 4, device="cuda")      # torch.cat(chunks)
        del chunks
        trial_probs[number] = torch.empty(logits.nbytes, device="cuda")   # logits.softmax(-1)
    return 0.5


# the trials the sampler suggested, in order: (width, batch_size)
TRIALS = [(384, 96), (384, 128), (512, 128), (384, 192), (512, 160), (640, 128), (448, 192),
          (640, 144), (512, 176), (768, 96), (576, 160), (768, 288)]

try:
    for number, (width, batch_size) in enumerate(TRIALS):
        objective(number, width, batch_size)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
