"""Contrastive image-text pretraining (an OpenCLIP ViT-B/16) on a web-crawled set, torchrun on one node of 4
L40S cards (45 GiB), PyTorch 2.4.1, rank 2 shown.  To keep the CPUs out of the input pipeline the user
ships the raw JPEG bytes from the DataLoader and decodes on the GPU with nvJPEG, then converts and resizes
there:

    for jpegs, texts in loader:                                   # 256 encoded images per rank
        imgs = torchvision.io.decode_jpeg(jpegs, device="cuda")   # uint8 3 x H x W each
        batch = []
        for img in imgs:
            x = img.float() / 255.0
            x = TF.resize(x, [224, 224], antialias=True)
            batch.append(TF.normalize(x, MEAN, STD))
        images = torch.stack(batch)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = clip_loss(*model(images, texts))
        ...

The crawl's images are ordinary photos (~0.2 MP), but one shard holds a stitched gigapixel panorama, 64000 x
32000 pixels (the crawler kept it, and nvJPEG decodes it without complaint): 5.7 GiB as uint8, 22.9 GiB
as float32.  `img.float()` of it still fits; `/ 255.0` needs a second 22.9 GiB tensor while the first is
alive: PyTorch gives back the previous step's cached activations (10.7 GiB), retries, and still fails.  The batch,
the model and the training state (2.8 GiB with DDP's buckets) are small; every other batch of the epoch
fits with room to spare.

An expert: one input is the peak -- bound the size of a sample before it reaches the GPU: read the JPEG
header (or the shard's metadata) and skip or downscale images above a pixel budget (nvJPEG/CPU decode at
reduced size, or resize first and convert to float after), and drop such files from the crawl.  Not a
smaller batch (a batch of one with this image fails too), not checkpointing or mixed precision of the model
(the model's activations are not involved), not ZeRO/8-bit optimizers, and a bigger card only postpones
the next bigger panorama.
"""
import ctypes
import os
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

rank = int(os.environ.get("RANK", "0"))
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))

# Tensor.float(), Tensor.__truediv__ and torchvision's decode_jpeg / resize / normalize as PyTorch and
# torchvision run them (the stand-in torch has none of them): frames of their own files, each result a new
# tensor of its size (uint8 -> float32 is four times the bytes)
_TENSOR_OPS = '''
def _float(self):
    out = empty(self.nbytes * (4 if self.dtype == "uint8" else 1), device=self.device)
    out._dtype = "float32"
    return out

def _matmul(self, other):
    out = empty((self.nbytes // 2048) * (other.nbytes // 2048) * 4, device=self.device)
    return _derive(out, self, other)

def _truediv(self, other):
    out = empty(self.nbytes, device=self.device)
    out._dtype = self.dtype
    return out
'''
_TV_IO = '''
def decode_jpeg(inputs, device="cuda"):
    out = []
    for h, w in inputs:
        t = empty(3 * h * w, device=device)
        t._dtype = "uint8"
        out.append(t)
    return out
'''
_TV_F = '''
def resize(inpt, size, antialias=True):
    out = empty(3 * size[0] * size[1] * 4, device=inpt.device)
    return out

def normalize(inpt, mean, std):
    return empty(inpt.nbytes, device=inpt.device)
'''
_ns = {"empty": torch.empty, "_derive": torch._derive}
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["_float"]
torch.Tensor.__truediv__ = _ns["_truediv"]
torch.Tensor.__matmul__ = _ns["_matmul"]
_tv = os.path.join(os.path.dirname(os.path.dirname(torch.__file__)), "torchvision")
exec(compile(_TV_IO, os.path.join(_tv, "io", "image.py"), "exec"), _ns)
exec(compile(_TV_F, os.path.join(_tv, "transforms", "v2", "functional", "_geometry.py"), "exec"), _ns)
decode_jpeg, resize, normalize = _ns["decode_jpeg"], _ns["resize"], _ns["normalize"]
_STACK = '''
def stack(tensors):
    return empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
'''
exec(compile(_STACK, torch.__file__, "exec"), _ns)
torch.stack = _ns["stack"]

MEAN, STD = (0.481, 0.458, 0.408), (0.269, 0.261, 0.276)


def nccl_library():
    for d in (os.environ.get("SCEN_KIT_LIB", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib")):
        p = os.path.join(d, "libnccl.so.2")
        if d and os.path.exists(p):
            return ctypes.CDLL(p)
    raise SystemExit("libnccl.so.2 stand-in not found")


class VisionTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(27 * MiB, device="cuda")))
        self.proj = torch.nn.Parameter(torch.empty(768 * 512 * 4, device="cuda"))

    def forward(self, images):
        acts = [torch.empty(640 * MiB, device="cuda") for _ in range(12)]     # bf16 activations, batch 256
        out = torch.empty(256 * 512 * 4, device="cuda")
        out._saved = acts
        return out


class TextTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(12 * MiB, device="cuda")))
        self.token_embedding = torch.nn.Parameter(torch.empty(49408 * 512 * 4, device="cuda"))

    def forward(self, texts):
        acts = [torch.empty(256 * MiB, device="cuda") for _ in range(12)]
        out = torch.empty(256 * 512 * 4, device="cuda")
        out._saved = acts
        return out


class CLIP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.visual = VisionTower()
        self.text = TextTower()
        self.logit_scale = torch.nn.Parameter(torch.empty(4, device="cuda"))

    def forward(self, images, texts):
        return self.visual(images), self.text(texts)


def clip_loss(img_feats, txt_feats):
    logits = img_feats @ txt_feats
    logits._saved = [img_feats, txt_feats]
    return F.cross_entropy(logits, None)


def shard_batches():
    """The DataLoader's batches of encoded JPEGs (height, width); the third holds the panorama."""
    for step in range(4):
        sizes = [(375, 500)] * 256
        if step == 2:
            sizes[137] = (32000, 64000)
        yield sizes, torch.empty(256 * 77 * 8, device="cuda")


torch.cuda.set_device(local_rank)
nccl = nccl_library()
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
if nccl.nccl_comm_init_rank(world, rank, 4 * MiB, 16) != 0:
    raise RuntimeError("NCCL error")
model = torch.nn.parallel.DistributedDataParallel(CLIP(), device_ids=[local_rank])
optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.2)

try:
    for jpegs, texts in shard_batches():
        imgs = decode_jpeg(jpegs, device="cuda")
        batch = []
        for img in imgs:
            x = img.float() / 255.0
            x = resize(x, [224, 224], antialias=True)
            batch.append(normalize(x, MEAN, STD))
            del x
        del imgs
        images = torch.stack(batch)
        del batch
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = clip_loss(*model(images, texts))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        del loss, images
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
