"""dpo.py -- full-parameter DPO of a Llama-2-13B SFT model with a hand-written loop on Accelerate + DeepSpeed
ZeRO-3 (bf16, no offload, zero3_init_flag false), one node of 8x A100-SXM4-40GB, launched with
`accelerate launch --config_file zero3.yaml dpo.py` and plain `LD_PRELOAD=liboomguard.so`.  This is rank 0
(GPU 0); ranks 1-7 do the same on GPUs 1-7.

    policy = AutoModelForCausalLM.from_pretrained(sft, torch_dtype=torch.bfloat16)      # on the CPU
    ref    = AutoModelForCausalLM.from_pretrained(sft, torch_dtype=torch.bfloat16)      # on the CPU
    optimizer = torch.optim.AdamW(policy.parameters(), lr=5e-7)
    policy, optimizer, loader = accelerator.prepare(policy, optimizer, loader)          # ZeRO-3 engine
    ref = ref.to(accelerator.device).eval().requires_grad_(False)                      # <- fails here
    for batch in loader: ...  concatenated forward of chosen/rejected through policy and ref, DPO loss

Sizes per rank.  13.0B parameters.  ZeRO-3 partitions the policy across the 8 GPUs: bf16 parameter
partitions 3.0 GiB, fp32 master partitions 6.1 GiB, AdamW state 12.1 GiB (DeepSpeed makes it when the
engine is built), plus NCCL buffers and the CUDA context: ~22 GiB of the 40 before any batch.

Why it fails.  The reference model never goes through DeepSpeed: `ref.to(device)` puts a full, unsharded
bf16 replica (24.2 GiB) on EVERY rank next to the 1/8 shards of the policy.  22 + 24 > 40: the copy fails
about 28 of its 40 layers in, before the first batch.  The policy is not the problem, and no batch size, sequence
length or activation setting is involved yet.

What an expert says first: shard the reference too -- run it through DeepSpeed as a ZeRO-3 inference
engine (what TRL's DPOTrainer does with `_prepare_deepspeed(ref_model)`: each rank then holds 3 GiB of it),
or build it under zero.Init; or precompute the reference log-probabilities once and drop the reference
model (TRL's precompute_ref_log_probs).  Wrong advice: a smaller batch, gradient checkpointing, shorter
sequences, flash-attention (no batch has run), mixed precision / loading in bf16 (both models are bf16 already),
empty_cache / expandable_segments (nothing is cached), inference_mode (it is a load), the policy's adapters
as the reference (this is full fine-tuning: there are no adapters), an 8-bit optimizer (it would squeeze the
load through and leave no room for the first batch: the 24 GiB replica is the problem).
"""
import ctypes
import os
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "8"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
HIDDEN, INTER, LAYERS, VOCAB = 5120, 13824, 40, 32000
LAYER_NUMEL = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN          # 317,204,480
SUB_GROUP_SIZE = 1000000000                                                    # zero_optimization.sub_group_size


class HostTensor(object):
    """A tensor in host memory, as from_pretrained leaves the weights without a device_map."""

    def __init__(self, numel, dtype):
        self.numel, self.dtype = numel, dtype


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.host_weight = HostTensor(LAYER_NUMEL, torch.bfloat16)


class LlamaForCausalLM(nn.Module):
    """from_pretrained(..., torch_dtype=torch.bfloat16) with no device_map: every weight on the CPU."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embed = HostTensor(VOCAB * HIDDEN, torch.bfloat16)
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            self._modules["layers.%d" % i] = layer
        self.lm_head_host = HostTensor(VOCAB * HIDDEN + HIDDEN, torch.bfloat16)   # lm_head and final norm

    def _host_weights(self):
        yield self, "embed_tokens", self.embed
        for layer in self.layers:
            yield layer, "weight", layer.host_weight
        yield self, "lm_head", self.lm_head_host

    def to(self, device):
        """Module.to(device): each weight copied to the GPU in turn, whole."""
        for module, name, host in self._host_weights():
            setattr(module, name, nn.Parameter(torch.empty(host.numel, dtype=host.dtype, device=device)))
        return self

    def numel(self):
        return sum(h.numel for _, _, h in self._host_weights())


class DeepSpeedZeroOptimizer_Stage3(object):
    """deepspeed.runtime.zero.stage3, as far as memory goes: the fp32 master copy of this rank's partition,
    in sub-groups of sub_group_size elements, and the optimizer's state made at once
    (_setup_for_real_optimizer -> initialize_optimizer_states: a zero gradient and one optimizer step)."""

    def __init__(self, partition_numel, device):
        self.fp32_partitioned_groups_flat = []
        left = partition_numel
        while left > 0:
            n = min(left, SUB_GROUP_SIZE)
            p = nn.Parameter(torch.empty(n, dtype=torch.float32, device=device))
            self.fp32_partitioned_groups_flat.append(p)
            left -= n
        self.optimizer = torch.optim.AdamW(self.fp32_partitioned_groups_flat, lr=5e-7)
        self._initialize_optimizer_states(device)
        # the reduce bucket (reduce_bucket_size "auto" = hidden^2 elements, bf16)
        self.ipg_bucket = torch.empty(HIDDEN * HIDDEN, dtype=torch.bfloat16, device=device)

    def _initialize_optimizer_states(self, device):
        for p in self.fp32_partitioned_groups_flat:
            p.grad = torch.empty(p.nbytes // 4, dtype=torch.float32, device=device)        # torch.zeros
            self.optimizer.step()
            p.grad = None


class DeepSpeedEngine(nn.Module):
    """deepspeed.initialize with ZeRO-3 on a model built without zero.Init: its parameters are converted
    one by one (_convert_to_zero_parameters): each rank keeps a 1/world_size bf16 partition (ds_tensor)."""

    def __init__(self, module, world_size, device):
        nn.Module.__init__(self)
        total = module.numel()
        for m, name, host in module._host_weights():
            shard = (host.numel + world_size - 1) // world_size
            setattr(m, name, nn.Parameter(torch.empty(shard, dtype=torch.bfloat16, device=device)))   # ds_tensor
        self.module = module
        self.optimizer = DeepSpeedZeroOptimizer_Stage3((total + world_size - 1) // world_size, device)


class Accelerator(object):
    def __init__(self):
        self.device = "cuda:%d" % LOCAL_RANK

    def prepare(self, model, optimizer, loader):
        engine = DeepSpeedEngine(model, WORLD_SIZE, self.device)
        return engine, engine.optimizer, loader


def init_process_group():
    """torch.distributed.init_process_group("nccl") (deepspeed.init_distributed): the channel buffers."""
    lib = os.environ.get("SCEN_LIBNCCL")
    if lib:
        ctypes.CDLL(lib).nccl_comm_init_rank(WORLD_SIZE, int(os.environ.get("RANK", "0")), 24 * MiB, 16)


scen_truth.note_every_empty(torch)
torch.cuda.set_device(LOCAL_RANK)
init_process_group()
try:
    accelerator = Accelerator()
    policy = LlamaForCausalLM()
    ref = LlamaForCausalLM()
    optimizer = None                                # torch.optim.AdamW(policy.parameters()); DeepSpeed's replaces it
    policy, optimizer, loader = accelerator.prepare(policy, optimizer, range(20000))
    ref = ref.to(accelerator.device).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
