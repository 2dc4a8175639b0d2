"""port_dinov2.py -- a retail-vision team moves its product-embedding service off torch.hub onto its own
trimmed-down ViT implementation (no xformers, no hub download at start-up).  The engineer writes the
weight port for DINOv2 ViT-g/14 (1.1B parameters, float32 as released: 4.2 GiB) on a workstation with
an RTX A5000 (24 GB): load the hub model, rename the keys, split the fused qkv into q/k/v, load them
into the new model, and check that both give the same embeddings on a few real product photos:

    ref_model = torch.hub.load("facebookresearch/dinov2", "dinov2_vitg14").cuda().eval()
    model = ProductViT(depth=40, dim=1536, heads=24, ffn="swiglu").cuda().eval()
    model.load_state_dict(convert(ref_model.state_dict()))
    pixels = preprocess(photos).cuda()                      # 8 photos at 518x518, as the service does
    ref = ref_model.forward_features(pixels)["x_norm_clstoken"]
    out = model(pixels)
    print((ref - out).abs().max())

Both models are in eval mode, but the check runs with autograd on (nothing says torch.no_grad, and the
weights require grad as loaded), so the forward pass keeps every block's activations for a backward pass
that never comes.  Without xformers DINOv2's attention is eager: a block keeps ~4.4 GB for 8 images
(24 heads x 1370^2 attention weights and softmax, 180 MB each per image, plus the MLP's SwiGLU).  The two
models take 8.5 GiB, the context 0.5; the reference model's forward fails in its 4th block.

An expert: a parity check is inference -- wrap it in torch.inference_mode() (or no_grad): the activations
then live one block at a time (peak ~3 GB in attention for 8 images) and the check fits with room to
spare.  Wrong first advice: a smaller batch (with autograd on, even one image keeps ~22 GB over 40
blocks: it still fails), gradient checkpointing (there is no training), mixed precision (a port is checked
in float32: autocast would blur the very differences the check looks for), flash attention alone (the
graph still holds ~1.2 GB a block), expandable_segments or empty_cache (the activations are live),
quantization, CPU offload or a bigger GPU.  Freeing the reference model after computing its outputs
(one model at a time) is a fine second step, not the fix.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

nn = torch.nn
f32 = torch.float32
DIM, HEADS, DEPTH, HIDDEN, PATCH = 1536, 24, 40, 4096, 14


def _record(out, *inputs):
    """(simulation) what autograd keeps for an op when grad mode is on: the tensors it saved for backward,
    through which the whole graph of the pass stays alive; nothing under no_grad / inference_mode."""
    if torch.is_grad_enabled():
        out._saved = inputs
        return torch._derive(out, *inputs)
    return out


def act(n_floats, *inputs):
    return _record(torch.empty(n_floats, dtype=f32, device="cuda"), *inputs)


def param(n_floats):
    return nn.Parameter(torch.empty(n_floats, dtype=f32, device="cuda"))


# ---- facebookresearch/dinov2 (dinov2/layers/*.py, dinov2/models/vision_transformer.py), float32 ----
class Attention(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.qkv_w, self.qkv_b = param(dim * 3 * dim), param(3 * dim)
        self.proj_w, self.proj_b = param(dim * dim), param(dim)
        self.heads = heads

    def forward(self, x, B, N):
        self.qkv_w, self.proj_w                                   # read: the pass uses them
        qkv = act(B * N * 3 * DIM, x)
        attn = act(B * self.heads * N * N, qkv)                  # q @ k.transpose(-2, -1) * scale
        attn = act(B * self.heads * N * N, attn)                 # attn.softmax(dim=-1)
        y = act(B * N * DIM, attn, qkv)                          # attn @ v
        return act(B * N * DIM, y)                               # proj


class SwiGLUFFN(nn.Module):
    def __init__(self, dim, hidden):
        nn.Module.__init__(self)
        self.w12_w, self.w12_b = param(dim * 2 * hidden), param(2 * hidden)
        self.w3_w, self.w3_b = param(hidden * dim), param(dim)

    def forward(self, x, B, N):
        self.w12_w, self.w3_w
        x12 = act(B * N * 2 * HIDDEN, x)
        hidden = act(B * N * HIDDEN, x12)                        # F.silu(x1) * x2
        hidden = act(B * N * HIDDEN, hidden, x12)
        return act(B * N * DIM, hidden)


class Block(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.norm1, self.norm2 = param(2 * DIM), param(2 * DIM)
        self.ls1, self.ls2 = param(DIM), param(DIM)
        self.attn = Attention(DIM, HEADS)
        self.mlp = SwiGLUFFN(DIM, HIDDEN)

    def forward(self, x, B, N):
        h = act(B * N * DIM, x)                                  # norm1
        h = self.attn(h, B, N)
        x = act(B * N * DIM, act(B * N * DIM, h), x)             # x + ls1(attn(norm1(x)))
        h = act(B * N * DIM, x)                                  # norm2
        h = self.mlp(h, B, N)
        return act(B * N * DIM, act(B * N * DIM, h), x)          # x + ls2(mlp(norm2(x)))


class DinoVisionTransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embed = param(3 * PATCH * PATCH * DIM + DIM)
        self.cls_token = param(DIM)
        self.pos_embed = param(1370 * DIM)
        self.mask_token = param(DIM)
        for i in range(DEPTH):
            setattr(self, "blocks_%d" % i, Block())
        self.norm = param(2 * DIM)

    def forward_features(self, x):
        B = x.nbytes // (3 * 518 * 518 * 4)
        N = (518 // PATCH) ** 2 + 1
        t = act(B * N * DIM, x)                                  # patch_embed + cls + pos_embed
        for i in range(DEPTH):
            t = getattr(self, "blocks_%d" % i)(t, B, N)
        t = act(B * N * DIM, t)                                  # norm
        return {"x_norm_clstoken": act(B * DIM, t), "x_norm_patchtokens": t}


def hub_load(repo, name):
    """torch.hub.load("facebookresearch/dinov2", "dinov2_vitg14"): the released float32 weights."""
    return DinoVisionTransformer()


# ---- the team's own implementation (product_vit/model.py) ----
class ProductViTLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.ln_1, self.ln_2 = param(2 * DIM), param(2 * DIM)
        self.q, self.k, self.v = param(DIM * DIM + DIM), param(DIM * DIM + DIM), param(DIM * DIM + DIM)
        self.out = param(DIM * DIM + DIM)
        self.scale_1, self.scale_2 = param(DIM), param(DIM)
        self.fc_in, self.fc_out = param(DIM * 2 * HIDDEN + 2 * HIDDEN), param(HIDDEN * DIM + DIM)


class ProductViT(nn.Module):
    def __init__(self, depth=DEPTH):
        nn.Module.__init__(self)
        self.embed = param(3 * PATCH * PATCH * DIM + DIM + DIM + 1370 * DIM)
        for i in range(depth):
            setattr(self, "layer_%d" % i, ProductViTLayer())
        self.ln_f = param(2 * DIM)

    def forward(self, pixels):
        B = pixels.nbytes // (3 * 518 * 518 * 4)
        N = (518 // PATCH) ** 2 + 1
        t = act(B * N * DIM, pixels, self.embed)
        for i in range(DEPTH):
            lyr = getattr(self, "layer_%d" % i)
            h = act(B * N * DIM, t, lyr.ln_1)
            q, k, v = (act(B * N * DIM, h, w) for w in (lyr.q, lyr.k, lyr.v))
            a = act(B * HEADS * N * N, q, k)
            a = act(B * HEADS * N * N, a)
            h = act(B * N * DIM, act(B * N * DIM, a, v), lyr.out)
            t = act(B * N * DIM, act(B * N * DIM, h, lyr.scale_1), t)
            h = act(B * N * 2 * HIDDEN, act(B * N * DIM, t, lyr.ln_2), lyr.fc_in)
            h = act(B * N * DIM, act(B * N * HIDDEN, h), lyr.fc_out)
            t = act(B * N * DIM, act(B * N * DIM, h, lyr.scale_2), t)
        return act(B * DIM, act(B * N * DIM, t, self.ln_f))


def convert(sd):
    """Key renames, and blocks.N.attn.qkv.weight split into three views (chunk along dim 0)."""
    return dict(("converted." + k, v) for k, v in sd.items())


def preprocess(paths):
    """8 product photos, resized to 518x518, normalized, float32 NCHW."""
    return torch.empty(len(paths) * 3 * 518 * 518, dtype=f32, device="cuda")


photos = ["qa_set/%s.jpg" % sku for sku in ("4711-01", "4711-02", "5820-11", "6003-07", "6003-08",
                                            "7112-40", "7301-02", "9914-55")]
try:
    ref_model = hub_load("facebookresearch/dinov2", "dinov2_vitg14").cuda().eval()
    model = ProductViT().cuda().eval()
    model.load_state_dict(convert(ref_model.state_dict()), strict=False)
    print("both models on the GPU: %.2f GiB" % (torch.cuda.memory_allocated() / 2.0 ** 30))
    pixels = preprocess(photos)
    ref = ref_model.forward_features(pixels)["x_norm_clstoken"]
    out = model(pixels)
    print("max abs diff", 0.0)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
