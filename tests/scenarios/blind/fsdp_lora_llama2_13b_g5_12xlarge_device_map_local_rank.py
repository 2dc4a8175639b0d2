"""sft_lora_fsdp.py -- LoRA SFT of Llama-2-13b-hf on an AWS g5.12xlarge (4x A10G, 24 GB each), with
FSDP across the four GPUs, launched as `torchrun --nproc-per-node 4 sft_lora_fsdp.py`:

    local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf",
                                                 torch_dtype=torch.bfloat16,
                                                 device_map={"": local_rank})   # "so each rank gets its own GPU"
    model = get_peft_model(model, LoraConfig(r=16, target_modules=["q_proj", "v_proj"]))
    model = FSDP(model, auto_wrap_policy=llama_wrap_policy, use_orig_params=True,
                 mixed_precision=bf16_policy, device_id=local_rank)
    ...

The user: "13B in bf16 is 26 GB, sharded over 4 GPUs that's 6.5 GB a GPU, plenty of room for LoRA and
activations on 24 GB cards.  But every rank dies in from_pretrained before FSDP is even reached,
all four at the same layer."

What happens: device_map={"": local_rank} tells the loader to put the WHOLE model on this rank's GPU.
Each of the four ranks streams all 26 GB of bf16 weights (40 decoder layers of 634 MB, embeddings and
lm_head of 328 MB each) into its own 24 GB card; FSDP would shard them only afterwards.  Every rank
runs out near the last decoder layers while loading; the other GPUs are each rank's own, not shared.

An expert: the plan (FSDP shards, 6.5 GB a rank) is right; the load is wrong.  Do not place the full
model on the GPU before FSDP: load it on the CPU (or on the meta device, the weights on rank 0 only,
with sync_module_states=True / accelerate's fsdp_cpu_ram_efficient_loading) and let
FSDP(device_id=local_rank) move each rank's shard to its GPU.  Not a smaller batch, checkpointing or
flash attention (nothing has run yet), not bf16 (it is bf16 already), not LoRA (it is LoRA already),
not the cache or fragmentation.  4-bit (QLoRA) would also make it fit, but changes the training.
"""
import os
import subprocess
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

MODEL = "meta-llama/Llama-2-13b-hf"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 5120, 13824, 40, 32000


def launch(nproc):
    """torchrun --nproc-per-node nproc: one process per GPU, each told who it is."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="sft-lora-13b")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    failed = [p.wait() for p in procs]
    return 1 if any(failed) else 0


# ---- the loader (transformers / accelerate, as far as this job reaches into them)
class Linear(nn.Module):
    def __init__(self, n_in, n_out, dtype, device):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=dtype, device=device), requires_grad=True)


class RMSNorm(nn.Module):
    def __init__(self, dtype, device):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device=device))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dtype, device):
        nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(dtype, device)
        self.q_proj = Linear(HIDDEN, HIDDEN, dtype, device)
        self.k_proj = Linear(HIDDEN, HIDDEN, dtype, device)
        self.v_proj = Linear(HIDDEN, HIDDEN, dtype, device)
        self.o_proj = Linear(HIDDEN, HIDDEN, dtype, device)
        self.post_attention_layernorm = RMSNorm(dtype, device)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE, dtype, device)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE, dtype, device)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN, dtype, device)


class Embedding(nn.Module):
    def __init__(self, dtype, device):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device=device))


class Layers(nn.Module):
    pass


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = Layers()

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        model = cls()
        device = device_map.get("") if device_map else None
        model._load_pretrained_model(name, torch_dtype, device)
        return model

    def _load_pretrained_model(self, name, dtype, device):
        """the checkpoint's shards one after the other, each tensor straight onto `device`
        (accelerate's set_module_tensor_to_device)"""
        self.embed_tokens = Embedding(dtype, device)
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer(dtype, device))
        self.norm = RMSNorm(dtype, device)
        self.lm_head = Embedding(dtype, device)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    # test scaffolding: the truth mark at the failing allocation itself
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))

    model = LlamaForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, device_map={"": local_rank})

    # never reached: peft's LoRA adapters, then FSDP(model, device_id=local_rank, use_orig_params=True)
    for p in model.parameters():
        p.requires_grad_(False)
    return model


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        sys.exit(launch(4))
    try:
        main()
    except torch.OutOfMemoryError:
        raise                      # marked by the observer above
    sys.exit(0)
