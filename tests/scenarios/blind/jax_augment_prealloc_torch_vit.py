"""train_vit.py -- fine-tuning a ViT-B/16 classifier in PyTorch (fp32, AdamW, batch 128 at 224 px)
on a 24 GiB card, with the GPU augmentation (RandAugment + MixUp) borrowed from the team's JAX
codebase and called on every batch through DLPack:

    from jax_aug import rand_augment_mixup          # jax.jit'd; imports jax
    model = timm.create_model("vit_base_patch16_224", num_classes=1000).cuda()        # 330 MiB
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for images, labels in loader:
        x = rand_augment_mixup(jnp.asarray(images.numpy()), key)     # first call: JAX's GPU client
        x = torch.from_dlpack(x)                                     # zero-copy into PyTorch
        loss = criterion(model(x), labels.cuda()); loss.backward(); optimizer.step(); ...

The first augmentation call creates XLA's GPU client, which preallocates 75% of the card (18 GiB)
for its arena although the augmentation needs ~170 MiB.  PyTorch is left ~5 GiB, and the first
forward (12 GiB of activations at batch 128) fails.  Nothing else runs on the GPU.  Alone, the
PyTorch job fits in ~14 GiB.  An expert: stop JAX from preallocating (XLA_PYTHON_CLIENT_PREALLOCATE=false
or XLA_PYTHON_CLIENT_MEM_FRACTION=.05, or run the augmentation on the CPU); not a smaller batch,
not a bigger GPU, no other process to stop.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class JaxAug(object):
    """jax_aug.rand_augment_mixup: XLA's GPU client (xla_extension.so) is created at the first call."""

    def __init__(self):
        self.xla = ctypes.CDLL(os.environ["SCEN_XLA"])
        self.xla.xla_buffer.restype = ctypes.c_void_p
        self.xla.xla_buffer.argtypes = [ctypes.c_size_t]
        self.client = None

    def __call__(self, images):
        if self.client is None:
            if self.xla.xla_client_init(0) != 0:
                raise RuntimeError("jaxlib.xla_extension.XlaRuntimeError: RESOURCE_EXHAUSTED")
            self.client = True
        out = self.xla.xla_buffer(128 * 3 * 224 * 224 * 4)        # the augmented batch, in the arena
        self.xla.xla_buffer(96 * MiB)                             # the jitted program's temporaries
        return out


rand_augment_mixup = JaxAug()


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(9 * MiB, device="cuda"))
        self.proj = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(456 * MiB, device="cuda")      # attention probabilities (128 x 12 x 197 x 197), saved
        a._saved = h
        m = torch.empty(568 * MiB, device="cuda")      # MLP and norm activations, saved
        m._saved = a
        return m


class VisionTransformer(torch.nn.Module):
    def __init__(self, depth=12):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))
        self.head = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        self.blocks = [Block() for _ in range(depth)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, x):
        h = x
        for b in self.blocks:
            h = b(h)
        logits = torch.empty(128 * 1000 * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def main():
    model = VisionTransformer().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(100000):
        rand_augment_mixup("images")
        x = torch.empty(128 * 3 * 224 * 224 * 4, device="cuda")    # from_dlpack: the stand-in copies
        loss = model(x)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        del loss, x


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
