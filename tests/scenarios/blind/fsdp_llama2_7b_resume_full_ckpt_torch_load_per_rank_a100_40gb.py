"""train_fsdp.py -- Llama-2-7B full fine-tuning with FSDP (FULL_SHARD) on two Slurm nodes of 4x A100 40GB
(8 ranks, `srun torchrun --nnodes 2 --nproc_per_node 4 train_fsdp.py --resume ckpt/step-3000.pt`).  The
previous run, killed at its time limit, left a consolidated checkpoint written by rank 0 (FULL_STATE_DICT,
model weights fp32 26 GiB and the full AdamW state 50 GiB, one torch.save file).  On resume every rank
does, after wrapping:

    torch.cuda.set_device(local_rank)
    model = FSDP(build_llama(), device_id=local_rank, ...)   # this rank's fp32 shard, 3.1 GiB
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    state = torch.load(args.resume, map_location=f"cuda:{local_rank}")   # fails here, on every rank
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT): model.load_state_dict(state["model"])
    optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer, state["optimizer"]))

The sharded model is 3.1 GiB per rank and trains at ~30 GiB per rank; it never gets there: torch.load
puts the whole consolidated checkpoint (76 GiB, 8x what this rank will keep) on this rank's GPU and
runs out part way through the optimizer's moments.  This program is rank 0; the others fail the same
way on their own GPUs.

An expert: it is the load, not training -- load the checkpoint into CPU memory (map_location="cpu", or
only rank 0 loads it on the CPU and FSDP scatters the shards), or better save/load a sharded checkpoint
(torch.distributed.checkpoint / SHARDED_STATE_DICT) so that each rank reads only its part.  Not a
smaller batch, checkpointing, mixed precision or flash attention (no forward has run), not a bigger GPU
or more GPUs (the job already has 8 and the state fits them once sharded), not the cache.
"""
import json
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS = 32
LAYER_BYTES = 808 * MiB          # 202M fp32 parameters per decoder layer
EMBED_BYTES = 500 * MiB          # 131M parameters: embed_tokens, and lm_head the same


def previous_runs_checkpoint(path):
    """What rank 0 of the killed run saved (torch.save of the consolidated state): written here only
    because the test machine has no such file."""
    if os.path.exists(path):
        return
    sizes = {"model.embed_tokens.weight": EMBED_BYTES}
    for i in range(LAYERS):
        sizes["model.layers.%d" % i] = LAYER_BYTES
    sizes["lm_head.weight"] = EMBED_BYTES
    for i in range(LAYERS + 2):
        n = EMBED_BYTES if i in (0, LAYERS + 1) else LAYER_BYTES
        sizes["optimizer.state.%d.exp_avg" % i] = n
        sizes["optimizer.state.%d.exp_avg_sq" % i] = n
    with open(path, "w") as f:
        json.dump(sizes, f)


class FlatShard(torch.nn.Module):
    """What FSDP(model, device_id=local_rank) keeps on this rank: its flat fp32 parameter shard
    (1/world_size of the model)."""

    def __init__(self, total_bytes, world_size, device):
        torch.nn.Module.__init__(self)
        shard = (total_bytes + world_size - 1) // world_size
        shard = (shard + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
        self.flat_param = torch.nn.Parameter(torch.empty(shard, device=device))


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "8"))
    resume = sys.argv[1]
    previous_runs_checkpoint(resume)

    torch.cuda.set_device(local_rank)
    model = FlatShard(LAYERS * LAYER_BYTES + 2 * EMBED_BYTES, world_size, "cuda:%d" % local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    try:
        state = torch.load(resume, map_location="cuda:%d" % local_rank)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(local_rank)
        raise
    model.load_state_dict(state)
    return optimizer


main()
sys.exit(0)
