"""distill_siglip.py -- embedding distillation for an on-device image search: the teacher is Google's SigLIP
So400m/14 at 384 px, whose checkpoint and model code are JAX (big_vision); the student is a PyTorch ViT-B/16 at
224 px (timm, 86.6M parameters) that the product team can export.  Rather than port the teacher, the user calls
the jitted big_vision teacher from the PyTorch training loop, in one process, on one A100-SXM4-40GB:

    import jax, jax.numpy as jnp
    from big_vision.models.proj.image_text import two_towers
    import torch, timm
    teacher = two_towers.Model(**cfg.model)                       # So400m/14, 384 px
    t_params = load_params("webli_en_so400m_384_58765454-fp16.npz")  # on the GPU, through JAX
    embed = jax.jit(lambda p, x: teacher.apply({"params": p}, x)[0])
    student = timm.create_model("vit_base_patch16_224", num_classes=1152).cuda()
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.05)
    for img384, img224 in loader:                                 # batch 256
        t = torch.as_tensor(np.asarray(embed(t_params, jnp.asarray(img384))), device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s = student(img224.cuda(non_blocking=True))
        loss = 1 - F.cosine_similarity(s.float(), t).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The same loop with an OpenCLIP ViT-L/14 teacher in PyTorch trained at batch 256 with ~15 GiB to spare (the
student peaks at 20.7 GiB: eager attention over 197 tokens, bf16 autocast).  With the JAX teacher it dies in
the first step, inside the student's forward (the sixth of its twelve blocks, an MLP activation of 296 MiB,
98 MiB free), on a card where nvidia-smi shows this one process holding 39.9 GiB.  JAX's GPU client
preallocated 75% of the card (30 GiB) the moment the teacher's parameters were put on it, as it does by
default; the teacher needs about 8 GiB of that (0.8 GiB of bf16 weights, the activations of 256 images at 384
px).  PyTorch gets the rest: 9.5 GiB for the student's weights, gradients, AdamW moments and activations.

An expert: the memory is held by the other framework in this process, not by the student: stop JAX from
preallocating -- XLA_PYTHON_CLIENT_PREALLOCATE=false (it then grows as it needs), or cap it with
XLA_PYTHON_CLIENT_MEM_FRACTION=.25 (10 GiB) -- set in the environment before jax is imported.  Then PyTorch
has what the student needs and the step fits.  (Precomputing the teacher's embeddings offline is the
longer-term design, but it would freeze the augmentation.)
Wrong first advice: a smaller batch or gradient checkpointing (batch 64 would squeeze into the 9.5 GiB, with 20
GiB sitting idle in JAX's arena), mixed precision (already bf16 autocast), an 8-bit optimizer for an
86M-parameter student; empty_cache / expandable_segments (PyTorch's own cache is near empty:
the memory is JAX's arena, which PyTorch cannot free); killing "other processes" or restarting (there is no
other process: nvidia-smi's 39.9 GiB is this one); a bigger GPU (JAX would take 75% of that one too).
"""
import os
import sys

import jax
import jax.numpy as jnp
import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB, MiB = 1 << 30, 1 << 20


# ---- stand-in gaps: big_vision's SigLIP So400m/14 image tower as its parameters (jax arrays of the real sizes) and
# the buffers its jitted forward takes from XLA's arena; timm's ViT-B/16 as torch Parameters and the tensors its
# forward makes; np.asarray of a jax array (host copy) and torch.as_tensor(..., device="cuda").
class _HostArray(object):
    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


def np_asarray(x):
    """numpy.asarray(jax_array): a device-to-host copy."""
    return _HostArray(x.shape, x.dtype.name)


def torch_as_tensor(host, device):
    n = 1
    for s in host.shape:
        n *= s
    return torch.empty(n, dtype=torch.float32, device=device)


def load_params(path):
    """big_vision.utils.load_checkpoint + jax.device_put: the So400m/14 image tower, 428M parameters (bf16 npz)."""
    sizes = [("embedding", 14 * 14 * 3 * 1152), ("pos_embedding", 729 * 1152)]
    for i in range(27):
        sizes.append(("encoderblock_%d" % i, 4 * 1152 * 1152 + 2 * 1152 * 4304 + 12 * 1152))
    sizes.append(("MAPHead", 4 * 1152 * 1152 + 2 * 1152 * 4304))
    return dict((k, jnp.zeros((n,), jnp.bfloat16)) for k, n in sizes)


def jit_embed(params, images):
    """jax.jit(lambda p, x: model.apply({"params": p}, x)[0]): XLA's buffers for the batch (bf16, 729 patches x
    1152) live during the call; the embeddings [B, 1152] fp32 are its output."""
    b = images.shape[0]
    work = [jnp.zeros((b, 729, 1152), jnp.bfloat16) for _ in range(4)]
    work.append(jnp.zeros((b, 729, 4304), jnp.bfloat16))
    work.append(jnp.zeros((b, 16, 729, 729), jnp.bfloat16))
    out = jnp.zeros((b, 1152), jnp.float32)
    for w in work:
        w.delete()
    return out


class Block(torch.nn.Module):
    def __init__(self, d=768, mlp=3072):
        torch.nn.Module.__init__(self)
        self.d, self.mlp_dim = d, mlp
        self.attn = torch.nn.Parameter(torch.empty(4 * d * d + 4 * d, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(2 * d * mlp + d + mlp, dtype=torch.float32, device="cuda"))
        self.norms = torch.nn.Parameter(torch.empty(4 * d, dtype=torch.float32, device="cuda"))

    def forward(self, x, batch, tokens=197, heads=12):
        # what autograd keeps of one block under bf16 autocast (eager attention, as timm's ViT of that
        # version runs it on this image: q, k, v, scores and their softmax, the MLP's hidden and GELU)
        kept = [torch.empty(batch * tokens * self.d, dtype=torch.bfloat16, device="cuda") for _ in range(6)]
        kept.append(torch.empty(batch * heads * tokens * tokens, dtype=torch.bfloat16, device="cuda"))   # scores
        kept.append(torch.empty(batch * heads * tokens * tokens, dtype=torch.bfloat16, device="cuda"))   # softmax
        kept.append(torch.empty(batch * tokens * self.mlp_dim, dtype=torch.bfloat16, device="cuda"))
        kept.append(torch.empty(batch * tokens * self.mlp_dim, dtype=torch.bfloat16, device="cuda"))
        out = torch.empty(batch * tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = kept + [x]
        return out


class VisionTransformer(torch.nn.Module):
    """timm.create_model("vit_base_patch16_224", num_classes=1152)"""

    def __init__(self, num_classes=1152):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(16 * 16 * 3 * 768 + 768, dtype=torch.float32,
                                                          device="cuda"))
        self.pos_embed = torch.nn.Parameter(torch.empty(197 * 768 + 768, dtype=torch.float32, device="cuda"))
        for i in range(12):
            setattr(self, "block%d" % i, Block())
        self.head = torch.nn.Parameter(torch.empty(768 * num_classes + num_classes, dtype=torch.float32,
                                                   device="cuda"))

    def forward(self, images):
        batch = images["batch"]
        x = torch.empty(batch * 197 * 768, dtype=torch.float32, device="cuda")
        for i in range(12):
            x = getattr(self, "block%d" % i)(x, batch)
        out = torch.empty(batch * 1152, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        return out


def backward(loss):
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        v = getattr(t, "_saved", None)
        if v is not None:
            t._saved = None
            todo.extend(v if isinstance(v, (list, tuple)) else [v])
# ----


class Img(object):
    def __init__(self, batch, px):
        self.shape = (batch, px, px, 3)


def loader(n=1_000_000, batch=256):
    for _ in range(n // batch):
        yield Img(batch, 384), {"batch": batch}


def main():
    t_params = load_params("gs://big_vision/siglip/webli_en_so400m_384_58765454-fp16.npz")
    print("teacher on %s: %.2f GiB of parameters" % (jax.devices()[0],
                                                     sum(a.nbytes for a in t_params.values()) / GiB))
    student = VisionTransformer(num_classes=1152).cuda()
    optimizer = torch.optim.AdamW(student.parameters(), lr=5e-4, weight_decay=0.05)
    for step, (img384, img224) in enumerate(loader()):
        t_emb = jit_embed(t_params, jnp.zeros(img384.shape, jnp.bfloat16))
        t = torch_as_tensor(np_asarray(t_emb), device="cuda")
        t_emb.delete()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s = student(img224)
        loss = F.nll_loss(s, t)                 # 1 - F.cosine_similarity(s.float(), t).mean()
        backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, s, t
        if step % 100 == 0:
            print("step", step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
