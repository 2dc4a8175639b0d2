"""distill_captions.py -- online distillation on a workstation with two 24 GiB RTX 4090s: a frozen 7B
vision-language teacher writes pseudo-captions for unlabeled images and a 1B student is trained on
them in the same loop, with plain `LD_PRELOAD=liboomguard.so`:

    device = torch.device("cuda")                     # copied from the single-GPU notebook
    teacher = LlavaForConditionalGeneration.from_pretrained(T, torch_dtype=torch.bfloat16).to(device).eval()
    student = StudentCaptioner(cfg).to(device)        # 1B parameters, fp32 master weights
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-4)
    for images in loader:
        with torch.no_grad():
            captions = teacher.generate(images, max_new_tokens=48)      # 12.9 GiB of bf16 weights
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = student(images, captions).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

`nvidia-smi` shows GPU 1 at 0 MiB the whole time: both models sit on cuda:0.  The teacher's weights
(12.9 GiB) and the student's (3.8 GiB), the teacher's generation buffers and the student's
activations fit, and so do the student's 3.8 GiB of gradients from its first backward; its first
optimizer.step() then creates AdamW's two moments (7.6 GiB) and fails half way.  Each half fits a 24 GiB card on its own: the teacher with room to
spare, the student with weights, gradients, moments and activations (about 17 GiB).

An expert: use the second GPU -- teacher.to("cuda:1") (its captions are small, moved to cuda:0 for
the student), or run the teacher as its own process on GPU 1.  The teacher already runs under
no_grad in bf16; the student already uses autocast; nothing else is on the card.  Not a bigger GPU,
not quantizing the teacher (possible, but it changes the labels and the idle GPU is right there), not
a cache or fragmentation problem, not inference.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
device = "cuda"


class Block(torch.nn.Module):
    def __init__(self, wbytes, dtype=None, trainable=True):
        torch.nn.Module.__init__(self)
        n = wbytes // 2 if dtype == torch.bfloat16 else wbytes
        self.weight = torch.nn.Parameter(torch.empty(n, dtype=dtype, device=device), requires_grad=trainable)


class Teacher(torch.nn.Module):
    """LLaVA-1.5-7B: a CLIP ViT-L tower, a projector and 32 Llama layers, bf16."""
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.vision_tower = Block(580 * MiB, torch.bfloat16, False)
        self.projector = Block(40 * MiB, torch.bfloat16, False)
        for i in range(32):
            setattr(self, "layer%d" % i, Block(386 * MiB, torch.bfloat16, False))
        self.lm_head = Block(250 * MiB, torch.bfloat16, False)

    def generate(self, images, max_new_tokens=48):
        kv = torch.empty(600 * MiB, device=device)            # KV cache for 64 images x (576 + 48) tokens
        step = torch.empty(180 * MiB, device=device)          # logits and hidden states per new token
        captions = torch.empty(64 * max_new_tokens * 8, device=device)
        del kv, step
        return captions


class Student(torch.nn.Module):
    """A 1B captioner (ViT-B encoder + 24-layer decoder), fp32 weights trained under bf16 autocast."""
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = Block(330 * MiB)
        for i in range(24):
            setattr(self, "layer%d" % i, Block(144 * MiB))
        self.embed = Block(125 * MiB)

    def forward(self, images, captions):
        h = images
        for i in range(24):
            a = torch.empty(56 * MiB, device=device)       # bf16 activations kept for backward
            a._saved = h
            h = a
        return h


def main():
    teacher = Teacher().eval()
    # truth mark at the failure itself (test scaffolding): AdamW's half-built state is gone by the except
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    student = Student()
    optimizer = torch.optim.AdamW(student.parameters(), lr=3e-4)
    for step in range(10000):
        images = torch.empty(64 * 3 * 336 * 336 * 2, dtype=torch.uint8, device=device)
        with torch.no_grad():
            captions = teacher.generate(images)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = student(images, captions)
            loss = torch.empty(512, device=device)
            loss._saved = out
            loss._params = tuple(student.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, out, images, captions


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
