"""bench_zoo.py -- a model-selection memo needs inference throughput of nine large timm backbones with
torch.compile on the team's RTX 4090 (24 GB), PyTorch 2.1.2.  One script loops over the models; each is
created, moved to the GPU, compiled, warmed up, timed under bf16 autocast and inference_mode, then
"freed" before the next:

    for name in MODELS:
        model = timm.create_model(name, pretrained=True).cuda().eval()
        compiled = torch.compile(model)                      # inductor, default mode
        x = torch.randn(32, 3, res, res, device="cuda")
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(WARMUP): compiled(x)
            ... timed loop ...
        del compiled, model, x
        gc.collect()
        torch.cuda.empty_cache()

Each model alone fits (the eighth, ViT-bigG/14's image tower, is 1.84B parameters: 6.9 GiB in fp32; the
last, EVA02-E/14, 4.35B: 16.2 GiB).
But del does not free a compiled model: dynamo installs its compiled code on the bytecode of the model's
forward (the cache entries live on the code object, shared by every instance of the class), and each entry
keeps the traced GraphModule, which holds the model's parameters, alive after the script drops every
reference of its own (pytorch/pytorch#104095, #105181; torch._dynamo.reset() is the documented workaround).
So every model of the sweep stays on the GPU: after seven models 16.6 GiB of parameters that nothing in the
script can reach are resident, empty_cache has nothing to give back, and the eighth model's .cuda() fails
part-way through its 6.9 GiB copy, at a 141 MiB parameter, on a 24 GB card that would hold it three times.

An expert: the previous models are alive, held by torch.compile's (dynamo's) cache, not by the script;
call torch._dynamo.reset() after each model (before gc.collect / empty_cache), or run each model of the
sweep in its own subprocess (which also keeps one model's compile state out of the next one's timings).
Wrong first advice: empty_cache (the script already calls it: the memory is live tensors, not cache),
expandable_segments (nothing is fragmented), a smaller batch or mixed precision (the failure is in .cuda(),
before any activation; autocast is already on), inference_mode (already on), quantizing or offloading the
models, a bigger GPU (the sweep grows without bound: 40 models will fill any card), gradient checkpointing.
"""
import gc
import sys
import time
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.compile and torch._dynamo (PyTorch 2.1).  Dynamo's per-code cache is a C-level
# extra on the code object in PyTorch; the stand-in keeps it in a dict of its own module keyed by the code
# object, with the same lifetime: until torch._dynamo.reset().  Compiled under torch's own file names so
# that the frames are torch's.
_DYNAMO = """
import torch

_code_cache = {}          # code object of the compiled frame -> [CacheEntry], newest first


class GraphModule(torch.nn.Module):
    '''torch.fx.GraphModule as dynamo's OutputGraph builds it: the traced module's parameters become
    attributes of the graph module (the same tensors, not copies).'''

    def __init__(self, root):
        torch.nn.Module.__init__(self)
        for i, p in enumerate(root.parameters()):
            setattr(self, "L__self___param_%d" % i, p)


class CacheEntry(object):
    def __init__(self, check_fn, code, graph_module):
        self.check_fn = check_fn
        self.code = code
        self.graph_module = graph_module


def _compile_frame(mod):
    gm = GraphModule(mod)
    code = type(mod).forward.__code__
    guard = ("___check_obj_id", id(mod))
    _code_cache.setdefault(code, []).insert(0, CacheEntry(guard, code, gm))
    return gm


class OptimizedModule(torch.nn.Module):
    def __init__(self, mod, backend="inductor", mode=None):
        torch.nn.Module.__init__(self)
        self._orig_mod = mod
        self._compiled = False

    def forward(self, *args, **kwargs):
        if not self._compiled:
            _compile_frame(self._orig_mod)
            self._compiled = True
        return self._orig_mod(*args, **kwargs)


def reset():
    '''torch._dynamo.reset(): drop every compiled artifact and cache entry.'''
    _code_cache.clear()
"""
_dynamo = types.ModuleType("torch._dynamo")
_dynamo.__file__ = torch.__file__.replace("__init__.py", "_dynamo/eval_frame.py")
exec(compile(_DYNAMO, _dynamo.__file__, "exec"), _dynamo.__dict__)
sys.modules["torch._dynamo"] = _dynamo
torch._dynamo = _dynamo

_COMPILE = """
def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,
            disable=False):
    from torch._dynamo import OptimizedModule
    return OptimizedModule(model, backend=backend, mode=mode)


def randn(*size, dtype=None, device=None):
    n = 1
    for s in size:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)
"""
_ns = {"torch": torch}
exec(compile(_COMPILE, torch.__file__, "exec"), _ns)
torch.compile = _ns["compile"]
if not hasattr(torch, "randn"):
    torch.randn = _ns["randn"]

# ---- stand-in gap: timm.create_model(pretrained=True) builds the model on the CPU and loads the weights
# there; .cuda() copies each parameter to the GPU (a new device tensor per parameter, fp32)
MODELS = [  # name, parameters, input resolution, tokens, width, depth (blocks)
    ("vit_large_patch16_384.augreg_in21k_ft_in1k", 304_715_752, 384, 577, 1024, 24),
    ("convnext_xlarge.fb_in22k_ft_in1k_384", 350_196_968, 384, 2304, 512, 36),
    ("eva02_large_patch14_448.mim_m38m_ft_in22k_in1k", 305_080_232, 448, 1025, 1024, 24),
    ("vit_huge_patch14_clip_336.laion2b_ft_in12k_in1k", 632_459_752, 336, 577, 1280, 32),
    ("convnext_xxlarge.clip_laion2b_soup_ft_in1k", 846_470_504, 256, 1024, 768, 36),
    ("vit_giant_patch14_clip_224.laion2b", 1_012_652_160, 224, 257, 1408, 40),
    ("eva_giant_patch14_336.clip_ft_in1k", 1_013_005_672, 336, 577, 1408, 40),
    ("vit_gigantic_patch14_clip_224.laion2b", 1_844_906_496, 224, 257, 1664, 48),
    ("eva02_enormous_patch14_clip_224.laion2b", 4_350_559_232, 224, 257, 1792, 64),
]


class _Block(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self._n = n
        self.weight = None

    def _to_cuda(self):
        self.weight = torch.nn.Parameter(torch.empty(self._n, dtype=torch.float32, device="cuda"))


class TimmModel(torch.nn.Module):
    def __init__(self, name, params, res, tokens, width, depth):
        torch.nn.Module.__init__(self)
        self.name, self.res, self.tokens, self.width, self.depth = name, res, tokens, width, depth
        per = params // (depth + 2)
        self.patch_embed = _Block(per)
        for i in range(depth):
            setattr(self, "blocks_%d" % i, _Block(per))
        self.head = _Block(params - per * (depth + 1))

    def cuda(self, device=None):
        for m in self.modules():
            if isinstance(m, _Block):
                m._to_cuda()
        return self

    def forward(self, x):
        # bf16 activations of the batch, block by block (the compiled graph reuses its buffers)
        n = x.nbytes // (3 * self.res * self.res * 4)
        h = torch.empty(n * self.tokens * self.width, dtype=torch.bfloat16, device="cuda")
        for i in range(self.depth):
            mlp = torch.empty(n * self.tokens * self.width * 4, dtype=torch.bfloat16, device="cuda")
            del mlp
        del h
        return torch.empty(n * 1000, dtype=torch.float32, device="cuda")


def create_model(name, pretrained=False):
    for row in MODELS:
        if row[0] == name:
            return TimmModel(*row)
    raise RuntimeError("Unknown model (%s)" % name)


WARMUP, ITERS, BATCH = 10, 50, 32


def main():
    results = []
    for name, _, res, _, _, _ in MODELS:
        model = create_model(name, pretrained=True).cuda().eval()
        nparams = sum(p.nbytes for p in model.parameters()) // 4
        compiled = torch.compile(model)
        x = torch.randn(BATCH, 3, res, res, device="cuda")
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(WARMUP):
                compiled(x)
            t0 = time.time()
            for _ in range(ITERS):
                compiled(x)
            dt = time.time() - t0
        results.append((name, nparams, BATCH * ITERS / max(dt, 1e-9)))
        print("%-50s %6.0fM params  done" % (name, nparams / 1e6))
        del compiled, model, x
        gc.collect()
        torch.cuda.empty_cache()
    for r in results:
        print("%-50s %6.0fM  %.0f img/s" % r)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
