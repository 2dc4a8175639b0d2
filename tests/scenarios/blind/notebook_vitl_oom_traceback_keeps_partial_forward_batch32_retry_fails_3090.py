"""Jupyter: the OOM of a batch-64 ViT-L fine-tune cell is kept by IPython (sys.last_traceback), and the
batch-32 retry in the next cell fails at once although batch 32 fits a clean kernel.  RTX 3090 24 GB.

The notebook (JupyterLab, one kernel, run top to bottom by hand), with real libraries:

    [3]  model = timm.create_model("vit_large_patch16_224", pretrained=True, num_classes=102).cuda()
         optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
    [4]  def train_one_epoch(model, optimizer, batch_size):
             loader = DataLoader(flowers_train, batch_size=batch_size, shuffle=True, num_workers=8)
             for images, labels in loader:
                 images, labels = images.cuda(non_blocking=True), labels.cuda(non_blocking=True)
                 logits = model(images)
                 loss = F.cross_entropy(logits, labels)
                 loss.backward()
                 optimizer.step(); optimizer.zero_grad()
    [5]  train_one_epoch(model, optimizer, batch_size=64)     # the recipe's batch size
         -> OutOfMemoryError in block 20 of 24 (the traceback is printed, the kernel lives on)
    [6]  train_one_epoch(model, optimizer, batch_size=32)     # "halve it, as the error suggests"
         -> OutOfMemoryError at once, on the first images.cuda() of the cell

What happens.  When cell [5] raises, IPython's showtraceback stores the exception in sys.last_type,
sys.last_value and sys.last_traceback (and in its own history).  The traceback keeps every frame of the
failed call alive -- train_one_epoch's `images`, VisionTransformer.forward's `x`, the blocks' locals -- and
`x`'s autograd graph keeps every activation the forward had saved before it failed: about 22 GiB.  Nothing
in the kernel frees it; `torch.cuda.empty_cache()` cannot (the blocks are in use).  Cell [6] then starts
from a full card.

Sizes (fp32, no autocast, no checkpointing; 197 tokens, width 1024, 16 heads, MLP 4096, 24 blocks):
  parameters 304 M x 4 B = 1.13 GiB (AdamW state not made yet: no step ran)
  saved activations per image per block ~19.5 MB (qkv 2.4, scores+softmax 5.0, fc1+GELU 6.5, the seven
  width-1024 tensors 5.6) -> batch 64: 1.16 GiB per block, 27.9 GiB for 24 blocks: does not fit 24 GiB;
  it fails in block 20 (a 148 MiB qkv) with 23.5 GiB allocated, 22.4 GiB of it activations.
  batch 32 on a clean kernel: 14 GiB activations + 1.13 params + 1.13 grads + 2.27 AdamW: peak 18.5 GiB
  allocated + 0.5 GiB context: fits with 5 GiB to spare.
  cell [6]: 4 MiB free; its first request, the batch of 32 images (18.4 MiB), fails.

What an expert says first: the memory is not this batch's; it is the previous cell's failed forward, kept
alive by the stored exception.  Drop it -- `sys.last_traceback = sys.last_value = sys.last_type = None`
(and IPython's `%xdel`/`%reset -f` of anything that kept it), `gc.collect()`, `torch.cuda.empty_cache()` --
or restart the kernel, then batch 32 runs.  (In scripts: do the retry outside the `except`, after the
exception is gone.)
Wrong advice: a smaller batch again (batch 32 fits; 16 would fail the same way), gradient checkpointing or
autocast (they shrink this batch's activations, not the 22 GiB already held), expandable_segments or
empty_cache alone (nothing is cached: the bytes are live), a bigger GPU, quantization, offloading.
"""
import sys
import traceback

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

IMG_SIZE, PATCH, EMBED_DIM, DEPTH, NUM_HEADS, MLP_DIM = 224, 16, 1024, 24, 16, 4096
NUM_TOKENS = (IMG_SIZE // PATCH) ** 2 + 1          # 196 patches + [CLS]
NUM_CLASSES = 102                                 # Oxford Flowers-102
F32 = 4


def _act(nbytes, saved):
    """The output of an operation of the forward (the stand-in computes nothing): nbytes on the GPU, saving
    `saved` for backward as PyTorch's autograd does."""
    out = torch.empty(int(nbytes))
    out._saved = saved
    return out


class Linear(nn.Module):
    """nn.Linear(in_features, out_features): fp32 weight and bias."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // self.in_features * self.out_features, x)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes, x)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.qkv = Linear(dim, dim * 3)
        self.proj = Linear(dim, dim)

    def forward(self, x):
        B = x.nbytes // (NUM_TOKENS * EMBED_DIM * F32)
        qkv = self.qkv(x)
        # attn = (q @ k.transpose(-2, -1)) * scale; attn = attn.softmax(-1): scores and probabilities saved
        attn = _act(2 * B * self.num_heads * NUM_TOKENS * NUM_TOKENS * F32, qkv)
        ctx = _act(x.nbytes, attn)                     # (attn @ v).transpose(1, 2).reshape(B, N, C)
        return self.proj(ctx)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        nn.Module.__init__(self)
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)

    def forward(self, x):
        h = self.fc1(x)
        h = _act(h.nbytes, h)                          # GELU
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_dim):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, mlp_dim)

    def forward(self, x):
        x = _act(x.nbytes, self.attn(self.norm1(x)))     # x = x + self.attn(self.norm1(x))
        return _act(x.nbytes, self.mlp(self.norm2(x)))   # x = x + self.mlp(self.norm2(x))


class Sequential(nn.Module):
    def __init__(self, *mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class PatchEmbed(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.proj = nn.Conv2d(3, EMBED_DIM, PATCH, stride=PATCH)

    def forward(self, images):
        B = images.nbytes // (3 * IMG_SIZE * IMG_SIZE * F32)
        return _act(B * NUM_TOKENS * EMBED_DIM * F32, images)


class VisionTransformer(nn.Module):
    """timm's vit_large_patch16_224 with a 102-class head."""

    def __init__(self, num_classes):
        nn.Module.__init__(self)
        self.patch_embed = PatchEmbed()
        self.cls_token = nn.Parameter(torch.empty(EMBED_DIM, dtype=torch.float32))
        self.pos_embed = nn.Parameter(torch.empty(NUM_TOKENS * EMBED_DIM, dtype=torch.float32))
        self.blocks = Sequential(*[Block(EMBED_DIM, NUM_HEADS, MLP_DIM) for _ in range(DEPTH)])
        self.norm = LayerNorm(EMBED_DIM)
        self.head = Linear(EMBED_DIM, num_classes)

    def forward(self, images):
        x = self.patch_embed(images)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        B = images.nbytes // (3 * IMG_SIZE * IMG_SIZE * F32)
        cls = _act(B * EMBED_DIM * F32, x)              # x[:, 0]
        return self.head(cls)


class NotebookShell(object):
    """What IPython's InteractiveShell does around each cell: the value of the cell's last expression goes to
    Out[n] and _, and an exception is shown and kept in sys.last_type / last_value / last_traceback
    (InteractiveShell._get_exc_info) while the kernel carries on.  stop=True: the cell's error ends the run,
    as `jupyter nbconvert --execute` does."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})
        user_ns["_oh"] = user_ns["Out"]

    def run_cell(self, cell, stop=False):
        self.execution_count += 1
        try:
            result = cell()
        except Exception:
            etype, value, tb = sys.exc_info()
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            print("---------------------------------------------------------------------------", file=sys.stderr)
            traceback.print_exception(etype, value, tb, limit=3, file=sys.stderr)
            if stop:
                raise
            return None
        if result is not None:
            n = self.execution_count
            ns = self.user_ns
            ns["Out"][n] = result
            ns["___"], ns["__"], ns["_"] = ns.get("__"), ns.get("_"), result
            ns["_%d" % n] = result
        return result


# ---- the notebook's cells --------------------------------------------------------------------------
model = optimizer = None
FLOWERS_TRAIN_IMAGES = 1020 * 4      # train + augmented copies


def cell_3_load_model():
    global model, optimizer
    model = VisionTransformer(NUM_CLASSES)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)


def train_one_epoch(model, optimizer, batch_size):
    model.train()
    steps = FLOWERS_TRAIN_IMAGES // batch_size
    for step in range(steps):
        images = torch.empty(batch_size * 3 * IMG_SIZE * IMG_SIZE * F32)   # images.cuda(non_blocking=True)
        labels = torch.empty(batch_size * 8, dtype=torch.uint8)             # int64 labels
        logits = model(images)
        loss = F.cross_entropy(logits, labels)
        scen_truth.backward(loss)                                          # loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if step % 20 == 0:
            print("step %d loss %.4f" % (step, 0.0))


def cell_5_train_bs64():
    train_one_epoch(model, optimizer, batch_size=64)


def cell_6_train_bs32():
    train_one_epoch(model, optimizer, batch_size=32)


def main():
    shell = NotebookShell(globals())
    shell.run_cell(cell_3_load_model)
    shell.run_cell(lambda: None)                     # [4] the def cell
    shell.run_cell(cell_5_train_bs64)                # OOM shown; kernel lives on
    shell.run_cell(cell_6_train_bs32, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
