"""Full fine-tune of DeepSeek-MoE-16B on one node of 8x H100 80GB, expert parallelism switched off by accident.

The real job: `srun --ntasks=8 --gpus-per-task=1 python train_moe.py --config sft_deepseek_moe16b.yaml`.
train_moe.py is the team's own loop: DeepSeek's modeling code with the routed experts of each layer stacked
into three grouped-GEMM weights (torchtitan's GroupedExperts: w1/w3 [experts, 1408, 2048], w2 [experts, 2048,
1408]) and the expert sharding of DeepSeek-V2's modeling code ported in (`config.ep_size`,
`experts_per_rank = n_routed_experts // ep_size`; tokens for other ranks' experts go out by all-to-all).
The YAML says `ep-size: 8`, the argument parser reads `ep_size`, so `args.ep_size` keeps its default 1 and
every rank builds, and trains, all 64 routed experts of every MoE layer.  The dense parts were meant to be
data-parallel (replicated) and the experts split 8 per rank.  Training is pure bf16 (weights made in bf16 on
the GPU, the checkpoint copied in; torch.optim.AdamW keeps its moments in the parameters' dtype),
micro-batch 1 x 4096 tokens, gradient checkpointing on.

Sizes (DeepSeek-MoE-16B: hidden 2048, vocab 102400, 28 layers, layer 0 dense (ffn 10944), layers 1-27 MoE with
64 routed experts of ffn 1408 (top-6) + 2 shared experts, 16-head MHA):
  routed experts  27 x 64 x 3 x 2048 x 1408 = 14.95B params (each layer's w1, w2, w3: 352 MiB apiece)
  everything else (embeddings, lm_head, attention, dense layer, shared experts, gates) = 1.42B
  all on every rank: 16.37B params = 30.5 GiB bf16; gradients another 30.5 GiB -> 61 GiB after backward.
Forward and backward run (activations are a few GiB).  The first optimizer step allocates exp_avg and
exp_avg_sq (2 x 30.5 GiB) parameter by parameter; about 18 GiB are left, so AdamW's state creation fails part
way, on a 352 MiB moment of one layer's stacked expert weights, with ~2 GiB of cached activation blocks left.
With ep_size=8 each rank holds 8 experts per layer: 1.87B + 1.42B = 3.3B params, 6.1 GiB each for weights,
grads and two moments: ~25 GiB, the run fits with room to spare.

What an expert says first: the job already has 8 GPUs; each one is holding the whole model.  Shard the
experts (expert parallelism, ep_size=8) -- or shard the model states with ZeRO-3/FSDP.  Wrong advice: smaller
batch / gradient checkpointing / autocast (activations are freed before the step; the weights are already
bf16), empty_cache or expandable_segments (2 GiB cached against ~43 GiB of state still to make),
quantization (this is full fine-tuning), a bigger GPU (8 GPUs are there, unused for sharding).  8-bit Adam
(30.5 GiB of state) alone would still not fit.
"""
import argparse
import os

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

class DeepseekConfig(object):
    vocab_size = 102400
    hidden_size = 2048
    intermediate_size = 10944
    moe_intermediate_size = 1408
    num_hidden_layers = 28
    first_k_dense_replace = 1
    n_routed_experts = 64
    n_shared_experts = 2
    num_experts_per_tok = 6
    num_attention_heads = 16
    ep_size = 1


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class Linear(nn.Module):
    """nn.Linear(in_features, out_features, bias=False) in bf16 (the stand-in torch has no nn.Linear)."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16))

    def forward(self, x):
        tokens = x.nbytes // 2 // self.in_features
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16)
        out._saved = x
        return out


class DeepseekMLP(nn.Module):
    """The dense MLP of layer 0 and the shared experts."""

    def __init__(self, config, intermediate_size):
        nn.Module.__init__(self)
        h = config.hidden_size
        self.gate_proj = Linear(h, intermediate_size)
        self.up_proj = Linear(h, intermediate_size)
        self.down_proj = Linear(intermediate_size, h)

    def forward(self, x):
        g = self.gate_proj(x)
        u = self.up_proj(x)
        u._saved = g                  # act_fn(gate) * up keeps both for backward
        return self.down_proj(u)


class GroupedExperts(nn.Module):
    """This rank's routed experts as three stacked weights (torchtitan's GroupedExperts: w1/w3 are
    [num_local_experts, ffn, hidden], w2 [num_local_experts, hidden, ffn]), run with a grouped GEMM."""

    def __init__(self, config, num_local_experts):
        nn.Module.__init__(self)
        h, f = config.hidden_size, config.moe_intermediate_size
        self.num_local_experts, self.hidden, self.ffn = num_local_experts, h, f
        self.w1 = nn.Parameter(torch.empty(num_local_experts * f * h, dtype=torch.bfloat16))
        self.w2 = nn.Parameter(torch.empty(num_local_experts * h * f, dtype=torch.bfloat16))
        self.w3 = nn.Parameter(torch.empty(num_local_experts * f * h, dtype=torch.bfloat16))

    def forward(self, routed_input):
        rows = routed_input.nbytes // 2 // self.hidden
        h1 = torch.empty(rows * self.ffn, dtype=torch.bfloat16)
        h1._saved = routed_input
        h3 = torch.empty(rows * self.ffn, dtype=torch.bfloat16)
        h3._saved = h1
        out = torch.empty(rows * self.hidden, dtype=torch.bfloat16)
        out._saved = h3
        return out


class MoEGate(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.weight = nn.Parameter(torch.empty(config.n_routed_experts * config.hidden_size, dtype=torch.bfloat16))

    def forward(self, hidden_states):
        tokens = hidden_states.nbytes // 2 // self.config.hidden_size
        scores = torch.empty(tokens * self.config.n_routed_experts, dtype=torch.float32)   # softmax in fp32
        scores._saved = hidden_states
        topk_idx = torch.empty(tokens * self.config.num_experts_per_tok * 8)                # int64 indices
        return topk_idx, scores


class DeepseekMoE(nn.Module):
    """DeepSeek's MoE block, sharded as in DeepSeek-V2's code: this rank keeps
    n_routed_experts // ep_size experts, the tokens for the others go out by all-to-all."""

    def __init__(self, config, ep_rank):
        nn.Module.__init__(self)
        self.config = config
        self.ep_rank = ep_rank
        self.experts_per_rank = config.n_routed_experts // config.ep_size
        self.experts = GroupedExperts(config, self.experts_per_rank)
        self.gate = MoEGate(config)
        self.shared_experts = DeepseekMLP(config, config.moe_intermediate_size * config.n_shared_experts)

    def forward(self, hidden_states):
        topk_idx, scores = self.gate(hidden_states)
        tokens = hidden_states.nbytes // 2 // self.config.hidden_size
        # permute (and, with ep_size > 1, all-to-all) the token copies routed to this rank's experts
        rows = tokens * self.config.num_experts_per_tok * self.experts_per_rank // self.config.n_routed_experts
        routed_input = torch.empty(rows * self.config.hidden_size, dtype=torch.bfloat16)
        routed_out = self.experts(routed_input)
        del routed_input
        y = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16)   # unpermute + weighted sum
        y._saved = routed_out
        shared = self.shared_experts(hidden_states)
        shared._saved = scores
        out = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16)   # y + shared
        out._saved = shared
        return out


class DecoderLayer(nn.Module):
    def __init__(self, config, layer_idx, ep_rank):
        nn.Module.__init__(self)
        h = config.hidden_size
        self.self_attn = nn.Module()
        self.self_attn.q_proj = Linear(h, h)
        self.self_attn.k_proj = Linear(h, h)
        self.self_attn.v_proj = Linear(h, h)
        self.self_attn.o_proj = Linear(h, h)
        if layer_idx >= config.first_k_dense_replace:
            self.mlp = DeepseekMoE(config, ep_rank)
        else:
            self.mlp = DeepseekMLP(config, config.intermediate_size)

    def forward(self, hidden_states):
        # gradient checkpointing: the layer's input is what backward keeps; the rest is recomputed
        a = self.self_attn
        attn_out = a.o_proj(a.v_proj(a.k_proj(a.q_proj(hidden_states))))
        return self.mlp(attn_out)


class DeepseekForCausalLM(nn.Module):
    def __init__(self, config, ep_rank):
        nn.Module.__init__(self)
        self.config = config
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size * config.hidden_size, dtype=torch.bfloat16))
        self.layers = ModuleList(DecoderLayer(config, i, ep_rank) for i in range(config.num_hidden_layers))
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8
        h = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16)
        h._saved = self.embed_tokens
        for layer in self.layers:
            h = layer(h)
        logits = self.lm_head(h)
        return torch.nn.functional.cross_entropy(logits, input_ids)


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--config", default="sft_deepseek_moe16b.yaml")
    p.add_argument("--ep_size", type=int, default=1)      # the YAML's `ep-size: 8` never reaches it
    p.add_argument("--micro_batch_size", type=int, default=1)
    p.add_argument("--seq_len", type=int, default=4096)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--max_steps", type=int, default=2000)
    return p.parse_args()


def init_distributed():
    rank = int(os.environ.get("SLURM_PROCID", "0"))
    world_size = int(os.environ.get("SLURM_NTASKS", "1"))
    os.environ.setdefault("RANK", str(rank))
    os.environ.setdefault("WORLD_SIZE", str(world_size))
    # dist.init_process_group("nccl") here in the real script (the stand-in torch has no torch.distributed)
    torch.cuda.set_device(0)          # --gpus-per-task=1: each task sees its own GPU as cuda:0
    return rank, world_size


def batches(args):
    for step in range(args.max_steps):
        yield torch.empty(args.micro_batch_size * args.seq_len * 8)      # int64 token ids


def main():
    args = parse_args()
    rank, world_size = init_distributed()
    config = DeepseekConfig()
    config.ep_size = args.ep_size
    ep_rank = rank % config.ep_size

    model = DeepseekForCausalLM(config, ep_rank)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)

    for step, input_ids in enumerate(batches(args)):
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        if rank == 0 and step % 10 == 0:
            print("step", step, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
