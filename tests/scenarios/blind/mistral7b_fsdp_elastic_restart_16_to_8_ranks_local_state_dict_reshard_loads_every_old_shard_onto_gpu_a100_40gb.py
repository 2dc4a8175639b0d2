"""Mistral-7B pretraining with FSDP (FULL_SHARD, use_orig_params=False) on two p4d nodes (16x A100-SXM4-40GB),
launched elastic: `torchrun --nnodes=1:2 --nproc_per_node=8 --max-restarts=3 --rdzv-backend=c10d ... pretrain.py`.
Every 500 steps each rank writes its own shard with LOCAL_STATE_DICT:

    with FSDP.state_dict_type(model, StateDictType.LOCAL_STATE_DICT):
        torch.save({"model": model.state_dict(), "optim": optimizer.state_dict()}, f"{ckpt}/rank{rank}.pt")

One node loses its EFA link; torchelastic tears the job down and restarts it on the surviving node with 8 ranks.  A
LOCAL_STATE_DICT shard only loads into the same world size, so the user wrote a reshard step for exactly this case:

    def reshard_local_checkpoint(ckpt, old_world, new_rank, new_world):
        old = [torch.load(f"{ckpt}/rank{r}.pt", map_location=f"cuda:{local_rank}")   # "never onto GPU 0 again"
               for r in range(old_world)]
        for name in flat_param_names:
            full = torch.cat([o[name] for o in old])          # rebuild the flat tensor, then take the new slice
            ...

What happens: every new rank loads all 16 old shards -- weights and both AdamW moments -- onto its own GPU before
concatenating anything.  Rank 0 runs out of memory while reading the 7th of the 16 files (a 52 MiB tensor, with
the card full).

Sizes per rank (A100 40GB = 40 GiB, 0.5 GiB CUDA context):
  * the new model shard (7.24B params / 8 ranks, fp32 flat parameters): 3.37 GiB;
  * one old rank file: 7.24B / 16 fp32 flat params (1.69 GiB) + exp_avg + exp_avg_sq = 5.06 GiB; all 16 files =
    81 GiB, the whole training state, on every one of the 8 GPUs;
  * each 52 MiB tensor takes a 54 MiB segment (the caching allocator rounds to 2 MiB and keeps the ~2 MiB rest as a
    free splinter): 5.25 GiB reserved per file, ~1.4 GiB of splinters in all at the failure -- nowhere near the
    81 GiB the loop wants;
  * 0.5 + 3.37 + 6 x 5.25 = 35.4 GiB: the 7th file does not fit.

What an expert says first: load the old shards on the host (map_location="cpu": 81 GiB of host memory is fine on a
1.1 TB p4d) and copy only this rank's new slice to the GPU, or better, read only the two old shards that overlap the
new one (new rank r = old ranks 2r and 2r+1) -- and switch the checkpoints to torch.distributed.checkpoint with
SHARDED_STATE_DICT, which reshards on load across world sizes by itself.  Wrong advice: a smaller batch, gradient
checkpointing, mixed precision, flash-attention (no forward has run), empty_cache / expandable_segments (everything
loaded is a live tensor in the `old` list; the 1.4 GiB of splinters would hold a quarter of one more file),
ZeRO/FSDP (already sharded), quantization, a bigger GPU (these are the nodes the job has, and the loop puts the whole
training state on every GPU, whatever the card).
"""
import json
import os
import tempfile

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

N_LAYERS = 32
LAYER_PARAMS = 2 * 4096 * 4096 + 2 * 4096 * 1024 + 3 * 4096 * 14336 + 2 * 4096    # attention + MLP + 2 RMSNorms
ROOT_PARAMS = 2 * 32000 * 4096 + 4096                                             # embed_tokens + lm_head + norm
OLD_WORLD_SIZE = 16


class FlatParamUnit(nn.Module):
    """An FSDP unit (one MistralDecoderLayer, or the root's embeddings/norm/lm_head) as FULL_SHARD keeps it:
    this rank's 1/world slice of one flat fp32 parameter."""

    def __init__(self, numel, world_size):
        nn.Module.__init__(self)
        self.numel = numel
        self._flat_param = nn.Parameter(torch.empty((numel + world_size - 1) // world_size, dtype=torch.float32))


class ShardedMistral(nn.Module):
    def __init__(self, world_size):
        nn.Module.__init__(self)
        self.units = []
        for i in range(N_LAYERS):
            unit = FlatParamUnit(LAYER_PARAMS, world_size)
            setattr(self, "layers_%d" % i, unit)
            self.units.append(("model.layers.%d" % i, unit))
        self.root = FlatParamUnit(ROOT_PARAMS, world_size)
        self.units.append(("model", self.root))


class _OnDisk(object):
    """An entry of an old rank's file, as the simulation writes it (its size is all the stand-in torch keeps)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def write_previous_run_checkpoint(ckpt_dir):
    """Simulation only: the 16 rank files the 2-node run left on FSx, sized as they were (the stand-in's torch.save
    keeps {name: bytes}; nested keys are flattened to 'model.<unit>' and 'optim.<unit>.<moment>')."""
    for r in range(OLD_WORLD_SIZE):
        entries = {}
        for i in range(N_LAYERS + 1):
            unit = "model.layers.%d" % i if i < N_LAYERS else "model"
            n = (LAYER_PARAMS if i < N_LAYERS else ROOT_PARAMS) // OLD_WORLD_SIZE
            entries["model.%s._flat_param" % unit] = _OnDisk(n * 4)
            entries["optim.%s.exp_avg" % unit] = _OnDisk(n * 4)
            entries["optim.%s.exp_avg_sq" % unit] = _OnDisk(n * 4)
        torch.save(entries, os.path.join(ckpt_dir, "rank%d.pt" % r))
    with open(os.path.join(ckpt_dir, "meta.json"), "w") as f:
        json.dump({"world_size": OLD_WORLD_SIZE, "step": 41500}, f)


def reshard_local_checkpoint(ckpt_dir, old_world, new_rank, new_world, local_rank, model, optimizer):
    old = [torch.load(os.path.join(ckpt_dir, "rank%d.pt" % r), map_location="cuda:%d" % local_rank)
           for r in range(old_world)]
    new_state = {}
    for unit_name, unit in model.units:
        for key in ("model.%s._flat_param" % unit_name, "optim.%s.exp_avg" % unit_name,
                    "optim.%s.exp_avg_sq" % unit_name):
            full = torch.empty(sum(o[key].nbytes for o in old), device=local_rank)   # torch.cat([o[key] for o in old])
            new_state[key] = torch.empty(full.nbytes // new_world, device=local_rank)  # full.chunk(new_world)[new_rank]
            del full
    del old
    return new_state


def load_checkpoint(ckpt_dir, model, optimizer):
    rank = int(os.environ["RANK"])
    world = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    with open(os.path.join(ckpt_dir, "meta.json")) as f:
        meta = json.load(f)
    if meta["world_size"] != world:
        print("[rank%d] restart %s: checkpoint written by %d ranks, now %d: resharding"
              % (rank, os.environ.get("TORCHELASTIC_RESTART_COUNT"), meta["world_size"], world))
        reshard_local_checkpoint(ckpt_dir, meta["world_size"], rank, world, local_rank, model, optimizer)
    return meta["step"]


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = ShardedMistral(int(os.environ["WORLD_SIZE"]))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    with tempfile.TemporaryDirectory() as ckpt_dir:
        write_previous_run_checkpoint(ckpt_dir)
        step = load_checkpoint(ckpt_dir, model, optimizer)
    print("resumed at step", step)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
