"""train_zero3.py -- full fine-tuning of a 13B model (bf16 checkpoint, 26 GB) with DeepSpeed ZeRO-3 on
one node of four 24 GiB GPUs (an AWS g5.12xlarge, 4 x A10G), launched as
`deepspeed --num_gpus 4 train_zero3.py` with plain `LD_PRELOAD=liboomguard.so` in the environment:

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = AutoModelForCausalLM.from_pretrained(
        "llama-2-13b", torch_dtype=torch.bfloat16, device_map={"": local_rank})   # "faster loading"
    args = TrainingArguments(..., deepspeed="ds_zero3.json")   # ZeRO-3 config created AFTER the model
    trainer = Trainer(model=model, args=args, ...)              # ZeRO-3 would partition it here
    trainer.train()

ZeRO-3 partitions the parameters over the four ranks (6.5 GB each) -- but only once deepspeed.initialize
runs.  Hugging Face builds the model partitioned from the start (deepspeed.zero.Init) only when the
ZeRO-3 config is known before from_pretrained (TrainingArguments created first, or
HfDeepSpeedConfig kept alive); here it is created after, and device_map puts the whole model on each
rank's GPU.  Every rank loads all 40 layers of the 13B model, 24.2 GiB, onto its own 24 GiB card
and fails near the last layers; each rank has its own GPU (set_device is right), nothing else is on
the cards.

An expert: load the model partitioned -- create TrainingArguments / HfDeepSpeedConfig with the
ZeRO-3 config before from_pretrained (zero.Init: each rank materialises only its shard), drop
device_map, or load on the CPU (meta device) and let ZeRO-3 partition it.  Not a smaller batch or
checkpointing (no batch has run), not set_device, not another process, not quantization or LoRA
(the job is a full fine-tune and sharding already covers it), not a bigger GPU.
"""
import os
import subprocess
import sys

MiB = 1 << 20
NPROC = 4
LAYERS = 40


def launch():
    """What the deepspeed launcher does on one node: one process per GPU, LOCAL_RANK and friends set."""
    procs = []
    for r in range(NPROC):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(NPROC),
                   LOCAL_WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__)] + sys.argv[1:], env=env))
    rcs = [p.wait() for p in procs]
    bad = [r for r, rc in enumerate(rcs) if rc != 0]
    if bad:
        print("[launcher] ranks %s exited with errors; killing the job" % bad, file=sys.stderr)
        sys.exit(1)
    sys.exit(0)


def rank_main():
    import torch
    import scen_truth

    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dev = "cuda:%d" % local_rank

    class Linear(torch.nn.Module):
        def __init__(self, nbytes):
            torch.nn.Module.__init__(self)
            # truth mark: the request in bytes (torch.empty's first argument counts bf16 elements)
            scen_truth._last.update(n=nbytes, reserved=torch.cuda.memory_reserved())
            self.weight = torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device=dev))

    class DecoderLayer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
                setattr(self, n, Linear(50 * MiB))            # 5120 x 5120 bf16
            for n in ("gate_proj", "up_proj", "down_proj"):
                setattr(self, n, Linear(135 * MiB))           # 5120 x 13824 bf16

    class LlamaForCausalLM(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.embed_tokens = Linear(312 * MiB)
            for i in range(LAYERS):
                setattr(self, "layer%d" % i, DecoderLayer())  # loaded shard by shard onto device_map's GPU
            self.lm_head = Linear(312 * MiB)

    def from_pretrained(path, torch_dtype=None, device_map=None):
        return LlamaForCausalLM()

    try:
        model = from_pretrained("llama-2-13b", torch_dtype=torch.bfloat16, device_map={"": local_rank})
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(local_rank)
        raise
    # TrainingArguments(deepspeed="ds_zero3.json"), Trainer(...), trainer.train(): never reached
    print("rank %d: model loaded (%d parameters tensors)" % (local_rank, len(model.parameters())))
    sys.exit(0)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        launch()
    rank_main()
