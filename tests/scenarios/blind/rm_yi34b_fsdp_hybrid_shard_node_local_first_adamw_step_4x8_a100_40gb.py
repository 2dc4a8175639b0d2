"""train_rm.py -- reward model for RLHF on a Yi-34B backbone (score head on the last token, Bradley-Terry loss),
plain PyTorch FSDP on a Slurm cluster of 4 nodes x 8 A100-SXM4-40GB (EFA between nodes), torchrun on each
node, plain `LD_PRELOAD=liboomguard.so` in the environment.  To spare the slow inter-node network the config
was switched from FULL_SHARD to HYBRID_SHARD:

    model = FSDP(model, sharding_strategy=ShardingStrategy.HYBRID_SHARD,      # shard inside a node,
                 auto_wrap_policy=transformer_auto_wrap(LlamaDecoderLayer),   # replicate across nodes
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
                 device_id=torch.cuda.current_device())
    apply_activation_checkpointing(model, check_fn=is_decoder_layer)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-6)
    for batch in loader:                                 # one (chosen, rejected) pair, 2 x 2048 tokens
        loss = -F.logsigmoid(model(**batch)[0] - model(**batch)[1]).mean()
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Sizes per GPU.  33.9B parameters: 60 decoder layers of 558M (7168 hidden, 20480 MLP) and a 459M embedding.
HYBRID_SHARD shards each unit over the 8 GPUs of a node only, so every GPU keeps 1/8 of the model: fp32
parameter shards 15.8 GiB, fp32 gradient shards 15.8 GiB after backward, and AdamW's exp_avg + exp_avg_sq
31.6 GiB -- 63 GiB of state on a 40 GiB card.  The forward and backward fit (parameters + gradients + a
gathered layer, recomputed activations: ~37 GiB); the first optimizer.step() starts making AdamW's state
and fails after ~14 of the 61 units.  (This is rank 0, node 0; the other local ranks are on GPUs 1-7.)

What an expert says first: shard over all 32 GPUs -- FULL_SHARD (or hybrid with a larger shard group) cuts
the per-GPU state to 16 bytes x 33.9B / 32 = 15.8 GiB; the inter-node traffic is the price.  (CPU offload of
the optimizer also fits, slowly.)  Wrong advice: a smaller batch, shorter sequences, flash-attention or
checkpointing (activations are not the problem; the failure is in optimizer.step with one pair a batch and
checkpointing on), mixed precision (on), empty_cache / expandable_segments, and an 8-bit AdamW alone
(7.9 GiB of state against the ~7 GiB left).
"""
import ctypes
import os
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "32"))
LOCAL_WORLD_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", "8"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 7168, 20480, 60, 64000, 1024
LAYER_NUMEL = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * INTER + 2 * HIDDEN      # 557,856,768
ROOT_NUMEL = VOCAB * HIDDEN + 2 * HIDDEN                                                       # embed, norm, score
TOKENS = 2 * 2048


class FlatParameter(nn.Parameter):
    """torch.distributed.fsdp.FlatParameter: this rank's shard of a unit's parameters (fp32)."""


class FullyShardedDataParallel(nn.Module):
    """FSDP with sharding_strategy=HYBRID_SHARD: the shard group is the node (LOCAL_WORLD_SIZE GPUs), so each
    FlatParameter keeps 1/LOCAL_WORLD_SIZE of its unit; parameters are all-gathered in bf16 inside the node
    while the unit runs; in backward the bf16 gradient is reduce-scattered inside the node, all-reduced across
    the nodes and kept as an fp32 shard in flat_param.grad."""

    def __init__(self, module, numel, shard_group_size, root=False):
        nn.Module.__init__(self)
        self._fsdp_wrapped_module = module
        self._unsharded_numel = numel
        self.flat_param = FlatParameter(torch.empty((numel + shard_group_size - 1) // shard_group_size,
                                                    dtype=torch.float32, device="cuda"))
        self._full = None
        self._is_root = root

    def _unshard(self):
        if self._full is None:
            self._full = torch.empty(self._unsharded_numel, dtype=torch.bfloat16, device="cuda")

    def _reshard(self, force=False):
        if force or not self._is_root:
            self._full = None

    def forward(self, hidden):
        self._unshard()
        out = self._fsdp_wrapped_module(hidden)
        self._reshard()
        return out

    def _post_backward_hook(self, unsharded_grad):
        """reduce-scatter (node) + all-reduce (replicas) of the bf16 gradient, then its shard in fp32."""
        shard = torch.empty(self.flat_param.nbytes // 4, dtype=torch.bfloat16, device="cuda")
        del unsharded_grad
        if self.flat_param.grad is None:
            self.flat_param.grad = torch.empty(self.flat_param.nbytes // 4, dtype=torch.float32, device="cuda")
        del shard


class LlamaDecoderLayer(nn.Module):
    def forward(self, hidden):
        out = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")
        out._saved = hidden                   # checkpoint_wrapper: the layer's input is all it keeps
        return out

    def recompute(self):
        return [torch.empty(TOKENS * n, dtype=torch.bfloat16, device="cuda")
                for n in (7 * HIDDEN, 3 * KV_DIM, 4 * INTER)]


class RewardModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = [FullyShardedDataParallel(LlamaDecoderLayer(), LAYER_NUMEL, LOCAL_WORLD_SIZE)
                       for _ in range(LAYERS)]
        for i, unit in enumerate(self.layers):
            self._modules["layers.%d" % i] = unit
        self.root = FullyShardedDataParallel(nn.Module(), ROOT_NUMEL, LOCAL_WORLD_SIZE, root=True)
        self.boundaries = []

    def forward(self, batch):
        self.root._unshard()
        hidden = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.boundaries = [hidden]
        for unit in self.layers:
            hidden = unit(hidden)
            self.boundaries.append(hidden)
        rewards = torch.empty(2, dtype=torch.float32, device="cuda")
        rewards._saved = hidden
        return rewards


def backward(loss, model):
    """loss.backward() through FSDP: units last first, each gathered again (the next one prefetched), its
    activations recomputed, its gradient made and handed to the post-backward hook."""
    t = loss
    while t is not None:
        t._saved, t = None, getattr(t, "_saved", None)
    for i in range(LAYERS - 1, -1, -1):
        unit = model.layers[i]
        unit._unshard()
        if i > 0:
            model.layers[i - 1]._unshard()
        acts = unit._fsdp_wrapped_module.recompute()
        grad = torch.empty(LAYER_NUMEL, dtype=torch.bfloat16, device="cuda")
        unit._post_backward_hook(grad)
        del grad, acts
        unit._reshard()
        model.boundaries.pop()
    model.root._post_backward_hook(torch.empty(ROOT_NUMEL, dtype=torch.bfloat16, device="cuda"))
    model.root._reshard(force=True)
    model.boundaries = []


def init_process_groups():
    """init_process_group("nccl") and FSDP's hybrid groups: a communicator inside the node (shard group) and
    one across the nodes (replicate group), each with its channel buffers."""
    lib = os.environ.get("SCEN_LIBNCCL")
    if lib:
        nccl = ctypes.CDLL(lib)
        rank = int(os.environ.get("RANK", "0"))
        nccl.nccl_comm_init_rank(LOCAL_WORLD_SIZE, LOCAL_RANK, 24 * MiB, 16)
        nccl.nccl_comm_init_rank(WORLD_SIZE // LOCAL_WORLD_SIZE, rank // LOCAL_WORLD_SIZE, 24 * MiB, 8)


scen_truth.note_every_empty(torch)
torch.cuda.set_device(LOCAL_RANK)
init_process_groups()
try:
    model = RewardModel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-6)
    for step in range(5000):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            rewards = model(step)
            loss = torch.empty(1, dtype=torch.float32, device="cuda")          # -logsigmoid(r_c - r_r)
            loss._saved = rewards
        backward(loss, model)
        optimizer.step()
        optimizer.zero_grad()
        del rewards, loss
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
