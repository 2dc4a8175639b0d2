"""Resuming a multi-node code pretraining run after an NCCL timeout, on a GPU that a hung rank of the
previous attempt still holds.

The real job: continued pretraining of Llama-3-8B on code (8k-token repository-ordered rows,
FSDP FULL_SHARD over 64 ranks, bf16 mixed precision, activation checkpointing), 8 nodes x 8 H100
80GB, `sbatch --requeue` with one `srun` task per GPU (--ntasks-per-node=8 --gpus-per-task=1:
each task sees its own GPU as cuda:0).  Checkpoints go to Lustre through torch.distributed.checkpoint
every 200 steps.

At step 31,517 a flapping InfiniBand link made one all-reduce stall; the NCCL watchdog
(TORCH_NCCL_ASYNC_ERROR_HANDLING) aborted the job, Slurm requeued it (SLURM_RESTART_COUNT=1) and it
came back on the same nodes.  But on node gpu-st-p5-017 the old rank 27 never died: it sat in the
kernel (D state) inside the NVIDIA driver, and nvidia-smi still shows its python3 holding 62 GiB
of GPU 3 -- the reserved cache of a rank that had run 31k steps.  The node health check looks at
GPU temperature and ECC, not at leftover processes, so the node was not drained.

This program is the new rank 27 (SLURM_PROCID=27, SLURM_LOCALID=3) of the requeued job.  It builds
the sharded model, restores step 31,400 from the DCP checkpoint into its shards (in place), and its
first forward pass dies:
  card                      79.6 GiB (81559 MiB), 0.5 GiB CUDA context
  the hung old rank 27      62 GiB  (another process: nothing this process can free)
  left for this rank        ~17.1 GiB
  its own state             8.03e9 params / 64 ranks x (4 B param + 8 B AdamW)  = 1.4 GiB
                            (+ 0.47 GiB of sharded grads once backward runs)
  first forward             per layer an all-gathered bf16 layer (0.41 GiB, freed after it), the
                            checkpointed layer inputs 2 x 8192 x 4096 x 2 B = 128 MiB each (4 GiB
                            for 32), bf16 logits 2 x 8192 x 128256 x 2 B = 3.9 GiB, their fp32
                            log_softmax 7.8 GiB
The fp32 log_softmax of the first micro-batch (an 8016 MiB request) is what fails, with 7.5 GiB
free, 9.4 GiB allocated by this rank and 0.2 GiB cached.  On a clean GPU this rank peaks at ~17.7 GiB
and ran that way for 31k steps.

What an expert says first: the memory is held by another process -- the hung rank of the previous
attempt.  Kill it (or, since it is unkillable in D state, reset the GPU / reboot the node), and make
the Slurm prolog/epilog or health check fail a node whose GPUs hold leftover processes before the
job is requeued onto it.  Wrong advice: smaller micro-batch, gradient checkpointing (already on),
FSDP/ZeRO (already FULL_SHARD over 64), expandable_segments / empty_cache (this process caches
almost nothing), mixed precision (already bf16), quantization, a bigger GPU, restarting this job
(the requeue already did, onto the same GPU).
"""
import os

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

CKPT_DIR = "/lustre/code-cpt/llama3-8b-stackv2/checkpoints"
SEQ_LEN = 8192
MICRO_BATCH_SIZE = 2
GRAD_ACCUM = 4
LR = 1e-5


class LlamaConfig(object):
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    head_dim = 128
    vocab_size = 128256


class ShardedLinear(torch.nn.Module):
    """A Linear whose weight FSDP keeps as this rank's 1/world_size fp32 shard (FULL_SHARD)."""

    def __init__(self, in_features, out_features, world_size):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(-(-in_features * out_features // world_size),
                                                     dtype=torch.float32))

    def numel(self):
        return self.in_features * self.out_features

    def forward(self, x, tokens):
        w = self.weight
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, cfg, world_size):
        torch.nn.Module.__init__(self)
        kv = cfg.num_key_value_heads * cfg.head_dim
        self.q_proj = ShardedLinear(cfg.hidden_size, cfg.hidden_size, world_size)
        self.k_proj = ShardedLinear(cfg.hidden_size, kv, world_size)
        self.v_proj = ShardedLinear(cfg.hidden_size, kv, world_size)
        self.o_proj = ShardedLinear(cfg.hidden_size, cfg.hidden_size, world_size)
        self.gate_proj = ShardedLinear(cfg.hidden_size, cfg.intermediate_size, world_size)
        self.up_proj = ShardedLinear(cfg.hidden_size, cfg.intermediate_size, world_size)
        self.down_proj = ShardedLinear(cfg.intermediate_size, cfg.hidden_size, world_size)

    def unsharded_numel(self):
        return sum(m.numel() for m in self._modules.values())

    def forward(self, x, tokens):
        # FSDP pre-forward: all-gather this layer's parameters in bf16; resharded after forward
        unsharded = torch.empty(self.unsharded_numel(), dtype=torch.bfloat16)
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = torch.empty(q.nbytes)                          # flash-attention output
        del q, k, v
        h = self.o_proj(attn, tokens)
        del attn
        gate = self.gate_proj(h, tokens)
        up = self.up_proj(h, tokens)
        out = self.down_proj(gate, tokens)
        del gate, up, h, unsharded
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg, world_size):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.embed_tokens = ShardedLinear(cfg.vocab_size, cfg.hidden_size, world_size)
        self.layers = torch.nn.Module()
        for i in range(cfg.num_hidden_layers):
            setattr(self.layers, str(i), LlamaDecoderLayer(cfg, world_size))
        self.lm_head = ShardedLinear(cfg.hidden_size, cfg.vocab_size, world_size)

    def forward(self, input_ids, labels):
        tokens = MICRO_BATCH_SIZE * SEQ_LEN
        x = self.embed_tokens(input_ids, tokens)
        for i in range(self.cfg.num_hidden_layers):
            out = self.layers._modules[str(i)](x, tokens)      # checkpoint_wrapper: keeps only x
            out._saved = x
            x = out
            del out
        # lm_head is its own FSDP unit: its bf16 weight gathered for the projection
        head = torch.empty(self.lm_head.numel(), dtype=torch.bfloat16)
        logits = self.lm_head(x, tokens)
        logits._saved = x
        del head
        return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), labels)


def init_optim_state(model, optimizer):
    """torch.distributed.checkpoint.state_dict._init_optim_state: AdamW's lazy state made by a step with
    zero gradients, so that dcp.load has tensors to load into."""
    for p in model.parameters():
        p.grad = torch.empty_like(p)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def dcp_load(state, checkpoint_id):
    """dcp.load(state, checkpoint_id=...): every rank reads its own shards from the checkpoint into the
    tensors it already holds (in place: nothing new on the GPU)."""
    return state


def latest_checkpoint(ckpt_dir):
    return os.path.join(ckpt_dir, "step_31400")


def get_batch(step):
    input_ids = torch.empty(MICRO_BATCH_SIZE * SEQ_LEN * 8, dtype=torch.uint8)   # int64 token ids
    labels = torch.empty(MICRO_BATCH_SIZE * SEQ_LEN * 8, dtype=torch.uint8)
    return input_ids, labels


def main():
    rank = int(os.environ["SLURM_PROCID"])
    world_size = int(os.environ["SLURM_NTASKS"])
    # dist.init_process_group("nccl", rank=rank, world_size=world_size); one GPU per task: cuda:0
    torch.cuda.set_device(0)

    model = LlamaForCausalLM(LlamaConfig(), world_size)      # fully_shard(...) per layer, FULL_SHARD
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1)

    start_step = 0
    if int(os.environ.get("SLURM_RESTART_COUNT", "0")) > 0 or os.path.isdir(CKPT_DIR):
        ckpt = latest_checkpoint(CKPT_DIR)
        init_optim_state(model, optimizer)
        state = {"model": model.state_dict(), "optim": optimizer.state_dict(), "step": 0}
        dcp_load(state, checkpoint_id=ckpt)
        start_step = 31400
        if rank == 0:
            print("resumed from %s" % ckpt)

    for step in range(start_step, 100_000):
        for micro in range(GRAD_ACCUM):
            input_ids, labels = get_batch(step * GRAD_ACCUM + micro)
            loss = model(input_ids, labels)
            scen_truth.backward(loss)
            del loss, input_ids, labels
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
