"""lora_llama8b.py -- LoRA fine-tuning of Llama-3.1-8B (bf16, 15 GiB of weights) on a workstation with one
RTX 3090 24 GB.  The command was copied from the team's 2-GPU server:

    torchrun --nproc-per-node 2 lora_llama8b.py

and the script picks its GPU defensively, so that it "also runs on smaller boxes":

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank % torch.cuda.device_count())     # 1 % 1 == 0: both ranks on GPU 0
    with training_args.main_process_first():                          # rank 0 loads first, then the others
        model = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map={"": device})

Rank 0 loads its copy (15 GiB) and waits at the barrier; rank 1 then loads its own copy onto the same
GPU and runs out about half way through the weights.  torchrun sees rank 1 fail and stops rank 0.
(The stand-in below is the launcher too: run without LOCAL_RANK it starts the two ranks as torchrun does.)

An expert: this is not a model too large for the card -- one copy fits with room for LoRA training --
but two ranks of the same job on one GPU, each loading the whole model.  Run one process per GPU
(--nproc-per-node 1 here, or = torch.cuda.device_count()), and drop the modulo that silently puts two
ranks on one device.  Not quantization, not offloading, not a bigger GPU, not the batch.
"""
import os
import subprocess
import sys
import time

MiB = 1 << 20
LAYERS, HIDDEN, VOCAB = 32, 4096, 128256


def torchrun(nproc):
    """What `torchrun --nproc-per-node N` does here: N copies of this script with the rank variables,
    and when one fails, the others are stopped and the launch fails."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="29500",
                   TORCHELASTIC_RUN_ID="lora-llama8b-ws1")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    while True:
        codes = [p.poll() for p in procs]
        if any(c not in (None, 0) for c in codes):
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            for p in procs:
                p.wait()
            return 1
        if all(c == 0 for c in codes):
            return 0
        time.sleep(0.05)


class main_process_first(object):
    """transformers' TrainingArguments.main_process_first(): the other ranks wait at a barrier until
    rank 0 has done the block (the stand-in's barrier: a file in the launch's state directory)."""

    def __init__(self, rank):
        self.rank = rank
        self.flag = os.path.join(os.environ.get("SIMGPU_STATE_DIR", "/tmp"), "main-process-done")

    def __enter__(self):
        if self.rank != 0:
            while not os.path.exists(self.flag):
                time.sleep(0.02)

    def __exit__(self, *exc):
        if self.rank == 0 and exc[0] is None:
            open(self.flag, "w").close()
        return False


def worker():
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class LlamaDecoderLayer(torch.nn.Module):
        def __init__(self, device):
            torch.nn.Module.__init__(self)
            self.self_attn = torch.nn.Parameter(torch.empty(3 * HIDDEN * HIDDEN, dtype=torch.bfloat16, device=device),
                                                requires_grad=False)
            self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * 14336, dtype=torch.bfloat16, device=device),
                                          requires_grad=False)

    class LlamaForCausalLM(torch.nn.Module):
        def __init__(self, device):
            torch.nn.Module.__init__(self)
            self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device=device),
                                                   requires_grad=False)
            for i in range(LAYERS):
                setattr(self, "layer%d" % i, LlamaDecoderLayer(device))
            self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device=device),
                                              requires_grad=False)

        @classmethod
        def from_pretrained(cls, name, torch_dtype=None, device_map=None):
            return cls(device_map[""])

    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    device = local_rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    torch.empty(2 * MiB, device=device)                 # init_process_group's first tensor on the device
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    with main_process_first(rank):
        model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.bfloat16,
                                                 device_map={"": device})
    # DDP's first collective: waits for every rank (rank 0 waits here for rank 1)
    while True:
        time.sleep(0.1)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        sys.exit(torchrun(2))
    try:
        worker()
    except Exception as e:
        if type(e).__name__ == "OutOfMemoryError":
            raise                           # marked by the observer above (at the failure itself)
        raise
