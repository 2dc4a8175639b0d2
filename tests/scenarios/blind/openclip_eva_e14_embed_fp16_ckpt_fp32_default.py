"""embed_catalog.py -- nightly job that embeds our 2M product photos with OpenCLIP's EVA02-E-14-plus
(laion2b_s9b_b144k; the downloaded open_clip_pytorch_model.bin is fp16, 10 GB: 5.0B parameters, image
tower 4.35B, text tower 0.7B) on one AWS g5 instance (A10G, 23 GB).  The model card says it fits a
24 GB card, so I wrote:

    model, _, preprocess = open_clip.create_model_and_transforms(
        "EVA02-E-14-plus", pretrained="/models/eva02_e14_plus/open_clip_pytorch_model.bin", device="cuda")
    model.eval()
    with torch.no_grad():
        for images in loader:                       # batch_size=256, 224x224
            feats = model.encode_image(images.cuda())
            ...

Loading goes through; the first batch dies in the first transformer block of the image tower ("Tried to
allocate 3.76 GiB ... 1.94 GiB free").

What an expert sees: create_model_and_transforms was given no precision, and its default is "fp32":
the fp16 checkpoint is upcast to 18.8 GiB of float32 weights, twice what the checkpoint holds, which
leaves ~3 GiB for activations of a 256-image batch through 1792-wide, 15360-MLP blocks.  Load it in
the checkpoint's precision (precision="fp16"; the A10G also does bf16): 9.4 GiB of weights, and the
activations halve too.  The job already runs under torch.no_grad(), so inference_mode buys nothing;
autocast over fp32 weights keeps the 18.8 GiB; a smaller batch would get it through while the weights
stay twice too large.  No other process, cache or fragmentation problem.
"""
import json
import os
import sys
import tempfile

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
WIDTH, MLP, HEADS, DEPTH, PATCHES = 1792, 15360, 16, 64, 257
TEXT_WIDTH, TEXT_DEPTH = 1280, 32
BLOCK_PARAMS = 67_900_000        # one EVA-E block: attention 4*w*w + SwiGLU MLP + norms
TEXT_BLOCK_PARAMS = 21_700_000


def _dtype_size(precision):
    return {"fp32": 4, "fp16": 2, "bf16": 2, "pure_fp16": 2, "pure_bf16": 2}[precision]


# -- the library (open_clip's factory and EVA tower, reduced to what holds memory) -------------------
class Block(nn.Module):
    def __init__(self, n_params, precision):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_params * _dtype_size(precision), device="cuda"),
                                   requires_grad=True)
        self.itemsize = _dtype_size(precision)

    def forward(self, x):
        b = x.nbytes // (PATCHES * WIDTH * self.itemsize)
        qkv = torch.empty(b * PATCHES * 3 * WIDTH * self.itemsize, device="cuda")
        ctx = torch.empty(b * PATCHES * WIDTH * self.itemsize, device="cuda")   # fused SDPA: no score matrix
        del qkv
        hidden = torch.empty(b * PATCHES * MLP * self.itemsize, device="cuda")      # SwiGLU: w1(x)
        gate = torch.empty(b * PATCHES * MLP * self.itemsize, device="cuda")        # w2(x)
        out = torch.empty(b * PATCHES * WIDTH * self.itemsize, device="cuda")
        del hidden, gate, ctx
        return out


class Tower(nn.Module):
    def __init__(self, n_blocks, block_params, embed_params, precision):
        nn.Module.__init__(self)
        self.embed = nn.Parameter(torch.empty(embed_params * _dtype_size(precision), device="cuda"))
        self.blocks = []
        for i in range(n_blocks):
            blk = Block(block_params, precision)
            setattr(self, "block_%d" % i, blk)
            self.blocks.append(blk)
        self.itemsize = _dtype_size(precision)

    def forward(self, images):
        b = images.nbytes // (3 * 224 * 224)
        x = torch.empty(b * PATCHES * WIDTH * self.itemsize, device="cuda")
        for blk in self.blocks:
            x = blk(x)
        return x


class CustomTextCLIP(nn.Module):
    def __init__(self, precision):
        nn.Module.__init__(self)
        self.visual = Tower(DEPTH, BLOCK_PARAMS, 5_000_000, precision)
        self.text = Tower(TEXT_DEPTH, TEXT_BLOCK_PARAMS, 64_000_000, precision)

    def encode_image(self, images):
        return self.visual(images)


def create_model_and_transforms(model_name, pretrained=None, precision="fp32", device="cpu"):
    """open_clip.create_model_and_transforms: builds the model in `precision` (default fp32), then loads
    the checkpoint's state dict into it (the fp16 tensors are cast to the model's dtype)."""
    model = CustomTextCLIP(precision)
    if pretrained:
        state_dict = torch.load(pretrained, map_location="cpu")
        model.load_state_dict(state_dict)
    return model, None, None


# -- stand-in scaffolding: the downloaded checkpoint (fp16 tensors; the stand-in stores sizes only) ---
def _write_checkpoint(path):
    sizes = {"visual.embed": 5_000_000 * 2, "text.embed": 64_000_000 * 2}
    for i in range(DEPTH):
        sizes["visual.block_%d.weight" % i] = BLOCK_PARAMS * 2
    for i in range(TEXT_DEPTH):
        sizes["text.block_%d.weight" % i] = TEXT_BLOCK_PARAMS * 2
    with open(path, "w") as f:
        json.dump(sizes, f)


def loader(n_batches, batch_size=256):
    for _ in range(n_batches):
        yield torch.empty(batch_size * 3 * 224 * 224, dtype=torch.uint8, device="cuda")


def main(ckpt):
    model, _, preprocess = create_model_and_transforms("EVA02-E-14-plus", pretrained=ckpt, device="cuda")
    model.eval()
    batch_size = 256
    feats_all = []
    with torch.no_grad():
        for images in loader(8000, batch_size):
            feats = model.encode_image(images)
            feats_all.append(feats.nbytes)
    return feats_all


tmp = tempfile.mkdtemp(prefix="eva_ckpt")
ckpt = os.path.join(tmp, "open_clip_pytorch_model.bin")
_write_checkpoint(ckpt)
try:
    main(ckpt)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
finally:
    os.unlink(ckpt)
    os.rmdir(tmp)
sys.exit(0)
