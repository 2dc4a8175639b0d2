"""al_loop.py -- a pathology group's active-learning loop for a colorectal tissue-type classifier (9 classes,
NCT-CRC-HE patches at 224 px) on the lab's one T4 (16 GB, 15 GiB usable).  One long-lived process runs the
rounds: train a fresh DenseNet-121 (torchvision, drop_rate=0.2, ImageNet weights) on the labeled set, then
score the unlabeled pool with BALD from MC dropout and send the 500 most informative patches to the
pathologists.  Training uses fp16 autocast and GradScaler, batch 48.

The acquisition function was taken from a BALD tutorial written for MNIST:

    def mc_dropout_logprobs(model, pool_loader, T=20):
        model.train()                      # keep dropout active for MC sampling
        scores = []
        for x in pool_loader:              # batch 128: "no backward here, so a bigger batch"
            x = x.cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.float16):
                logps = [F.log_softmax(model(x), dim=1) for _ in range(T)]
            scores.append(bald(logps).cpu())
        ...

There is no torch.no_grad() (nor inference_mode) around it: with the model in train mode and autograd on,
every one of the T forward passes records its graph, and the list `logps` keeps each pass's log-probs -- and
through their grad_fn every activation DenseNet saved for a backward that never comes (about 65 MB per
patch in fp16: 8.3 GB for a batch of 128).  Round 0 trains fine (peak 3.5 GiB at batch 48; weights,
gradients and AdamW state are 0.12 GiB); the first acquisition batch fails in the second MC pass, in its
second dense block, with 7.9 GiB held by the first pass's graph.

An expert: the failing phase is inference (acquisition), even though the model is in train mode and an
optimizer has stepped: wrap the MC passes in torch.inference_mode() (or no_grad) -- dropout still samples,
it follows module.training, not the grad mode; a pass then holds a few hundred MB and T passes hold only
their 128x9 log-probs.  Better still, put only the Dropout modules in train mode so BatchNorm does not update
its running statistics on pool data.  Detaching each pass's output would also free the graphs, as a second
choice.  Wrong first advice: a smaller acquisition batch (at 64 the 20 passes still keep 20 graphs: 80 GB),
gradient checkpointing or mixed precision (there is no backward to save for, and fp16 is already on),
expandable_segments or empty_cache (every byte is a live saved activation), a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
IMG = 3 * 224 * 224                     # one patch, fp16 elements
NUM_CLASSES = 9


class _DenseBlock(torch.nn.Module):
    """A dense block of torchvision's DenseNet (memory_efficient=False): every dense layer concatenates all
    previous feature maps, runs BN-ReLU-conv1x1-BN-ReLU-conv3x3 and dropout; the outputs below are what a
    pass saves per patch (fp16 under autocast), in groups of dense layers."""

    def __init__(self, n_layers, params, saved_per_patch):
        torch.nn.Module.__init__(self)
        self.n_layers = n_layers
        self.weight = torch.nn.Parameter(torch.empty(params * 4, device="cuda"))
        self.saved_per_patch = saved_per_patch

    def forward(self, x, batch):
        groups = max(1, self.n_layers // 4)
        per = self.saved_per_patch * batch // groups
        saved = [x] if torch.is_grad_enabled() else []
        out = x
        for _ in range(groups):
            # concat + norm1 + relu1 + conv1 + norm2 + relu2 + conv2 + dropout mask, for 4 dense layers
            feat = torch.empty(per, dtype=torch.uint8, device="cuda")
            if torch.is_grad_enabled():
                saved.append(feat)          # autograd keeps them for backward
            out = feat
        y = torch.empty(max(per // 4, 512), device="cuda")
        y._saved = saved if torch.is_grad_enabled() else None
        return y


class DenseNet121(torch.nn.Module):
    def __init__(self, drop_rate=0.2, num_classes=NUM_CLASSES):
        torch.nn.Module.__init__(self)
        self.drop_rate = drop_rate
        self.stem = torch.nn.Parameter(torch.empty(9_500 * 4, device="cuda"))
        self.denseblock1 = _DenseBlock(6, 335_000, 22 * MiB)
        self.denseblock2 = _DenseBlock(12, 920_000, 17 * MiB)
        self.denseblock3 = _DenseBlock(24, 3_850_000, 14 * MiB)
        self.denseblock4 = _DenseBlock(16, 2_470_000, 4 * MiB)
        self.classifier = torch.nn.Parameter(torch.empty(1024 * num_classes * 4, device="cuda"))

    def forward(self, x):
        batch = x.nbytes // (IMG * 2)
        stem = torch.empty(batch * 6 * MiB, dtype=torch.uint8, device="cuda")   # conv0/norm0/pool0
        h = self.denseblock1(stem, batch)
        h = self.denseblock2(h, batch)
        h = self.denseblock3(h, batch)
        h = self.denseblock4(h, batch)
        logits = torch.empty(batch * NUM_CLASSES * 4, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = [stem, h]
        return logits


class HostArray(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes


def cpu(t):
    return HostArray(t.nbytes)


def loader(n_items, batch_size):
    for start in range(0, n_items, batch_size):
        b = min(batch_size, n_items - start)
        yield torch.empty(b * IMG, dtype=torch.float16, device="cuda")     # x.cuda(non_blocking=True)


def bald(logps):
    """Mutual information between the prediction and the dropout masks: H[mean p] - mean H[p]."""
    mean_p = torch.empty(logps[0].nbytes, device="cuda")
    score = torch.empty(logps[0].nbytes // NUM_CLASSES, device="cuda")
    del mean_p
    return score


def backward(loss):
    """loss.backward(), then what autograd does with the graph afterwards: its saved tensors are freed."""
    loss.backward()
    t = loss
    while isinstance(t, torch.Tensor):
        nxt = getattr(t, "_saved", None)
        t._saved = None
        t = nxt


def train_round(model, n_labeled, epochs=3, batch_size=48):
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=1e-4)
    scaler = torch.cuda.amp.GradScaler()
    model.train()
    for epoch in range(epochs):
        for x in loader(n_labeled, batch_size):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16):
                logits = model(x)
                loss = F.cross_entropy(logits, None)
            backward(scaler.scale(loss))
            scaler.step(optimizer)
            scaler.update()
        print("round train epoch", epoch, "allocated %.2f GiB" % (torch.cuda.memory_allocated() / (1 << 30)),
              "peak %.2f GiB" % (torch.cuda.max_memory_allocated() / (1 << 30)))
    return optimizer


def mc_dropout_logprobs(model, n_pool, T=20, batch_size=128):
    model.train()                      # keep dropout active for MC sampling
    scores = []
    for x in loader(n_pool, batch_size):
        with torch.autocast("cuda", dtype=torch.float16):
            logps = [F.log_softmax(model(x), dim=1) for _ in range(T)]
        scores.append(cpu(bald(logps)))
    return scores


try:
    labeled, pool = 2_000, 38_000
    for rnd in range(10):
        model = DenseNet121(drop_rate=0.2).cuda()
        optimizer = train_round(model, labeled)
        scores = mc_dropout_logprobs(model, pool)
        labeled, pool = labeled + 500, pool - 500
        print("round", rnd, "labeled", labeled)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
