"""extract_feats.py -- layer-wise probing of DINOv2 ViT-L/14: I want to train linear (and later patch-level)
probes on every one of the 24 blocks, so I register a forward hook on each block and collect what it
returns over the probe set, then torch.cat and torch.save everything at the end.  A100 40 GB, batch 64:

    features = defaultdict(list)
    def save_output(name):
        def hook(module, inputs, output):
            features[name].append(output)        # all 257 tokens; I'll .cpu() them when I save
        return hook
    for i, blk in enumerate(model.blocks):
        blk.register_forward_hook(save_output(f"block{i:02d}"))
    model.eval()
    with torch.no_grad():
        for images, _ in loader:                  # 224 px, 12,800 images (200 batches)
            model(images.cuda(non_blocking=True))
    torch.save({k: torch.cat(v).cpu() for k, v in features.items()}, "feats.pt")

It dies with CUDA out of memory after about twenty batches, inside a block's attention.  A single batch
uses ~2 GB.

What an expert sees: the hooks keep every block's output (64 x 257 x 1024 fp32 = 64 MiB per block, 1.5 GiB
per batch over 24 blocks) in a global dict on the GPU, batch after batch, so memory rises linearly with the
batches until the card is full; the model (1.1 GiB) and one batch's temporaries are small.  The fix: do
not keep the outputs on the GPU across batches -- in the hook, take what the probe needs (the CLS token,
or pooled patch tokens) and move it to the CPU (`output[:, 0].detach().cpu()`), or write each batch's
features out to a memory-mapped file / shards as you go.  no_grad is already on, so inference_mode saves
nothing; a smaller batch, fp16 or a bigger card only delays the same failure (200 batches need ~300 GiB).
Not fragmentation and not the allocator's cache: every byte is live.
"""
import collections
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# The stand-in torch.nn.Module has no forward hooks: Module.register_forward_hook and the hook call at the end
# of Module._call_impl, as PyTorch's torch/nn/modules/module.py runs them (compiled as that file, so the
# failing stack shows torch's frames where PyTorch's does).  Test scaffolding, not the user's program.
_HOOKS = '''
def register_forward_hook(self, hook):
    hooks = self.__dict__.setdefault("_forward_hooks", collections.OrderedDict())
    hooks[len(hooks)] = hook
    return len(hooks) - 1

def _call_impl(self, *args, **kwargs):
    result = _plain_call_impl(self, *args, **kwargs)
    for hook in self.__dict__.get("_forward_hooks", {}).values():
        hook_result = hook(self, args, result)
        if hook_result is not None:
            result = hook_result
    return result
'''
_ns = {"collections": collections, "_plain_call_impl": nn.Module._call_impl}
exec(compile(_HOOKS, sys.modules[nn.Module.__module__].__file__, "exec"), _ns)
nn.Module.register_forward_hook = _ns["register_forward_hook"]
nn.Module._call_impl = _ns["_call_impl"]


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in has none): submodules registered under "0", "1", ..."""

    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Linear(nn.Module):
    """torch.nn.Linear: weight out x in, bias; the output is rows x out of the input's dtype (fp32)."""

    def __init__(self, fin, fout):
        nn.Module.__init__(self)
        self.fout = fout
        self.weight = nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))
        self.bias = nn.Parameter(torch.empty(fout * 4, device="cuda"))

    def forward(self, x, rows):
        return torch.empty(rows * self.fout * 4, device="cuda")


class Attention(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.heads = heads
        self.qkv = Linear(dim, dim * 3)
        self.proj = Linear(dim, dim)

    def forward(self, x, batch, tokens):
        qkv = self.qkv(x, batch * tokens)
        attn = torch.empty(batch * self.heads * tokens * tokens * 4, device="cuda")    # softmax(q @ k^T)
        ctx = torch.empty(batch * tokens * (qkv.nbytes // (batch * tokens * 3)), device="cuda")
        del attn, qkv
        return self.proj(ctx, batch * tokens)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        nn.Module.__init__(self)
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)

    def forward(self, x, rows):
        h = self.fc1(x, rows)
        return self.fc2(h, rows)


class Block(nn.Module):
    def __init__(self, dim=1024, heads=16):
        nn.Module.__init__(self)
        self.norm1 = Linear(1, dim)      # LayerNorm weight and bias (dim each)
        self.attn = Attention(dim, heads)
        self.norm2 = Linear(1, dim)
        self.mlp = Mlp(dim, dim * 4)

    def forward(self, x, batch, tokens):
        a = self.attn(x, batch, tokens)
        m = self.mlp(a, batch * tokens)
        del a
        return m                          # x + attn, + mlp: a new (batch, tokens, dim) tensor


class DinoVisionTransformer(nn.Module):
    def __init__(self, depth=24, dim=1024, heads=16, patch=14):
        nn.Module.__init__(self)
        self.patch_embed = nn.Conv2d(3, dim, patch, stride=patch, device="cuda")
        self.cls_token = nn.Parameter(torch.empty(dim * 4, device="cuda"))
        self.pos_embed = nn.Parameter(torch.empty(257 * dim * 4, device="cuda"))
        self.blocks = ModuleList([Block(dim, heads) for _ in range(depth)])
        self.norm = Linear(1, dim)
        self.dim = dim

    def forward(self, images, batch):
        tokens = 257                      # 16 x 16 patches + CLS at 224 px
        x = torch.empty(batch * tokens * self.dim * 4, device="cuda")   # patch_embed + cls + pos_embed
        for blk in self.blocks:
            x = blk(x, batch, tokens)
        return self.norm(x, batch * tokens)


features = collections.defaultdict(list)


def save_output(name):
    def hook(module, inputs, output):
        features[name].append(output)        # all 257 tokens; I'll .cpu() them when I save
    return hook


def main():
    batch_size = 64
    model = DinoVisionTransformer()           # torch.hub.load("facebookresearch/dinov2", "dinov2_vitl14")
    model.cuda()
    for i, blk in enumerate(model.blocks):
        blk.register_forward_hook(save_output("block%02d" % i))
    model.eval()
    n_batches = 12800 // batch_size
    with torch.no_grad():
        for step in range(n_batches):
            images = torch.empty(batch_size * 3 * 224 * 224 * 4, device="cuda")   # images.cuda(non_blocking=True)
            model(images, batch_size)
            del images
    print("collected", len(features), "layers")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
