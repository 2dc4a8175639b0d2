"""train_inat.py -- a biodiversity team trains EfficientNetV2-S (timm tf_efficientnetv2_s, 10,000-species
head: 33M parameters) on iNaturalist 2021 at 320 px, batch 64, bf16 autocast, on one cloud L4 (24 GB).  The
8 vCPUs decoding JPEGs are the bottleneck, so they moved the rest of the input pipeline to the GPU in a
background thread that "keeps batches ready": it copies each uint8 batch to the GPU, converts and
normalizes it, applies mixup there, and hands it over through a queue.Queue:

    class CudaPrefetcher(threading.Thread):
        def __init__(self, loader, mixup):
            super().__init__(daemon=True)
            self.loader, self.mixup = loader, mixup
            self.ready = queue.Queue()
            self.start()
        def run(self):
            for images, targets in self.loader:
                images = images.cuda(non_blocking=True).permute(0, 3, 1, 2).float().sub_(MEAN).div_(STD)
                images, targets = self.mixup(images, targets.cuda(non_blocking=True))
                self.ready.put((images, targets))

queue.Queue() is unbounded (maxsize=0).  While training, the GPU waits for the JPEG workers (a batch every
200 ms), so the queue never holds more than one batch and nobody notices.  Every 1,000 steps the script
validates on the full 100,000-image val set (batch 128 at 384 px, model.eval() under torch.no_grad()) --
the training loop stops taking batches, but the thread does not stop making them: every 200 ms another
75 MiB float32 batch (plus its 2.4 MiB of mixup targets) joins the queue on the GPU.  About 40% into the
first validation (some 250 train batches, 19 GiB, queued) a val forward pass asks for 432 MiB and fails;
PyTorch also shows 2.8 GiB reserved but unallocated, in pieces the queued batches left between them.  With
autograd off and the model in eval mode, the failure looks like an evaluation problem.

An expert: the memory is the prefetch queue (prefetcher.ready, a Python queue of CUDA tensors), which
grew for the whole validation: bound it (queue.Queue(maxsize=2), so put() blocks and the thread waits) or
pause the prefetcher during validation.  Wrong first advice: inference_mode or no_grad (already off), a
smaller val batch (delays it by a few seconds), freeing the optimizer state / gradients (0.5 GiB),
mixed precision, empty_cache or expandable_segments (the queued batches are live tensors), a bigger GPU
(the thread fills any card if validation lasts long enough).
"""
import queue
import sys
import threading

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ------------------------------------------------------------------------------------------------
# Stand-ins: what this script uses of PyTorch that the stand-in torch lacks (Tensor.cuda/float/...,
# mirroring the real API's shape; sizes in bytes, shapes carried as an attribute), the DataLoaders (host
# uint8 batches) and the wall clock: the JPEG workers deliver a train batch every 200 ms of it, the GPU's
# work advances it.  gpu_busy() returns once the loader has delivered every batch due by then, so the
# interleaving of the two threads is the same every run.
# ------------------------------------------------------------------------------------------------


class _WallClock(object):
    def __init__(self):
        self.now = 0
        self.cv = threading.Condition()
        self.loader_due = None
        self.loader_done = False

    def gpu_busy(self, ms):
        with self.cv:
            self.now += ms
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.loader_done or (self.loader_due is not None and self.loader_due > self.now))

    def loader_wait(self, due):
        with self.cv:
            self.loader_due = due
            self.cv.notify_all()
            self.cv.wait_for(lambda: self.now >= due)
            self.loader_due = None

    def loader_finished(self):
        with self.cv:
            self.loader_done = True
            self.cv.notify_all()


_clock = _WallClock()

_ITEM = {"uint8": 1, "int64": 8, "float32": 4, "bfloat16": 2}


def _like(t, nbytes, dtype, shape):
    out = torch.empty(nbytes, dtype="uint8", device=t.device if isinstance(t, torch.Tensor) else 0)
    out.shape, out.elem = shape, dtype
    return out


class HostTensor(object):
    """A pinned CPU tensor from the DataLoader (uint8 NHWC images, int64 labels)."""

    def __init__(self, shape, elem):
        self.shape, self.elem = tuple(shape), elem

    def numel(self):
        n = 1
        for d in self.shape:
            n *= d
        return n

    def cuda(self, non_blocking=False):
        return _like(None, self.numel() * _ITEM[self.elem], self.elem, self.shape)


def _numel(t):
    n = 1
    for d in t.shape:
        n *= d
    return n


def _permute(self, *dims):
    v = self.view()
    v.shape = tuple(self.shape[d] for d in dims)
    v.elem = self.elem
    return v


def _float(self):
    return _like(self, _numel(self) * 4, "float32", self.shape)


def _inplace(self, *args):
    return self


def _flip(self, dim):
    return _like(self, self.nbytes, self.elem, self.shape)


torch.Tensor.permute = _permute
torch.Tensor.float = _float
torch.Tensor.sub_ = torch.Tensor.div_ = torch.Tensor.mul_ = torch.Tensor.add_ = _inplace
torch.Tensor.flip = _flip


def one_hot_soft(targets, num_classes):
    return _like(targets, targets.shape[0] * num_classes * 4, "float32", (targets.shape[0], num_classes))


class TrainLoader(object):
    """DataLoader(ImageFolder(train), batch_size=64, num_workers=8, pin_memory=True): decoding is the
    bottleneck -- a batch every 200 ms."""

    def __init__(self, batches, batch_size, res):
        self.batches, self.batch_size, self.res = batches, batch_size, res

    def __iter__(self):
        try:
            for i in range(self.batches):
                _clock.loader_wait(200 * i)
                yield (HostTensor((self.batch_size, self.res, self.res, 3), "uint8"),
                       HostTensor((self.batch_size,), "int64"))
        finally:
            _clock.loader_finished()


class ValLoader(object):
    def __init__(self, images, batch_size, res):
        self.images, self.batch_size, self.res = images, batch_size, res

    def __len__(self):
        return (self.images + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for i in range(len(self)):
            yield (HostTensor((self.batch_size, self.res, self.res, 3), "uint8"),
                   HostTensor((self.batch_size,), "int64"))


# ---- the model: each stage makes the tensors the real one would (bf16 under autocast) ----
# name, millions of parameters, [(count, elements per image at 320 px)] of the activations its layers keep
# for backward, and how many of them one stand-in tensor stands for (fewer, larger blocks: a faster run)
_STAGES = [
    ("conv_stem", 0.0006, [(3, 24 * 160 * 160)], 1),
    ("blocks.0", 0.01, [(8, 24 * 160 * 160)], 2),
    ("blocks.1", 0.3, [(12, 192 * 80 * 80), (8, 48 * 80 * 80)], 2),
    ("blocks.2", 0.5, [(12, 256 * 40 * 40), (8, 64 * 40 * 40)], 2),
    ("blocks.3", 1.3, [(30, 512 * 20 * 20), (12, 128 * 20 * 20)], 5),
    ("blocks.4", 3.4, [(45, 960 * 20 * 20), (18, 160 * 20 * 20)], 5),
    ("blocks.5", 13.0, [(75, 1536 * 10 * 10), (30, 256 * 10 * 10)], 5),
    ("conv_head", 0.33, [(3, 1280 * 10 * 10)], 1),
    ("classifier", 12.8, [(1, 10000)], 1),
]


class _Stage(torch.nn.Module):
    def __init__(self, mparams, acts, group):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(int(mparams * 1e6) * 4))
        self.acts, self.group = acts, group

    def forward(self, x, batch, res):
        scale = batch * (res / 320.0) ** 2 * 2
        if torch.is_grad_enabled():
            g = self.group
            kept = [torch.empty(int(n * g * scale)) for count, n in self.acts for _ in range(count // g)]
            out = kept[-1]
            out._saved = tuple(kept[:-1]) + (x,)
            return out
        out = x
        for count, n in self.acts:                  # without autograd only the running layer's tensors live
            for _ in range(min(count, 3)):
                out = torch.empty(int(n * scale))
        return out


class EfficientNetV2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, mparams, acts, group in _STAGES:
            setattr(self, name.replace(".", "_"), _Stage(mparams, acts, group))

    def forward(self, x):
        batch, res = x.shape[0], x.shape[2]
        for name, _, _, _ in _STAGES:
            x = getattr(self, name.replace(".", "_"))(x, batch, res)
        _clock.gpu_busy(200 if self.training else 140)
        return x


def cross_entropy(logits, target):
    loss = torch.empty(512)
    loss._saved = (logits,)
    return torch._derive(loss, logits)


_plain_backward = torch.Tensor.backward


def _backward(self, *args, **kwargs):
    """PyTorch frees what the graph saved once backward has run through it (retain_graph=False)."""
    _plain_backward(self, *args, **kwargs)
    todo = [self]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, torch.Tensor):
            s = x.__dict__.pop("_saved", None)
            if s is not None:
                todo.append(s)


torch.Tensor.backward = _backward


# ------------------------------------------------------------------------------------------------
# train_inat.py
# ------------------------------------------------------------------------------------------------
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
NUM_CLASSES = 10000


class Mixup(object):
    def __init__(self, alpha=0.8, num_classes=NUM_CLASSES):
        self.alpha, self.num_classes = alpha, num_classes

    def __call__(self, x, target):
        lam = 0.7
        x_flipped = x.flip(0).mul_(1.0 - lam)
        x.mul_(lam).add_(x_flipped)
        del x_flipped
        target = one_hot_soft(target, self.num_classes)
        return x, target


class CudaPrefetcher(threading.Thread):
    """Keeps the GPU fed: copies, normalizes and mixes the next batches while the model trains."""

    def __init__(self, loader, mixup):
        threading.Thread.__init__(self, daemon=True)
        self.loader, self.mixup = loader, mixup
        self.ready = queue.Queue()
        self.start()

    def run(self):
        for images, targets in self.loader:
            images = images.cuda(non_blocking=True).permute(0, 3, 1, 2).float().sub_(MEAN).div_(STD)
            images, targets = self.mixup(images, targets.cuda(non_blocking=True))
            self.ready.put((images, targets))
        self.ready.put(None)

    def __iter__(self):
        return self

    def __next__(self):
        item = self.ready.get()
        if item is None:
            raise StopIteration
        return item


def validate(model, loader):
    model.eval()
    correct = 0
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for i, (images, targets) in enumerate(loader):
            images = images.cuda(non_blocking=True).permute(0, 3, 1, 2).float().sub_(MEAN).div_(STD)
            logits = model(images)
            correct += 1
            if i % 100 == 0:
                print("  val %d/%d  (GPU allocated %.1f GiB)" % (i, len(loader), torch.cuda.memory_allocated() / 2 ** 30))
    model.train()
    return correct


def main():
    model = EfficientNetV2()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    train_loader = TrainLoader(batches=42_000, batch_size=64, res=320)
    val_loader = ValLoader(images=100_000, batch_size=128, res=384)
    prefetcher = CudaPrefetcher(train_loader, Mixup())
    val_every = 1000

    model.train()
    for step, (images, targets) in enumerate(prefetcher):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
            loss = cross_entropy(logits, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 200 == 0:
            print("step %d  queued %d  allocated %.1f GiB" % (step, prefetcher.ready.qsize(),
                                                            torch.cuda.memory_allocated() / 2 ** 30))
        if (step + 1) % val_every == 0:
            print("validating at step %d" % (step + 1))
            validate(model, val_loader)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
