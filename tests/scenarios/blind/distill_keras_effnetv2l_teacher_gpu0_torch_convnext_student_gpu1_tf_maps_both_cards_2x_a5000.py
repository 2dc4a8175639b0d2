"""distill.py -- knowledge distillation for a plant-disease classifier on a workstation with two RTX A5000
(24 GiB each), run with plain `LD_PRELOAD=liboomguard.so python distill.py`.  The teacher is the data-science
team's Keras EfficientNetV2-L (a TensorFlow SavedModel, 118M parameters), meant to run on GPU 0; the student
is a PyTorch ConvNeXt-Tiny (28M parameters, fp32, AdamW) meant to train alone on GPU 1:

    import tensorflow as tf, torch
    teacher = tf.keras.models.load_model("effnetv2l_plants.keras")          # no device config at all
    torch.cuda.set_device(1)
    student = timm.create_model("convnext_tiny", num_classes=38).to("cuda:1")
    opt = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for images, labels in loader:                                           # batch 128, 224 px
        with tf.device("/GPU:0"):
            t_logits = teacher(images_tf, training=False).numpy()
        logits = student(images.to("cuda:1"))                              # <- OOM on cuda:1
        loss = kd_loss(logits, torch.from_numpy(t_logits).to("cuda:1"), labels)
        loss.backward(); opt.step(); opt.zero_grad()

The first TensorFlow op initialises TensorFlow's GPU runtime, and with no device configuration TensorFlow
makes a device -- and maps ~90% of the free memory into its BFC arena -- on EVERY visible GPU, not only the
one `tf.device("/GPU:0")` names.  GPU 1 then has TensorFlow's 21 GiB mapped, in use for nothing (the
teacher never touches GPU 1), and ~2.3 GiB free.  The student's weights (114 MB) load; its first training
forward pass needs ~10 GB of activations at batch 128 (stem 154 MB, each stage-1 block ~1.7 GB kept for
backward: depthwise conv, norm, the 4x pointwise expansion of 616 MB and GELU), and fails in the second
block: torch.OutOfMemoryError "Tried to allocate 588.00 MiB. GPU 1 has a total capacity of 24.00 GiB of
which 162.00 MiB is free", with PyTorch holding 2.2 GiB in tensors and caching nothing.  GPU 0 runs the
teacher comfortably.

What an expert says first: the memory on GPU 1 is held by the other framework in this same process --
TensorFlow's arena on a card TensorFlow does not use.  Keep TensorFlow off GPU 1, before its first op (the
configuration cannot change once the runtime is initialised): `tf.config.set_visible_devices(gpus[0], "GPU")`,
and/or `tf.config.experimental.set_memory_growth(gpu, True)` so it maps only what the teacher needs.  Wrong advice:
a smaller student batch or checkpointing (it would have to squeeze into 2.3 GiB while 21 GiB sit idle),
mixed precision, PyTorch's empty_cache or expandable segments (PyTorch caches nothing), stopping "other
processes" (there is no other process: it is this one), and a bigger GPU.
"""
import sys

import tensorflow as tf
import torch
import torch.nn.functional as F
from torch import nn

import scen_truth

MiB = 1 << 20
BATCH = 128


class Block(nn.Module):
    """A ConvNeXt block at width C: 7x7 depthwise conv, LayerNorm, 1x1 expansion to 4C, GELU, 1x1 back."""

    def __init__(self, c):
        nn.Module.__init__(self)
        self.c = c
        self.dw = nn.Parameter(torch.empty(49 * c * 4, device="cuda:1"))
        self.pw1 = nn.Parameter(torch.empty(4 * c * c * 4, device="cuda:1"))
        self.pw2 = nn.Parameter(torch.empty(4 * c * c * 4, device="cuda:1"))

    def forward(self, x):
        c = self.c
        y = F.conv2d(x, self.dw, out_channels=c, in_channels=c)            # depthwise 7x7
        y = F.conv2d(y, None, out_channels=c, in_channels=c)                # LayerNorm
        y = F.conv2d(y, self.pw1, out_channels=4 * c, in_channels=c)        # 1x1 expansion: 616 MB at stage 1
        y = F.conv2d(y, None, out_channels=4 * c, in_channels=4 * c)        # GELU
        y = F.conv2d(y, self.pw2, out_channels=c, in_channels=4 * c)        # 1x1 projection
        return y


class ConvNeXtTiny(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.stem = nn.Parameter(torch.empty(96 * 3 * 16 * 4, device="cuda:1"))
        self.stage1 = [Block(96) for _ in range(3)]
        for i, b in enumerate(self.stage1):
            setattr(self, "s1_%d" % i, b)
        # stages 2-4 (192/384/768 wide, 3/9/3 blocks): the rest of the 28M parameters
        self.rest = nn.Parameter(torch.empty(104 * MiB, device="cuda:1"))
        self.head = nn.Parameter(torch.empty(768 * 38 * 4, device="cuda:1"))

    def forward(self, images):
        x = F.conv2d(images, self.stem, stride=4, out_channels=96, in_channels=3)   # 128x96x56x56 fp32: 154 MB
        for b in self.stage1:
            x = b(x)
        return x


def teacher_init():
    """tf.keras.models.load_model: the SavedModel's weights go to TensorFlow's GPU:0 (its first op initialises
    the runtime, which maps both GPUs); EfficientNetV2-L: 118M fp32."""
    return [tf.zeros((118 * 1000 * 1000,), tf.float32)]


def teacher_logits(teacher):
    """The teacher's forward pass on GPU:0, inference; its logits come back to the host (.numpy())."""
    act = tf.zeros((BATCH, 480, 480, 32), tf.float32)                  # its widest activation at 480 px
    del act
    return None


def main():
    teacher = teacher_init()
    torch.cuda.set_device(1)
    scen_truth.note_every_empty(torch)
    student = ConvNeXtTiny()
    opt = torch.optim.AdamW(student.parameters(), lr=5e-4)
    for step in range(1000):
        teacher_logits(teacher)
        images = torch.empty(BATCH * 3 * 224 * 224 * 4, device="cuda:1")   # the batch, fp32, on cuda:1
        try:
            logits = student(images)
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark(device=1)
            raise
        scen_truth.backward(logits)
        opt.step()
        opt.zero_grad()
    return 0


if __name__ == "__main__":
    sys.exit(main())
