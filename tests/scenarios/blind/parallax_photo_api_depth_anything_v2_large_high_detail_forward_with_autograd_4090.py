"""depth_service.py -- the "3D photo" feature of a photo-sharing app: a FastAPI service on one RTX 4090
(24 GB) that turns an uploaded phone photo into a depth map, from which the app renders a parallax
animation.  Model: Depth Anything V2 Large (DINOv2 ViT-L/14 encoder + DPT head, 335M parameters,
float32 as the checkpoint is: 1.25 GiB), loaded as the repository's README shows:

    model = DepthAnythingV2(encoder="vitl", features=256, out_channels=[256, 512, 1024, 1024])
    model.load_state_dict(torch.load("checkpoints/depth_anything_v2_vitl.pth", map_location="cpu"))
    model = model.to("cuda").eval()

The README's `model.infer_image(raw_img)` resizes on the CPU with OpenCV and runs at 518 px.  The team
replaced it with their own preprocessing on the GPU (EXIF rotation, 16-bit output, and a `detail`
option) and calls the model directly:

    @app.post("/v1/depth")
    def depth(file: UploadFile, detail: str = "standard"):
        x = preprocess(img, short_side=1036 if detail == "high" else 518)   # multiple of 14
        d = model(x)                                 # <- infer_image was @torch.no_grad(); this is not
        d = F.interpolate(d[:, None], (h, w), mode="bilinear")[0, 0]
        png = png16(d)
        torch.cuda.empty_cache()                     # keeps nvidia-smi honest between requests
        return png

Since launch the handler has run the forward pass with autograd on: the parameters require grad (a
module's do, after load_state_dict), so every block keeps what backward would need.  At 518 px (1,814
tokens) that is about 8 GiB of saved activations per request (9.1 GiB peak) and nobody noticed (the
card has 24).  Then the app shipped
"high detail" (short side 1036: 74 x 98 patches, 7,253 tokens).  DINOv2's attention without xformers is
q @ k^T and softmax in float32: 16 heads x 7,253^2 x 4 B = 3.1 GiB per block, and with autograd on each
block's softmax output stays for backward.  The first high-detail request fails in the fifth block's
softmax (Tried to allocate 3.2 GiB) with 19.5 GiB allocated: 1.25 GiB of weights, 14.8 GiB that blocks
0-3 saved for backward, and block 4's scores.  With the forward under torch.inference_mode() the same
request peaks at about 8 GiB (two attention maps at a time, then freed).

An expert: this is inference run with autograd on (phase: a forward pass of an eval-mode model, no
backward will ever come) -- wrap the forward in torch.inference_mode() (or decorate the handler, as
infer_image was).  Then, for the high-detail path, memory-efficient attention (xformers / SDPA in fp16)
and a cap on the input size.  Wrong first advice: gradient checkpointing (there is no backward), a
smaller batch (it is one photo), a bigger GPU, quantization, expandable_segments or empty_cache (the
memory is live: the graph holds it).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

f32 = torch.float32


# ----------------------------------------------------------------------------------------------
# depth_anything_v2 (the repository's modules, as far as memory goes: the stand-in computes no values;
# each operation makes the output PyTorch's would, and with grad mode on keeps what its backward needs)
def _op(nelem, inputs=(), saved=(), dtype=f32):
    out = torch.empty(nelem, dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        out._saved = tuple(saved)
        torch._derive(out, *inputs)
    return out


class Linear(torch.nn.Module):
    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.fin, self.fout = fin, fout
        self.weight = torch.nn.Parameter(torch.empty(fin * fout, dtype=f32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(fout, dtype=f32, device="cuda"))

    def forward(self, x, tokens):
        w = self.weight
        return _op(tokens * self.fout, (x, w), (x,))


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.empty(dim, dtype=f32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(dim, dtype=f32, device="cuda"))

    def forward(self, x, tokens):
        w = self.weight
        return _op(tokens * self.dim, (x, w), (x,))


class Attention(torch.nn.Module):
    """dinov2/layers/attention.py: MemEffAttention falls back to this when xformers is not installed."""

    def __init__(self, dim=1024, num_heads=16):
        torch.nn.Module.__init__(self)
        self.num_heads, self.dim = num_heads, dim
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)

    def forward(self, x, tokens):
        qkv = self.qkv(x, tokens)
        q = _op(tokens * self.dim, (qkv,), (qkv,))                     # qkv[0] * self.scale
        attn = _op(self.num_heads * tokens * tokens, (q, qkv), (q, qkv))  # q @ k.transpose(-2, -1)
        attn = _op(self.num_heads * tokens * tokens, (attn,))           # attn.softmax(dim=-1)
        x = _op(tokens * self.dim, (attn, qkv), (attn, qkv))             # (attn @ v).transpose(1, 2).reshape
        return self.proj(x, tokens)


class Mlp(torch.nn.Module):
    def __init__(self, dim=1024, hidden=4096):
        torch.nn.Module.__init__(self)
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)
        self.hidden = hidden

    def forward(self, x, tokens):
        h = self.fc1(x, tokens)
        h = _op(tokens * self.hidden, (h,), (h,))                      # GELU
        return self.fc2(h, tokens)


class NestedTensorBlock(torch.nn.Module):
    def __init__(self, dim=1024):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim)
        self.ls1 = torch.nn.Parameter(torch.empty(dim, dtype=f32, device="cuda"))
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim)
        self.ls2 = torch.nn.Parameter(torch.empty(dim, dtype=f32, device="cuda"))

    def forward(self, x, tokens):
        a = self.attn(self.norm1(x, tokens), tokens)
        g = self.ls1
        x = _op(tokens * self.dim, (x, a, g), (a,))                     # x + ls1(attn(norm1(x)))
        m = self.mlp(self.norm2(x, tokens), tokens)
        g = self.ls2
        return _op(tokens * self.dim, (x, m, g), (m,))                  # x + ls2(mlp(norm2(x)))


class DinoVisionTransformer(torch.nn.Module):
    def __init__(self, depth=24, dim=1024):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.patch_embed = Linear(3 * 14 * 14, dim)
        self.pos_embed = torch.nn.Parameter(torch.empty(1370 * dim, dtype=f32, device="cuda"))
        for i in range(depth):
            setattr(self, "block_%d" % i, NestedTensorBlock(dim))
        self.depth = depth
        self.norm = LayerNorm(dim)

    def get_intermediate_layers(self, x, n, tokens):
        x = self.patch_embed(x, tokens)
        pe = self.pos_embed
        x = _op(tokens * self.dim, (x, pe), (x,))                       # interpolate_pos_encoding + add
        outputs = []
        for i in range(self.depth):
            x = getattr(self, "block_%d" % i)(x, tokens)
            if i in n:
                outputs.append(self.norm(x, tokens))
        return outputs


class DPTHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.projects = Linear(1024, 256 + 512 + 1024 + 1024)
        self.refinenets = torch.nn.Parameter(torch.empty(27_000_000, dtype=f32, device="cuda"))
        self.output_conv = Linear(256, 32)

    def forward(self, features, ph, pw):
        r = self.refinenets
        maps = [_op(256 * ph * pw * 16, tuple(features) + (r,), features)]
        out = _op(32 * ph * pw * 14 * 14, (maps[0],), maps)
        return _op(ph * pw * 14 * 14, (out,), (out,))


class DepthAnythingV2(torch.nn.Module):
    def __init__(self, encoder="vitl", features=256, out_channels=(256, 512, 1024, 1024)):
        torch.nn.Module.__init__(self)
        self.pretrained = DinoVisionTransformer()
        self.depth_head = DPTHead()

    def forward(self, x):
        ph, pw = x.shape_hw[0] // 14, x.shape_hw[1] // 14
        tokens = ph * pw + 1
        features = self.pretrained.get_intermediate_layers(x, [4, 11, 17, 23], tokens)
        return self.depth_head(features, ph, pw)


# ----------------------------------------------------------------------------------------------
# depth_service.py
def load_model():
    model = DepthAnythingV2(encoder="vitl", features=256, out_channels=[256, 512, 1024, 1024])
    # model.load_state_dict(torch.load("checkpoints/depth_anything_v2_vitl.pth", map_location="cpu"))
    return model.to("cuda").eval()


model = load_model()


def preprocess(photo, short_side):
    """EXIF-rotate, resize so the short side is `short_side` (keep aspect, multiple of 14), normalize."""
    w, h = photo["size"]
    if w < h:
        nw, nh = short_side, int(round(h * short_side / w / 14.0)) * 14
    else:
        nh, nw = short_side, int(round(w * short_side / h / 14.0)) * 14
    x = torch.empty(3 * nh * nw, dtype=f32, device="cuda")
    x.shape_hw = (nh, nw)
    return x


def depth(photo, detail="standard"):
    x = preprocess(photo, short_side=1036 if detail == "high" else 518)
    d = model(x)
    d = F.interpolate(d, scale_factor=photo["size"][0] / float(x.shape_hw[1]), mode="bilinear")
    result = {"depth_png16_bytes": d.nbytes // 2}       # .cpu().numpy() -> 16-bit PNG
    del x, d
    torch.cuda.empty_cache()                            # keep nvidia-smi honest between requests
    return result


requests = [({"size": (4032, 3024)}, "standard"), ({"size": (3024, 4032)}, "standard"),
            ({"size": (4000, 3000)}, "standard"), ({"size": (4032, 3024)}, "standard"),
            ({"size": (4032, 3024)}, "high")]           # the first request after "high detail" shipped
try:
    for i, (photo, detail) in enumerate(requests):
        out = depth(photo, detail)
        print("request %d (%s): ok, peak %.1f GiB" % (i, detail, torch.cuda.max_memory_allocated() / 2.0 ** 30))
        del out
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
