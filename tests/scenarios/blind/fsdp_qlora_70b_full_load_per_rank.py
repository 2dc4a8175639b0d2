"""train_qlora_fsdp.py under `torchrun --nproc_per_node 2` on two 24 GiB RTX 3090s (a wrapper binds
each worker to its own GPU) -- FSDP + QLoRA fine-tuning of Llama-2-70B, the recipe that fits a 70B
model on two 24 GiB cards by sharding the 4-bit base weights (~35 GiB) across them.  The script
loads the quantized model on every rank's GPU first and wraps it afterwards:

    dist.init_process_group("nccl"); torch.cuda.set_device(0)       # the worker's only visible GPU
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-70b-hf",
                quantization_config=BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_storage=torch.bfloat16),
                torch_dtype=torch.bfloat16, device_map={"": torch.cuda.current_device()})   # all of it
    model = get_peft_model(model, lora_config)
    model = FSDP(model, auto_wrap_policy=..., use_orig_params=True)          # would shard it to ~17.5 GiB

Every rank tries to hold the whole 35 GiB 4-bit model before FSDP ever shards it; both fail while
loading, at layer 55 of 80.  Nothing else is on the GPUs; each rank is on its own GPU.  An
expert: load without placing the model on the GPU (rank 0 on the CPU, the others on the meta
device: low_cpu_mem_usage / fsdp_cpu_ram_efficient_loading, no device_map) and let FSDP move only
each rank's shard to its GPU (sync_module_states=True); the model is already 4-bit and LoRA.
"""
import ctypes
import os
import subprocess
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30


def launcher(nproc=2):
    """torchrun: one worker per rank; the job fails when its workers have failed."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc),
                   LOCAL_WORLD_SIZE=str(nproc), GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="none", TORCHELASTIC_RESTART_COUNT="0")
        procs.append(subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__)], env=env))
    rcs = [p.wait() for p in procs]
    return 1 if any(rcs) else 0


def init_process_group(backend):
    nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
    nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
    if nccl.nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]), 8 * MiB, 8) != 0:
        raise RuntimeError("NCCL error: unhandled cuda error")
    return nccl


class LlamaForCausalLM(torch.nn.Module):
    """from_pretrained(..., load_in_4bit, device_map={"": current device}): every layer's packed 4-bit
    weights (stored as bf16 for FSDP) land on the rank's GPU as they are read."""

    def __init__(self, n_layers=80):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(500 * MiB, dtype=torch.uint8, device="cuda"))
        for i in range(n_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(72 * MiB, dtype=torch.uint8, device="cuda"),
                                                 requires_grad=False)
            layer.mlp = torch.nn.Parameter(torch.empty(356 * MiB, dtype=torch.uint8, device="cuda"),
                                           requires_grad=False)
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(500 * MiB, dtype=torch.uint8, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, quantization_config=None, torch_dtype=None, device_map=None):
        return cls()


def main():
    pg = init_process_group("nccl")
    torch.cuda.set_device(0)                         # the worker's only visible GPU
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-2-70b-hf", quantization_config={"load_in_4bit": True},
                                             torch_dtype=torch.bfloat16, device_map={"": torch.cuda.current_device()})
    return model


def worker():
    scen_truth.note_every_empty(torch)
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    return 0


if __name__ == "__main__":
    sys.exit(worker() if "RANK" in os.environ else launcher())
