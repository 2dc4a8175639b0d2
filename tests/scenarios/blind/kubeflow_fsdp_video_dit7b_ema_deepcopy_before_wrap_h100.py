"""A 7.3B-parameter video diffusion transformer (40 DiT blocks, diffusers-style, latents and text embeddings
precomputed) trained with FSDP FULL_SHARD on 8 H100 80GB: a Kubeflow PyTorchJob of 8 worker pods with one
GPU each (PyTorch 2.5.1; rank 0 shown).  The training script follows the DiT repository's recipe and keeps an
EMA of the weights for sampling:

    model = VideoDiT(depth=40, hidden=2880).to(device)                 # fp32, 27.2 GiB
    model.enable_gradient_checkpointing()
    ema = deepcopy(model).requires_grad_(False)                         # the EMA, made before wrapping
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({DiTBlock}), sharding_strategy=FULL_SHARD,
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16), device_id=device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    for latents, text_emb, t in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = diffusion_loss(model, latents, text_emb, t)
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)
        update_ema(ema, model)

FSDP shards the model -- each rank keeps 1/8 of the fp32 weights (3.4 GiB) and will keep 1/8 of the
gradients and of AdamW's moments -- but the EMA was deep-copied from the unwrapped model, so every rank
holds a full, unsharded fp32 copy of all 7.3B weights: 27.2 GiB, a third of the card.  The first forward
pass (checkpointed blocks keep 1.25 GiB of inputs each at this clip length and batch) runs out in its 35th
block.  Without the replicated EMA the whole step, optimizer state included, would peak near 60 GiB.

An expert: the second copy of the weights is the problem, not the activations -- shard the EMA like the
model (make it after wrapping, from each rank's own shard: an EMA of the flat parameters, updated locally,
gathered only when sampling or saving), or keep it in host memory and update it every few steps.
Activation checkpointing and bf16 autocast are already on; a smaller batch or clip would hide the copy at
the price of throughput; FSDP is already there (the EMA is what escaped it).
"""
import copy
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

rank = int(os.environ.get("RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
local_rank = int(os.environ.get("LOCAL_RANK", "0"))

# FullyShardedDataParallel as far as memory goes (the stand-in torch has no FSDP): a wrapped unit keeps a
# flat 1/world shard of its fp32 parameters (the full ones are freed) and gathers its full parameters in
# the compute dtype for its forward, freed again after it (reshard_after_forward).  Built from a source
# text under torch's own path, so its frames are torch's as in PyTorch.
_FSDP_SRC = '''
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter


class FullyShardedDataParallel(Module):
    def __init__(self, module, world_size, auto_wrap_policy=(), param_dtype_bytes=2, device_id=None):
        Module.__init__(self)
        for name, child in list(module._modules.items()):
            if type(child).__name__ in auto_wrap_policy:
                module._modules[name] = FullyShardedDataParallel(child, world_size, (), param_dtype_bytes)
        self._fsdp_wrapped_module = module
        full = 0
        for k, p in list(module._parameters.items()):
            if p is not None:
                full += p.nbytes
                module._parameters[k] = None
        self._full_bytes = full
        self._unshard_bytes = full // 4 * param_dtype_bytes
        self.flat_param = Parameter(empty(max(full // world_size, 512), device=device_id)) if full else None

    def forward(self, *args, **kwargs):
        gathered = empty(self._unshard_bytes, device=None) if self._full_bytes else None    # all-gather
        out = self._fsdp_wrapped_module(*args, **kwargs)
        del gathered                                    # reshard (post-forward: not reached when it raises)
        return out
'''
_fsdp_ns = {"empty": torch.empty}
exec(compile(_FSDP_SRC, os.path.join(os.path.dirname(torch.__file__), "distributed", "fsdp",
                                     "fully_sharded_data_parallel.py"), "exec"), _fsdp_ns)
FSDP = _fsdp_ns["FullyShardedDataParallel"]


def nccl_library():
    for d in (os.environ.get("SCEN_KIT_LIB", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib")):
        p = os.path.join(d, "libnccl.so.2")
        if d and os.path.exists(p):
            return ctypes.CDLL(p)
    raise SystemExit("libnccl.so.2 stand-in not found")


class DiTBlock(torch.nn.Module):
    """Self-attention, cross-attention to the text, MLP, adaLN modulation: 182M parameters (695 MiB fp32)."""

    def __init__(self, hidden=2880):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(4 * hidden * hidden * 4, device="cuda"))
        self.cross_attn = torch.nn.Parameter(torch.empty(4 * hidden * hidden * 4, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(8 * hidden * hidden * 4, device="cuda"))
        self.adaLN_modulation = torch.nn.Parameter(torch.empty(6 * hidden * hidden * 4, device="cuda"))

    def forward(self, x, c):
        attn = torch.empty(2048 * MiB, device="cuda")          # attention / MLP transients of this block
        out = torch.empty(x.nbytes, device="cuda")
        del attn
        return out


class VideoDiT(torch.nn.Module):
    def __init__(self, depth=40, hidden=2880):
        torch.nn.Module.__init__(self)
        self.depth = depth
        self.x_embedder = torch.nn.Parameter(torch.empty(16 * 2 * 2 * hidden * 4, device="cuda"))
        self.t_embedder = torch.nn.Parameter(torch.empty(256 * hidden * 4 + hidden * hidden * 4, device="cuda"))
        for i in range(depth):
            setattr(self, "block%d" % i, DiTBlock(hidden))
        self.final_layer = torch.nn.Parameter(torch.empty(hidden * 64 * 4, device="cuda"))
        self.gradient_checkpointing = False

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, latents, text_emb, t):
        x = torch.empty(1280 * MiB, device="cuda")             # patchified latent tokens, bf16
        saved = []
        for i in range(self.depth):
            block = getattr(self, "block%d" % i)
            if self.gradient_checkpointing and torch.is_grad_enabled():
                saved.append(x)                                   # checkpoint: the block's input is kept
            x = block(x, text_emb)
        out = torch.empty(latents.nbytes, device="cuda")
        out._saved = saved
        return out


def diffusion_loss(model, latents, text_emb, t):
    noise = torch.empty(latents.nbytes, device="cuda")
    pred = model(latents, text_emb, t)
    return torch.nn.functional.nll_loss(pred, noise)


def update_ema(ema_model, model, decay=0.9999):
    with torch.no_grad():
        for e, p in zip(ema_model.parameters(), model.parameters()):
            pass                                          # e.mul_(decay).add_(p, alpha=1 - decay)

torch.cuda.set_device(local_rank)
nccl = nccl_library()
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
if nccl.nccl_comm_init_rank(world, rank, 4 * MiB, 32) != 0:
    raise RuntimeError("NCCL error")

try:
    model = VideoDiT(depth=40, hidden=2880)
    model.enable_gradient_checkpointing()
    ema = copy.deepcopy(model)
    for p in ema.parameters():
        p.requires_grad_(False)
    model = FSDP(model, world, auto_wrap_policy=("DiTBlock",), param_dtype_bytes=2, device_id=local_rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)
    for step in range(2):
        latents = torch.empty(160 * MiB, device="cuda")         # 4 clips of 32 x 64 x 64 x 16 latents, fp32
        text_emb = torch.empty(4 * 300 * 4096 * 2, device="cuda")   # T5 embeddings, bf16
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = diffusion_loss(model, latents, text_emb, step)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        update_ema(ema, model)
        del loss
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
