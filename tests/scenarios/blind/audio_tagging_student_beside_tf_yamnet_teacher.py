"""distill_tagger.py -- AudioSet tagging: a PyTorch CNN14 student (80M parameters) distilled from
YAMNet, a TensorFlow Hub model run as the teacher in the same process, on one 24 GB A10G, with
plain `LD_PRELOAD=liboomguard.so`:

    import tensorflow as tf, tensorflow_hub as hub
    student = Cnn14(classes=527).cuda()
    opt = torch.optim.AdamW(student.parameters(), lr=1e-3)
    teacher = hub.load("https://tfhub.dev/google/yamnet/1")      # TF makes its GPU context here
    for wav in loader:                                          # batch 32 x 10 s at 32 kHz
        soft = torch.from_numpy(teacher(wav.numpy())[0].numpy()).cuda()
        logits = student(logmel(wav.cuda()))                    # fails on the first batch
        loss = kd_loss(logits, soft); loss.backward(); opt.step(); opt.zero_grad()

The student is built first (~340 MiB reserved).  When the teacher is loaded, TensorFlow
initialises the GPU and, without memory growth, maps ~90% of the free memory into its BFC arena
(20.8 GiB) although YAMNet (3.7M parameters) uses a few hundred MiB of it.  PyTorch is left ~2.3
GiB beside its weights, and the student's first training step needs ~3.5 GiB (2.3 GiB of
activations, then gradients and AdamW state): the first forward pass fails in its last blocks.

An expert: stop TensorFlow from taking the card -- tf.config.experimental.set_memory_growth(gpu,
True) (or TF_FORCE_GPU_ALLOW_GROWTH=true) before TF touches the GPU, or a small memory_limit, or run
the teacher on the CPU / precompute its soft labels once.  Not a smaller batch, checkpointing or
mixed precision for the student (they would only squeeze it into the 10% TF leaves), not
empty_cache (PyTorch caches nothing), not another process.
"""
import sys

import tensorflow as tf
import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class ConvBlock(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Parameter(torch.empty(nbytes // 2, device="cuda"))
        self.conv2 = torch.nn.Parameter(torch.empty(nbytes // 2, device="cuda"))

    def forward(self, x, act_bytes):
        h = torch.empty(act_bytes, device="cuda")            # conv1 + BN + ReLU
        h._saved = x
        h2 = torch.empty(act_bytes, device="cuda")           # conv2 + BN + ReLU
        h2._saved = h
        out = torch.empty(act_bytes // 4, device="cuda")     # 2x2 average pool
        out._saved = h2
        return out


class Cnn14(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        sizes = [2 * MiB, 4 * MiB, 10 * MiB, 36 * MiB, 64 * MiB, 160 * MiB]
        self.blocks = [ConvBlock(n) for n in sizes]
        for i, b in enumerate(self.blocks):
            setattr(self, "conv_block%d" % (i + 1), b)
        self.fc1 = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
        self.fc_audioset = torch.nn.Parameter(torch.empty(8 * MiB, device="cuda"))
        self.bn0 = torch.nn.Parameter(torch.empty(26 * MiB, device="cuda"))

    def forward(self, mel, batch_size):
        x = mel
        act = batch_size * 64 * 1001 * 64 * 4                  # 64 channels x 1001 frames x 64 mel bins
        for b in self.blocks:
            x = b(x, act)
            act = act // 2                                     # channels double, area quarters
        return torch.empty(batch_size * 527 * 4, device="cuda")


class YamnetTeacher(object):
    """hub.load("https://tfhub.dev/google/yamnet/1"): MobileNet-v1 weights, run on the GPU by TF."""

    def __init__(self):
        self.weights = tf.zeros((3700000,), tf.float32)

    def __call__(self, batch_size):
        frames = tf.zeros((batch_size, 20, 96, 64), tf.float32)              # log-mel patches
        feats = tf.zeros((batch_size, 20, 512, 48, 32), tf.float32)          # MobileNet activations
        scores = tf.zeros((batch_size, 20, 521), tf.float32)
        del frames, feats
        return scores


def main():
    student = Cnn14()
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-3)
    teacher = YamnetTeacher()
    batch_size = 32
    for step in range(1000):
        wav = torch.empty(batch_size * 320000 * 4, device="cuda")
        soft = teacher(batch_size)
        soft_t = torch.empty(batch_size * 527 * 4, device="cuda")
        mel = torch.empty(batch_size * 1001 * 64 * 4, device="cuda")
        logits = student(mel, batch_size)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(student.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, mel, wav, soft, soft_t


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
