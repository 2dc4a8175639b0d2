"""score_shards.py -- offline aesthetic / watermark scoring of web-image shards (LAION-style tar shards of ~84k
images) with CLIP ViT-L/14's vision tower (304M parameters, fp16, 0.57 GiB) and two small MLP heads, on one
A100 40 GB.  The DataLoader was the bottleneck (JPEG decoding on 8 CPU cores), so the author decodes a shard once
and keeps it on the GPU:

    class ShardOnGPU:
        def __init__(self, tar_path):
            self.raw = torch.from_numpy(decode_all(tar_path)).cuda()                  # uint8 N x 224 x 224 x 3
            self.pixels = ((self.raw.half() / 255 - MEAN) / STD).permute(0, 3, 1, 2)  # fp16, normalised once
        def batches(self, batch_size):
            for i in range(0, len(self.pixels), batch_size):
                yield self.pixels[i:i + batch_size]                                   # views, no copies

    with torch.inference_mode():
        for tar in shards:
            ds = ShardOnGPU(tar)
            for pixel_values in ds.batches(batch_size=1024):
                feats = vision(pixel_values).image_embeds; aesthetic(feats); watermark(feats)

84,000 images: raw uint8 11.8 GiB + normalised fp16 23.6 GiB = 35.3 GiB of a 40 GB card hold the data set;
the model is 0.6 GiB.  The first batch of 1,024 images (257 tokens each) gets through the patch embedding and
attention of the first layer and runs out at the MLP's fc1 output (2 GiB asked; 1 GiB free on the device and
1 GiB cached in blocks the attention freed).

An expert: the data set does not belong on the GPU -- keep the decoded shard in (pinned) host memory and move
one batch at a time (normalising per batch on the GPU is cheap), or at least drop the uint8 copy; the model
needs ~5 GiB of activations at batch 1,024.  Not quantization (0.6 GiB of weights), not inference_mode (on),
not the allocator's cache; a smaller batch would only hide it.
"""
import sys

import torch

import scen_truth

GiB = 1 << 30
scen_truth.note_every_empty(torch)

HIDDEN, MLP, LAYERS, TOKENS = 1024, 4096, 24, 257
IMAGE_BYTES = 224 * 224 * 3


def fp16(n_elems):
    return torch.empty(n_elems, dtype=torch.float16, device="cuda")


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.n_out = n_out
        self.weight = torch.nn.Parameter(fp16(n_in * n_out))

    def forward(self, x, rows):
        return fp16(rows * self.n_out)


class CLIPEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = Linear(HIDDEN, 3 * HIDDEN)
        self.out_proj = Linear(HIDDEN, HIDDEN)
        self.fc1 = Linear(HIDDEN, MLP)
        self.fc2 = Linear(MLP, HIDDEN)

    def forward(self, hidden, rows):
        normed = fp16(rows * HIDDEN)
        qkv = self.qkv(normed, rows)
        attn = fp16(rows * HIDDEN)                 # SDPA
        del qkv
        hidden = self.out_proj(attn, rows)         # + residual
        del attn, normed
        normed = fp16(rows * HIDDEN)
        x = self.fc1(normed, rows)
        x = fp16(rows * MLP) if x is not None else None   # quick_gelu
        out = self.fc2(x, rows)
        return out


class CLIPVisionModelWithProjection(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embedding = Linear(3 * 14 * 14, HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = CLIPEncoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.visual_projection = Linear(HIDDEN, 768)

    def forward(self, pixel_values, batch):
        rows = batch * TOKENS
        hidden = self.patch_embedding(pixel_values, rows)
        for layer in self.layers:
            hidden = layer(hidden, rows)
        return self.visual_projection(hidden, batch)


class Head(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w1 = Linear(768, 1024)
        self.w2 = Linear(1024, 1)

    def forward(self, feats, batch):
        return self.w2(self.w1(feats, batch), batch)


class ShardOnGPU(object):
    def __init__(self, tar_path, n_images):
        self.tar_path = tar_path
        self.n = n_images
        self.raw = torch.empty(n_images * IMAGE_BYTES, dtype=torch.uint8, device="cuda")
        self.pixels = fp16(n_images * IMAGE_BYTES)

    def batches(self, batch_size):
        for i in range(0, self.n, batch_size):
            yield self.pixels.view(), min(batch_size, self.n - i)


def main():
    vision = CLIPVisionModelWithProjection()
    aesthetic, watermark = Head(), Head()
    vision.eval()
    torch._C._cuda_attach_out_of_memory_observer(
        lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))   # truth mark (test scaffolding)
    with torch.inference_mode():
        for tar in ["laion-aesth/00412.tar", "laion-aesth/00413.tar"]:
            ds = ShardOnGPU(tar, 84000)
            for pixel_values, batch_size in ds.batches(batch_size=1024):
                feats = vision(pixel_values, batch_size)
                scores = (aesthetic(feats, batch_size), watermark(feats, batch_size))
                del feats, scores
            del ds


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer, at the failure
sys.exit(0)
