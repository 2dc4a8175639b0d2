"""finetune_fsdp.py -- full fine-tuning of CodeLlama-34B (bf16, 63 GiB of weights) with FSDP FULL_SHARD on
one Slurm node of 8x A100 40GB, one task per GPU:

    #SBATCH --nodes=1 --ntasks-per-node=8 --gpus-per-task=1
    srun python finetune_fsdp.py
    ...
    dist.init_process_group("nccl")
    model = AutoModelForCausalLM.from_pretrained(
        "codellama/CodeLlama-34b-hf", torch_dtype=torch.bfloat16,
        device_map={"": torch.cuda.current_device()})        # <- copied from our QLoRA DDP script
    model = FSDP(model, auto_wrap_policy=..., sharding_strategy=ShardingStrategy.FULL_SHARD)

Every rank dies inside from_pretrained, in the 31st of the 48 decoder layers: "Tried to allocate
344 MiB, 40 GiB total".  The user: "FSDP shards the 34B over 8 GPUs, 8 GB each, and bf16 is already
half of fp32; why does it not fit?"  Sharded, each rank would hold 63/8 = 8 GiB of weights (plus
gradients and optimizer state, also sharded); but the device_map puts the whole unsharded model on
every rank's GPU before FSDP ever sees it.

An expert: this is the loading phase, and loading is what to change: load on the CPU or the meta
device (low_cpu_mem_usage, rank 0 only with sync_module_states=True, accelerate's
fsdp_cpu_ram_efficient_loading) and let FSDP place each rank's shard.  Training itself would fit;
a smaller batch, checkpointing, mixed precision (it is bf16 already), quantization, LoRA, a bigger
card or set_device are wrong first answers.
"""
import os
import sys

import torch
from torch import nn
import scen_truth

hidden_size = 8192
intermediate = 22016
vocab = 32000


class LlamaDecoderLayer(nn.Module):
    def __init__(self, device):
        super().__init__()
        # q, o: 8192 x 8192; k, v: 8192 x 1024 (GQA, 8 kv heads); gate, up, down: 8192 x 22016; bf16
        bf16 = torch.bfloat16
        self.q_proj = nn.Parameter(torch.empty(hidden_size * hidden_size, dtype=bf16, device=device))
        self.k_proj = nn.Parameter(torch.empty(hidden_size * 1024, dtype=bf16, device=device))
        self.v_proj = nn.Parameter(torch.empty(hidden_size * 1024, dtype=bf16, device=device))
        self.o_proj = nn.Parameter(torch.empty(hidden_size * hidden_size, dtype=bf16, device=device))
        self.gate_proj = nn.Parameter(torch.empty(hidden_size * intermediate, dtype=bf16, device=device))
        self.up_proj = nn.Parameter(torch.empty(hidden_size * intermediate, dtype=bf16, device=device))
        self.down_proj = nn.Parameter(torch.empty(intermediate * hidden_size, dtype=bf16, device=device))


class LlamaForCausalLM(nn.Module):
    def __init__(self, device):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(vocab * hidden_size, dtype=torch.bfloat16, device=device))
        self.layers = []
        for i in range(48):
            layer = LlamaDecoderLayer(device)
            self.layers.append(layer)
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(vocab * hidden_size, dtype=torch.bfloat16, device=device))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        """As transformers does with a device_map: each checkpoint shard's tensors are materialized on
        the mapped device as they are read."""
        device = device_map[""] if device_map else None
        return cls(device)


def main():
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    # dist.init_process_group("nccl"): no memory yet (NCCL's communicator is made at the first collective)
    model = LlamaForCausalLM.from_pretrained("codellama/CodeLlama-34b-hf", torch_dtype=torch.bfloat16,
                                             device_map={"": torch.cuda.current_device()})
    return model, rank, world


scen_truth.note_every_empty(torch)
try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
