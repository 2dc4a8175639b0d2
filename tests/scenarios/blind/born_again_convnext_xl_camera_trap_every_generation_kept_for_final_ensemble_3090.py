"""ban_train.py -- a conservation NGO's camera-trap species classifier (48 species, Serengeti-style
images at 224 px) trained as Born-Again Networks (Furlanello et al. 2018) on the lab's RTX 3090 (24 GB,
23.5 GiB usable).  Generation 0 is ConvNeXt-XL (350M parameters: 1.3 GiB fp32 weights, bf16 autocast,
AdamW, batch 48) trained on the labels; each later generation is a fresh ConvNeXt-XL trained on the labels
plus the previous generation's soft targets (teacher in eval mode, under torch.no_grad); the deliverable is
the "BAN ensemble" of all generations, averaged at the end.  So the script keeps them:

    generations = []
    for gen in range(4):
        student = timm.create_model("convnext_xlarge.fb_in22k", pretrained=True, num_classes=48).cuda()
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, weight_decay=0.05)
        ... train 30 epochs (optimizer.zero_grad() at the top of each step) ...
        generations.append(student)
        teacher = student
        del optimizer; gc.collect(); torch.cuda.empty_cache()

The user frees the optimizer and the cache after each generation and believes that is the cleanup.  Only
the last generation is needed during training (it is the teacher); every earlier one stays on the GPU in
the list with its weights AND the gradients of its last step (zero_grad runs at the top of the step, so
the last backward's .grad stays on each finished model): +2.6 GiB per finished generation.  Generation 0
peaks at 16.1 GiB (weights 1.3 + AdamW 2.6 + grads 1.3 + ~10.9 GiB of activations), generation 1 at
18.7, generation 2 at 21.3; generation 3 -- three days into the run -- needs 24.0 GiB of live tensors,
more than the card: it passes its first step (no AdamW state yet) and fails in the forward pass of the
second, with 1.4 GiB of the cache in pieces around the old generations' tensors.

An expert: the finished generations are not needed on the GPU: move each to the CPU (or save its
state_dict to disk) when it is done and run the final ensemble one model at a time; at least drop their
gradients (zero_grad(set_to_none=True) after the last step) -- half of the growth.  Wrong first advice:
a smaller batch or gradient checkpointing (they buy one more generation and change the recipe between
generations), mixed precision (bf16 autocast already), teacher under no_grad (it already is), an 8-bit
optimizer (the state is the current student's; the growth is elsewhere), expandable_segments (packed
perfectly, generation 3 still needs 0.5 GiB more than the card) or empty_cache (done already; the models
are referenced), a bigger GPU.
"""
import gc
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------------------------------------------------
# timm's ConvNeXt and the tensor arithmetic of the KD loss, as far as memory goes (the stand-in torch has no
# timm and its Tensor no arithmetic): parameters on the GPU in fp32; a forward keeps what autograd saves when
# its parameters require grad (training), frees each temporary as it goes under no_grad (the teacher, eval).
# ---------------------------------------------------------------------------------------------------------
BF16 = torch.bfloat16


def _op(a, b=None):
    out = torch.empty(a.nbytes, device="cuda")
    out._dtype = a.dtype
    if torch.is_grad_enabled() and a._params:
        out._saved = a
    return torch._derive(out, *[t for t in (a, b) if isinstance(t, torch.Tensor)])


for _name in ("__add__", "__radd__", "__mul__", "__rmul__", "__truediv__"):
    setattr(torch.Tensor, _name, _op)


def _kl_div(input, target, reduction="batchmean"):
    return F.nll_loss(input, target)


def _softmax(input, dim=-1):
    return torch.empty(input.nbytes, device="cuda")


F.kl_div = getattr(F, "kl_div", _kl_div)
F.softmax = getattr(F, "softmax", _softmax)


class SavedTensors(object):
    def __init__(self):
        self.last = None

    def append(self, t):
        t._saved = self.last
        self.last = t


class ConvNeXtBlock(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.conv_dw = torch.nn.Parameter(torch.empty(49 * dim * 4 + dim * 4, device="cuda"))
        self.mlp_fc1 = torch.nn.Parameter(torch.empty(4 * dim * dim * 4 + 4 * dim * 4, device="cuda"))
        self.mlp_fc2 = torch.nn.Parameter(torch.empty(4 * dim * dim * 4 + dim * 4, device="cuda"))
        self.norm_gamma = torch.nn.Parameter(torch.empty(3 * dim * 4, device="cuda"))

    def forward(self, x, pixels, keep):
        _ = (self.conv_dw, self.mlp_fc1, self.mlp_fc2, self.norm_gamma)
        # dwconv out, LayerNorm in (fp32) and out, fc1 out (4C), GELU out (4C), fc2 out
        for width in (1, 2, 1, 4, 4, 1):
            t = torch.empty(pixels * self.dim * width, dtype=BF16, device="cuda")
            if keep is not None:
                keep.append(t)
        return x


class ConvNeXt(torch.nn.Module):
    """convnext_xlarge: depths 3-3-27-3, dims 256-512-1024-2048; 224 px input: 56, 28, 14, 7 px per side."""

    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.stages = []
        for s, (depth, dim, side) in enumerate(((3, 256, 56), (3, 512, 28), (27, 1024, 14), (3, 2048, 7))):
            blocks = [ConvNeXtBlock(dim) for _ in range(depth)]
            for i, b in enumerate(blocks):
                setattr(self, "stages_%d_blocks_%d" % (s, i), b)
            self.stages.append((blocks, side))
        self.downsample = torch.nn.Parameter(torch.empty((48 * 256 + 4 * (256 * 512 + 512 * 1024 + 1024 * 2048)) * 4,
                                                         device="cuda"))
        self.head_fc = torch.nn.Parameter(torch.empty((2048 * num_classes + 3 * 2048) * 4, device="cuda"))

    def forward(self, images):
        batch = images.nbytes // (3 * 224 * 224 * 2)
        grad = torch.is_grad_enabled() and any(p.requires_grad for p in self.parameters())
        keep = SavedTensors() if grad else None
        _ = (self.downsample, self.head_fc)
        x = images
        for blocks, side in self.stages:
            for b in blocks:
                x = b(x, batch * side * side, keep)
        logits = torch.empty(batch * 48 * 4, device="cuda")
        logits._saved = keep.last if keep is not None else None
        return logits


class timm(object):
    @staticmethod
    def create_model(name, pretrained=False, num_classes=1000):
        return ConvNeXt(num_classes)


def camera_trap_loader(split, batch_size, n_batches):
    for _ in range(n_batches):
        yield (torch.empty(batch_size * 3 * 224 * 224, dtype=BF16, device="cuda"),
               torch.empty(batch_size * 8, device="cuda"))


# ---------------------------------------------------------------------------------------------------------
# the user's script
# ---------------------------------------------------------------------------------------------------------
NUM_GENERATIONS = 4          # gen 0 + 3 born-again generations, then the BAN ensemble
EPOCHS = 30
BATCH_SIZE = 48
T, ALPHA = 4.0, 0.7
STEPS_SHOWN = 3              # (the stand-in runs a few steps of each generation: each step allocates alike)


def kd_loss(student_logits, teacher_logits, labels):
    soft = F.kl_div(F.log_softmax(student_logits / T, dim=1), F.softmax(teacher_logits / T, dim=1),
                    reduction="batchmean") * (T * T)
    return ALPHA * soft + (1 - ALPHA) * F.cross_entropy(student_logits, labels)


def evaluate(model):
    model.eval()
    correct = 0
    with torch.no_grad():
        for images, labels in camera_trap_loader("val", 128, 2):
            logits = model(images)
            correct += 1
    return correct


generations = []
teacher = None
try:
    for gen in range(NUM_GENERATIONS):
        student = timm.create_model("convnext_xlarge.fb_in22k", pretrained=True, num_classes=48).cuda()
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-4, weight_decay=0.05)
        student.train()
        for step, (images, labels) in enumerate(camera_trap_loader("train", BATCH_SIZE, STEPS_SHOWN)):
            optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                if teacher is not None:
                    with torch.no_grad():
                        teacher_logits = teacher(images)
                logits = student(images)
                if teacher is None:
                    loss = F.cross_entropy(logits, labels)
                else:
                    loss = kd_loss(logits, teacher_logits, labels)
            scen_truth.backward(loss)                          # loss.backward()
            optimizer.step()
            print("gen %d step %d  peak %.1f GiB" % (gen, step, torch.cuda.max_memory_allocated() / (1 << 30)))
        acc = evaluate(student)
        generations.append(student)
        teacher = student
        del optimizer
        gc.collect()
        torch.cuda.empty_cache()
        print("generation %d done (%d epochs), %.1f GiB allocated" % (gen, EPOCHS,
              torch.cuda.memory_allocated() / (1 << 30)))

    # the BAN ensemble: average the generations' predictions
    with torch.no_grad():
        for images, labels in camera_trap_loader("test", 128, 4):
            probs = [F.softmax(m(images), dim=1) for m in generations]
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
