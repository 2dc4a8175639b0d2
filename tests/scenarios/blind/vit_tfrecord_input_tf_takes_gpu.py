"""train_vit.py -- fine-tuning a ViT-L/16 (304M parameters, fp32, AdamW, bf16 autocast) in PyTorch on an
image dataset the team keeps as TFRecord shards, read with tf.data in the same process, on a 24 GiB
card:

    import tensorflow as tf
    ds = (tf.data.TFRecordDataset(files).map(parse_and_augment, num_parallel_calls=tf.data.AUTOTUNE)
          .batch(64).prefetch(2))                      # the first TensorFlow op: TF creates its GPU device
    model = timm.create_model("vit_large_patch16_224", pretrained=True, num_classes=1000).cuda()
    for images, labels in ds.as_numpy_iterator():
        x = torch.from_numpy(images).cuda(); ...

The input pipeline runs on the CPU, but TensorFlow's first op initialises its GPU device, and by
default TF maps nearly all free GPU memory (all but ~300 MiB) into its own BFC allocator for the
life of the process.  PyTorch, in the same process, then cannot even move the model to the GPU:
the .cuda() of the first layers fails.  Without TensorFlow the job peaks at ~12 GiB.  An expert:
keep TensorFlow off the GPU (tf.config.set_visible_devices([], "GPU") before the pipeline is
built), or at least TF_FORCE_GPU_ALLOW_GROWTH=true; nothing in the PyTorch job needs changing.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class tf_data(object):
    """tf.data over TFRecord shards: building the pipeline runs TensorFlow's first eager op, which
    creates the GPU device (libtensorflow_framework.so.2) and its BFC allocator."""
    _lib = None

    @classmethod
    def TFRecordDataset(cls, files):
        if cls._lib is None:
            cls._lib = ctypes.CDLL(os.environ["SCEN_TF"])
            cls._lib.tf_gpu_init.argtypes = [ctypes.c_int]
            if cls._lib.tf_gpu_init(0) != 0:
                raise RuntimeError("TensorFlow: failed to create the GPU device")
        return cls()

    def map(self, fn, num_parallel_calls=None):
        return self

    def batch(self, n):
        return self

    def prefetch(self, n):
        return self


class ViTLarge(torch.nn.Module):
    def __init__(self, depth=24):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        for i in range(depth):
            blk = torch.nn.Module()
            blk.attn = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
            blk.mlp = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))
            setattr(self, "block%d" % i, blk)
        self.head = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))


def create_model(name, pretrained=True, num_classes=1000):
    return ViTLarge()


def main():
    ds = tf_data.TFRecordDataset(["gs-mirror/train-%05d-of-01024" % i for i in range(1024)]) \
        .map(None, num_parallel_calls=-1).batch(64).prefetch(2)
    model = create_model("vit_large_patch16_224", pretrained=True, num_classes=1000).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for step in range(10000):
        x = torch.empty(64 * 3 * 224 * 224 * 4, device="cuda")
        del x


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
