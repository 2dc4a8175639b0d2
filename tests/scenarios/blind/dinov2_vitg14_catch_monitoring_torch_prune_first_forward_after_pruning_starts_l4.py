"""train_prune.py -- an electronic-monitoring team classifies fish species on trawler deck cameras.  The
model must run on the boat's Jetson, so they fine-tune DINOv2 ViT-g/14 (1.1B parameters, float32 master
weights, 4.2 GiB) with gradual magnitude pruning (Zhu & Gupta's cubic schedule, 0 -> 70% of the block
Linear weights, pruning every 50 steps from step 50 in this first short run that checks the schedule),
on a rented L4 (24 GB, 22 GiB usable):

    model.set_grad_checkpointing(True); optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for step, (images, labels) in enumerate(loader, 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step >= 50 and step % 50 == 0:
            for m in prunable:                          # the 160 nn.Linear of the 40 blocks
                prune.l1_unstructured(m, "weight", amount=sparsity(step))

Steps 1..50 run at 19-20 GiB (weights 4.2 + AdamW 8.5 + gradients 4.2 + checkpointed block inputs 1.9
GiB).  torch.nn.utils.prune does not zero weights: it re-parametrizes every pruned Linear as weight_orig
(the Parameter, still trained), a float32 weight_mask buffer of the same size, and a plain `weight`
attribute recomputed as weight_orig * weight_mask by a forward pre-hook each call (and kept on the
module between calls).  The first pruning call goes through (12.7 -> 21.2 GiB at rest: two more copies
of every pruned weight, 8.5 GiB); the forward pass of step 51 then fails in its first blocks.

An expert: the failure is in a forward pass, but not because of the batch: memory stepped up by two
weight-sized copies at the pruning step.  Make the masks cheap and in place instead of the
re-parametrization: compute each mask (as bool, 1 byte/elem), zero the weights with weight.mul_(mask)
and call prune.remove() right away (or keep the bool masks and re-apply them in place after every
optimizer.step()), so that pruning costs at most a bool mask per weight.  An 8-bit AdamW would free
most of it but leaves the waste.  The 0.4 GiB cached in pieces at the failure is the pruning call's
freed temporaries: not fragmentation (the backward pass would need 4.2 GiB of gradients on top).  Wrong first advice: a smaller batch (activations are 2 GiB of the
22, already checkpointed), gradient checkpointing or autocast (both on), inference_mode (it is training),
expandable_segments or empty_cache (the copies are live), a bigger GPU first.
"""
import collections
import sys

import torch
import torch.nn.functional as F
from torch.autograd import _graph

import scen_truth

scen_truth.note_every_empty(torch)

# --------------------------------------------------------------------------------------------------
# stand-in gap: the stand-in torch has no shapes, nn.Linear, forward pre-hooks, autocast weight cache,
# torch.utils.checkpoint or torch.nn.utils.prune.  Written here as PyTorch lays them out, allocating what
# PyTorch's allocate; numbers of elements are kept in `numel`.
_ISZ = {"float32": 4, "bfloat16": 2, "float16": 2, "uint8": 1}


def _new(numel, dtype="float32"):
    t = torch.empty(numel, dtype=dtype, device="cuda")
    t.numel_ = numel
    return t


def _numel(t):
    return getattr(t, "numel_", None) or getattr(t._root(), "numel_", t.nbytes // _ISZ[t.dtype])


def ones_like(t):
    return _new(_numel(t), t.dtype)


def _abs(t):
    return _graph.derive(_new(_numel(t), t.dtype), t)


Topk = collections.namedtuple("Topk", "values indices")


def _topk(t, k, largest=True):
    return Topk(_new(k, t.dtype), _new(k * 8, "uint8"))          # values, int64 indices


def _mul(a, b):
    return _graph.derive(_new(_numel(a), a.dtype), a, b)


torch.ones_like = ones_like
torch.contiguous_format = "contiguous_format"
torch.abs = _abs
torch.topk = _topk
torch.Tensor.__mul__ = _mul
torch.Tensor.__setitem__ = lambda self, idx, value: None                    # in place
torch.Tensor.to = lambda self, dtype=None, **kw: self if dtype in (None, self.dtype) else _new(_numel(self), dtype)

_cast_cache = {}                   # autocast's cache of the low-precision copies of leaf weights
_plain_exit = torch.autocast.__exit__


def _autocast_exit(self, *exc):
    r = _plain_exit(self, *exc)
    if not torch.is_autocast_enabled():
        _cast_cache.clear()        # cleared when the outermost autocast region ends
    return r


torch.autocast.__exit__ = _autocast_exit


def _autocast_weight(w):
    if not torch.is_autocast_enabled():
        return w
    if isinstance(w, torch.nn.Parameter) and w.requires_grad:
        c = _cast_cache.get(id(w))
        if c is None:
            c = _cast_cache[id(w)] = _new(_numel(w), "bfloat16")
        return c
    return _new(_numel(w), "bfloat16")    # a non-leaf weight is cast anew on every call


_plain_call = torch.nn.Module._call_impl


def _call_impl(self, *args, **kwargs):
    for hook in list(self.__dict__.get("_forward_pre_hooks", {}).values()):
        hook(self, args)
    return _plain_call(self, *args, **kwargs)


def register_forward_pre_hook(self, hook):
    hooks = self.__dict__.setdefault("_forward_pre_hooks", collections.OrderedDict())
    hooks[id(hook)] = hook
    return hook


def register_parameter(self, name, param):
    self._parameters[name] = param


torch.nn.Module._call_impl = _call_impl
torch.nn.Module.register_forward_pre_hook = register_forward_pre_hook
torch.nn.Module.register_parameter = register_parameter


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(_new(in_features * out_features))
        if bias:
            self.bias = torch.nn.Parameter(_new(out_features))

    def forward(self, x):
        w = _autocast_weight(self.weight)
        out = _new(x.tokens * self.out_features, "bfloat16" if torch.is_autocast_enabled() else "float32")
        out.tokens = x.tokens
        if torch.is_grad_enabled():
            out._saved, out._saved_weight = x, w      # saved for backward
        del w
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weight = torch.nn.Parameter(_new(dim))
        self.bias = torch.nn.Parameter(_new(dim))

    def forward(self, x):
        out = _new(x.tokens * self.dim)               # layer_norm runs in float32 under autocast
        out.tokens = x.tokens
        if torch.is_grad_enabled():
            out._saved = x
        return out


torch.nn.Linear = Linear
torch.nn.LayerNorm = LayerNorm


def checkpoint(function, x, use_reentrant=False):
    """torch.utils.checkpoint.checkpoint: the block runs without saving its activations; its input is
    kept for the recomputation in backward, and its output depends on the block's parameters."""
    with torch.no_grad():
        out = function(x)
    out._saved = x
    out._params = _graph.merge(x._params, [p for p in function.parameters() if p.requires_grad])
    return out


class prune(object):
    """torch.nn.utils.prune, as torch/nn/utils/prune.py lays it out (L1Unstructured, its apply and hook)."""

    class L1Unstructured(object):
        PRUNING_TYPE = "unstructured"

        def __init__(self, amount):
            self.amount = amount

        def compute_mask(self, t, default_mask):
            nparams_toprune = round(self.amount * _numel(t))
            mask = default_mask.clone(memory_format=torch.contiguous_format)
            if nparams_toprune != 0:
                topk = torch.topk(torch.abs(t).view(-1), k=nparams_toprune, largest=False)
                mask.view(-1)[topk.indices] = 0
            return mask

        def apply_mask(self, module):
            orig = getattr(module, self._tensor_name + "_orig")
            mask = getattr(module, self._tensor_name + "_mask")
            return mask.to(dtype=orig.dtype) * orig

        def __call__(self, module, inputs):
            setattr(module, self._tensor_name, self.apply_mask(module))

        @classmethod
        def apply(cls, module, name, amount):
            method = cls(amount)
            method._tensor_name = name
            orig = getattr(module, name)
            importance_scores = orig
            module.register_parameter(name + "_orig", orig)
            del module._parameters[name]
            default_mask = torch.ones_like(orig)
            mask = method.compute_mask(importance_scores, default_mask=default_mask)
            module.register_buffer(name + "_mask", mask)
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
            return method

    @staticmethod
    def l1_unstructured(module, name, amount, importance_scores=None):
        prune.L1Unstructured.apply(module, name, amount=amount)
        return module
# --------------------------------------------------------------------------------------------------

EMBED, DEPTH, HEADS, FFN, CLASSES = 1536, 40, 24, 4096, 120
BATCH, TOKENS = 32, 257                        # 224 px / patch 14 = 16 x 16 patches + cls


class PatchEmbed(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.proj_weight = torch.nn.Parameter(_new(EMBED * 3 * 14 * 14))
        self.proj_bias = torch.nn.Parameter(_new(EMBED))

    def forward(self, images):
        x = _new(BATCH * TOKENS * EMBED, "bfloat16")
        x.tokens = BATCH * TOKENS
        return x


class Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = Linear(EMBED, 3 * EMBED)
        self.proj = Linear(EMBED, EMBED)

    def forward(self, x):
        qkv = self.qkv(x)
        o = _new(x.tokens * EMBED, "bfloat16")          # F.scaled_dot_product_attention (memory-efficient)
        o.tokens = x.tokens
        del qkv
        return self.proj(o)


class SwiGLUFFNFused(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w12 = Linear(EMBED, 2 * FFN)
        self.w3 = Linear(FFN, EMBED)

    def forward(self, x):
        x12 = self.w12(x)
        hidden = _new(x.tokens * FFN, "bfloat16")        # F.silu(x1) * x2
        hidden.tokens = x.tokens
        del x12
        return self.w3(hidden)


class NestedTensorBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.norm1 = LayerNorm(EMBED)
        self.attn = Attention()
        self.ls1_gamma = torch.nn.Parameter(_new(EMBED))
        self.norm2 = LayerNorm(EMBED)
        self.mlp = SwiGLUFFNFused()
        self.ls2_gamma = torch.nn.Parameter(_new(EMBED))

    def forward(self, x):
        a = self.attn(self.norm1(x))
        x = _new(x.tokens * EMBED)                       # x + ls1(attn), float32 residual stream
        x.tokens = a.tokens
        del a
        m = self.mlp(self.norm2(x))
        out = _new(x.tokens * EMBED)                     # x + ls2(mlp)
        out.tokens = x.tokens
        return out


class DinoVisionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = PatchEmbed()
        self.cls_token = torch.nn.Parameter(_new(EMBED))
        self.pos_embed = torch.nn.Parameter(_new(1370 * EMBED))
        self.blocks = torch.nn.Module()
        for i in range(DEPTH):
            setattr(self.blocks, str(i), NestedTensorBlock())
        self.norm = LayerNorm(EMBED)
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = enable

    def forward(self, images):
        x = self.patch_embed(images)
        x = _graph.derive(_new(BATCH * TOKENS * EMBED), x)     # cat(cls) + interpolated pos_embed
        x.tokens = BATCH * TOKENS
        for blk in self.blocks._modules.values():
            x = checkpoint(blk, x, use_reentrant=False) if self.grad_checkpointing else blk(x)
        return self.norm(x)


class FishClassifier(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = DinoVisionTransformer()         # torch.hub.load("facebookresearch/dinov2", "dinov2_vitg14")
        self.head = Linear(2 * EMBED, CLASSES)          # cls token + mean of patch tokens

    def forward(self, images):
        feats = self.backbone(images)
        pooled = _new(BATCH * 2 * EMBED)
        pooled.tokens = BATCH
        pooled._saved = feats
        pooled = _graph.derive(pooled, feats)
        return self.head(pooled)


def cubic_sparsity(step, start=50, end=1500, final=0.70):
    t = min(max((step - start) / float(end - start), 0.0), 1.0)
    return max(final * (1 - (1 - t) ** 3), 0.10)


def deck_camera_batches(n):
    for _ in range(n):
        images = _new(BATCH * 3 * 224 * 224)
        labels = _new(BATCH * 8, "uint8")
        yield images, labels


model = FishClassifier()
model.backbone.set_grad_checkpointing(True)
model.train()
prunable = [m for blk in model.backbone.blocks._modules.values()
            for m in (blk.attn.qkv, blk.attn.proj, blk.mlp.w12, blk.mlp.w3)]
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
try:
    for step, (images, labels) in enumerate(deck_camera_batches(2000), 1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(images)
            loss = F.cross_entropy(logits, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss
        if step % 10 == 0:
            print("step %d  allocated %.1f GiB  peak %.1f GiB" % (step, torch.cuda.memory_allocated() / 2**30,
                                                                 torch.cuda.max_memory_allocated() / 2**30))
        if step >= 50 and step % 50 == 0:
            amount = cubic_sparsity(step)
            for m in prunable:
                prune.l1_unstructured(m, "weight", amount=amount)
            print("pruned to %.0f%%, allocated %.1f GiB" % (100 * amount, torch.cuda.memory_allocated() / 2**30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
