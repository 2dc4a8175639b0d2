"""train_component.py -- a Kubeflow Pipelines training step: fine-tune timm's convnext_base.fb_in22k on Food-101
(batch 64 at 224 px, bf16 autocast, AdamW) on one NVIDIA A10G (24 GB; the pod asks for nvidia.com/gpu: 1 on a g5
node).  The data comes from TensorFlow Datasets, as the data team publishes every dataset, and is fed to PyTorch
through tfds.as_numpy:

    ds = tfds.load("food101", split="train", as_supervised=True, shuffle_files=True)
    ds = ds.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE).batch(64).prefetch(tf.data.AUTOTUNE)
    model = timm.create_model("convnext_base.fb_in22k", pretrained=True, num_classes=101).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    for images, labels in tfds.as_numpy(ds):
        x = torch.from_numpy(images).cuda(non_blocking=True).permute(0, 3, 1, 2)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), torch.from_numpy(labels).cuda())
        ...

The step ran for months with `tensorflow-cpu` in its requirements.  Last sprint the platform team moved every
component onto one base image with `tensorflow[and-cuda]` 2.15, and the job now fails in the first forward pass, in
ConvNeXt's second stage, asking for 98 MiB with 26 MiB free.  PyTorch holds 2.2 GiB; the process holds 22.4 GiB of
the card's 22.5: building the tf.data pipeline started TensorFlow's runtime, which now sees the GPU, and its
GPU_0_bfc allocator mapped 90% of the free memory at once (19.8 GiB) although the pipeline never computes on it.

An expert: the memory belongs to the other framework in this process -- TensorFlow's BFC arena.  Hide the GPU from
TensorFlow before tfds.load (tf.config.set_visible_devices([], "GPU"), as the Flax and TFDS examples do), or
at least TF_FORCE_GPU_ALLOW_GROWTH=true in the component's env, or go back to tensorflow-cpu for this image.
Wrong first advice: a smaller batch, gradient checkpointing, mixed precision (bf16 is on; the job needs about 8 GiB
of a 22.5 GiB card), a bigger GPU (TensorFlow would take 90% of that one too), other processes (the pod has the
GPU to itself), empty_cache / expandable_segments (PyTorch caches nothing; TensorFlow's arena is not PyTorch's
cache), restarting the pod (it fails the same way).
"""
import sys

import tensorflow as tf
import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


# ---- stand-in gap: tensorflow_datasets.  tfds.load builds a tf.data pipeline; its first op initialises TF's eager
# context, which creates /device:GPU:0 and its BFC allocator: without memory growth TensorFlow maps nearly all the
# free memory right there (the stand-in: tf.zeros for the shuffle seed), even if no op of the pipeline runs on the GPU.
class tfds(object):
    @staticmethod
    def load(name, split=None, as_supervised=False, shuffle_files=False):
        seed = tf.zeros((2,), tf.int32)
        return _Dataset(name, seed)

    @staticmethod
    def as_numpy(ds):
        for _ in range(ds.num_batches):
            yield _HostBatch(64 * 224 * 224 * 3 * 4), _HostBatch(64 * 8)


class _Dataset(object):
    num_batches = 1184            # 75,750 images / 64

    def __init__(self, name, seed):
        self.name, self._seed = name, seed

    def map(self, fn, num_parallel_calls=None):
        return self

    def batch(self, n):
        return self

    def prefetch(self, n):
        return self


class _HostBatch(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes


def from_numpy_cuda(arr):
    """torch.from_numpy(arr).cuda(non_blocking=True)"""
    return torch.empty(arr.nbytes, device="cuda")
# ----


def preprocess(image, label):
    return image, label


class ConvNeXtBlock(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.conv_dw = torch.nn.Parameter(torch.empty(dim * 49 + dim, dtype=torch.float32, device="cuda"))
        self.norm = torch.nn.Parameter(torch.empty(2 * dim, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(8 * dim * dim + 5 * dim, dtype=torch.float32, device="cuda"))
        self.gamma = torch.nn.Parameter(torch.empty(dim, dtype=torch.float32, device="cuda"))

    def forward(self, n, hw, saved):
        # what autograd keeps, bf16 under autocast: dwconv out, LN out, fc1 out (4x), GELU out (4x), fc2 out
        for mult in (1, 1, 4, 4, 1):
            saved.append(torch.empty(n * mult * self.dim * hw * 2, dtype=torch.uint8, device="cuda"))


class ConvNeXt(torch.nn.Module):
    """timm convnext_base: dims 128/256/512/1024, depths 3/3/27/3, about 88M parameters."""

    def __init__(self, num_classes=101):
        torch.nn.Module.__init__(self)
        self.stem = torch.nn.Parameter(torch.empty(3 * 128 * 16 + 3 * 128, dtype=torch.float32, device="cuda"))
        self.blocks = []
        for s, (dim, depth) in enumerate(((128, 3), (256, 3), (512, 27), (1024, 3))):
            if s:   # downsample: LayerNorm + 2x2 conv, stride 2
                setattr(self, "stages_%d_downsample" % s, torch.nn.Parameter(torch.empty(
                    2 * dim // 2 + dim // 2 * dim * 4 + dim, dtype=torch.float32, device="cuda")))
            for b in range(depth):
                blk = ConvNeXtBlock(dim)
                setattr(self, "stages_%d_blocks_%d" % (s, b), blk)
                self.blocks.append((blk, 56 // (2 ** s)))
        self.head = torch.nn.Parameter(torch.empty(1024 * num_classes + num_classes + 2048, dtype=torch.float32,
                                                   device="cuda"))

    def forward(self, x_bytes):
        n = 64
        saved = []
        for blk, side in self.blocks:
            blk(n, side * side, saved)
        logits = torch.empty(n * 101 * 4, dtype=torch.float32, device="cuda")
        logits._saved = saved
        return logits


def main():
    ds = tfds.load("food101", split="train", as_supervised=True, shuffle_files=True)
    ds = ds.map(preprocess, num_parallel_calls=-1).batch(64).prefetch(-1)

    # model = timm.create_model("convnext_base.fb_in22k", pretrained=True, num_classes=101).cuda()
    model = ConvNeXt(num_classes=101)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    print("model: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4e6), flush=True)
    for step, (images, labels) in enumerate(tfds.as_numpy(ds)):
        x = from_numpy_cuda(images)
        y = from_numpy_cuda(labels)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(x)
        # loss = F.cross_entropy(logits, y); loss.backward(); optimizer.step(); optimizer.zero_grad()
        del logits, x, y


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
