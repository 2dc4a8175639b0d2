"""Continued pretraining of Qwen1.5-MoE-A2.7B on a code corpus, dropless expert parallelism, one rank blown up by a
skewed batch.

The real job: a Kubeflow PyTorchJob of 4 pods, one A100 80GB each (RANK 0-3, LOCAL_RANK 0), running the team's
MoE trainer (Megatron-Core's design: MoEAlltoAllTokenDispatcher + GroupedMLP, expert_model_parallel_size=4,
moe_expert_capacity_factor=None -- dropless, the default -- moe_aux_loss_coeff=1e-3).  Each rank keeps 15 of
the 60 routed experts (rank 1: experts 15-29) and a replica of everything else (attention, the shared expert,
embeddings; their gradients are all-reduced after backward).  Pure bf16 weights, torch.optim.AdamW with bf16
moments, micro-batch 2 x 4096 tokens, no activation recomputation ("it fits, and recompute costs 25%").

Sizes per rank (hidden 2048, 24 layers, vocab 151936, top-4 of 60 experts of ffn 1408, shared expert ffn 5632):
  params 4.97B (15 local experts x 24 layers = 3.11B, the rest 1.86B): 9.3 GiB, grads 9.3, AdamW 18.5 -> 37 GiB
  per layer, balanced routing: norms/attention/shared expert/permute buffers ~0.75 GiB, plus what this rank's
  experts receive: 4 ranks x 8192 tokens x 4 choices / 4 = 32768 token rows -> recv 128 MiB, fc1 out 176 MiB,
  swiglu 88 MiB, fc2 out 128 MiB = 0.5 GiB; ~1.27 GiB x 24 layers = 30 GiB, + 4.6 GiB of logits and
  log-probs, + the gradients made in backward: a ~72 GiB peak.
For 1,800 steps every rank peaked at 71-73 GiB.  Then a shard of minified JavaScript bundles came up: from
layer 3 on, the router sends ~80% of all top-4 assignments of all four ranks to experts 15-29, so rank 1
receives 3.2x its balanced share (104857 rows: recv 410 MiB, fc1 out 563 MiB, ...), ~2.4 GiB per layer.
Dropless dispatch has no ceiling: rank 1 runs out of memory in the forward of layer 22 of 24, on its
GroupedMLP's fc1 output (563 MiB; 78 GiB allocated, 1.3 GiB cached in pieces), while ranks 0, 2 and 3 stay
below their usual peak.  Nothing leaked; even with every cached byte usable the layer and the two after it
(another ~7 GiB with the logits) would not fit: the step is just larger on that rank.

What an expert says first: routing imbalance on a dropless MoE -- give the experts a capacity
(moe_expert_capacity_factor=1.0-1.25 with token dropping, or pad to capacity) so one rank can never receive
more than its budget; alternatively recompute the MoE layers (moe-layer-recompute / activation checkpointing)
or halve the micro-batch (with twice the accumulation).  Wrong advice: empty_cache / expandable_segments (the
shortfall is real), a bigger model-parallel layout or ZeRO (the states are not what grew), quantization,
inference_mode, foreign processes.
"""
import os

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)


class MoEConfig(object):
    vocab_size = 151936
    hidden_size = 2048
    num_layers = 24
    num_moe_experts = 60
    moe_router_topk = 4
    moe_ffn_hidden_size = 1408
    moe_shared_expert_intermediate_size = 5632
    expert_model_parallel_size = 4
    moe_expert_capacity_factor = None        # dropless
    moe_aux_loss_coeff = 1e-3
    micro_batch_size = 2
    seq_length = 4096


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


def bf16(rows, cols, saved=None):
    """A [rows, cols] bf16 activation that keeps `saved` alive for backward (what autograd keeps)."""
    t = torch.empty(rows * cols, dtype=torch.bfloat16)
    t._saved = saved
    return t


class Linear(nn.Module):
    """nn.Linear in bf16 (the stand-in torch has none)."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16))

    def forward(self, x):
        return bf16(x.nbytes // 2 // self.in_features, self.out_features, x)


class RMSNorm(nn.Module):
    def __init__(self, hidden_size):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=torch.bfloat16))

    def forward(self, x):
        return bf16(x.nbytes // 2 // (self.weight.nbytes // 2), self.weight.nbytes // 2, x)


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        h = cfg.hidden_size
        self.input_layernorm = RMSNorm(h)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = Linear(h, h), Linear(h, h), Linear(h, h), Linear(h, h)

    def forward(self, x):
        # flash attention: the normed input, q, k, v and the output (+ logsumexp) are what backward keeps
        return self.o_proj(self.v_proj(self.k_proj(self.q_proj(self.input_layernorm(x)))))


class SharedExpert(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        h, f = cfg.hidden_size, cfg.moe_shared_expert_intermediate_size
        self.gate_up_proj = Linear(h, 2 * f)
        self.down_proj = Linear(f, h)

    def forward(self, x, probs):
        gate_up = self.gate_up_proj(x)
        gate_up._saved = probs                       # (the router's probs keep x for their own backward)
        act = bf16(x.nbytes // 2 // self.gate_up_proj.in_features, self.down_proj.in_features, gate_up)
        return self.down_proj(act)


class TopKRouter(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.weight = nn.Parameter(torch.empty(cfg.num_moe_experts * cfg.hidden_size, dtype=torch.bfloat16))

    def forward(self, x):
        tokens = x.nbytes // 2 // self.cfg.hidden_size
        probs = torch.empty(tokens * self.cfg.num_moe_experts, dtype=torch.float32)
        probs._saved = x
        routing_map = torch.empty(tokens * self.cfg.num_moe_experts)           # bool [tokens, experts]
        return probs, routing_map


def all_to_all_single(output, input, output_split_sizes, input_split_sizes):
    """torch.distributed.all_to_all_single over the expert-parallel group (the stand-in torch has no
    torch.distributed: the transfer itself is left out, the buffers are the job's)."""
    return output


class MoEAlltoAllTokenDispatcher(object):
    """Dropless: every token copy goes to its expert's rank, whatever the counts."""

    def __init__(self, cfg, ep_rank):
        self.cfg, self.ep_rank = cfg, ep_rank
        self.ep_size = cfg.expert_model_parallel_size

    def exchange_counts(self, layer_number, batch):
        """How many token copies each EP rank sends to each other: in the job, an all_to_all of
        num_tokens_per_expert (routing_map.sum(0)); here the batch's routing statistics say it."""
        copies = batch.tokens * self.cfg.moe_router_topk
        share = batch.rank_share(layer_number, self.ep_rank, self.ep_size)
        input_splits = [copies // self.ep_size] * self.ep_size
        output_splits = [int(copies * share)] * self.ep_size     # what every peer sends to this rank
        return input_splits, output_splits

    def token_permutation(self, hidden_states, probs, routing_map, layer_number, batch):
        input_splits, output_splits = self.exchange_counts(layer_number, batch)
        h = self.cfg.hidden_size
        permuted = bf16(sum(input_splits), h, hidden_states)        # tokens sorted by expert
        global_input = bf16(sum(output_splits), h, permuted)        # what this rank's experts receive
        global_input = all_to_all_single(global_input, permuted, output_splits, input_splits)
        return global_input, (input_splits, output_splits)

    def token_unpermutation(self, expert_output, splits):
        input_splits, output_splits = splits
        h = self.cfg.hidden_size
        back = bf16(sum(input_splits), h, expert_output)            # the expert outputs come home
        back = all_to_all_single(back, expert_output, input_splits, output_splits)
        return bf16(sum(input_splits) // self.cfg.moe_router_topk, h, back)   # weighted sum per token


class GroupedMLP(nn.Module):
    """This rank's experts: weight1 [local_experts, hidden, 2 x ffn], weight2 [local_experts, ffn, hidden]."""

    def __init__(self, cfg, num_local_experts):
        nn.Module.__init__(self)
        h, f = cfg.hidden_size, cfg.moe_ffn_hidden_size
        self.hidden, self.ffn = h, f
        self.weight1 = nn.Parameter(torch.empty(num_local_experts * h * 2 * f, dtype=torch.bfloat16))
        self.weight2 = nn.Parameter(torch.empty(num_local_experts * f * h, dtype=torch.bfloat16))

    def forward(self, permuted_local_hidden_states):
        rows = permuted_local_hidden_states.nbytes // 2 // self.hidden
        fc1_output = bf16(rows, 2 * self.ffn, permuted_local_hidden_states)    # gg.ops.gmm(x, weight1)
        intermediate = bf16(rows, self.ffn, fc1_output)                        # swiglu
        return bf16(rows, self.hidden, intermediate)                           # gg.ops.gmm(., weight2)


class MoELayer(nn.Module):
    def __init__(self, cfg, layer_number, ep_rank):
        nn.Module.__init__(self)
        self.layer_number = layer_number
        self.num_local_experts = cfg.num_moe_experts // cfg.expert_model_parallel_size
        self.local_expert_indices = [ep_rank * self.num_local_experts + i for i in range(self.num_local_experts)]
        self.pre_mlp_layernorm = RMSNorm(cfg.hidden_size)
        self.router = TopKRouter(cfg)
        self.experts = GroupedMLP(cfg, self.num_local_experts)
        self.shared_experts = SharedExpert(cfg)
        self.token_dispatcher = MoEAlltoAllTokenDispatcher(cfg, ep_rank)

    def forward(self, hidden_states, batch):
        hidden_states = self.pre_mlp_layernorm(hidden_states)
        probs, routing_map = self.router(hidden_states)
        shared = self.shared_experts(hidden_states, probs)
        dispatched_input, splits = self.token_dispatcher.token_permutation(
            shared, probs, routing_map, self.layer_number, batch)
        expert_output = self.experts(dispatched_input)
        return self.token_dispatcher.token_unpermutation(expert_output, splits)


class TransformerLayer(nn.Module):
    def __init__(self, cfg, layer_number, ep_rank):
        nn.Module.__init__(self)
        self.self_attention = SelfAttention(cfg)
        self.mlp = MoELayer(cfg, layer_number, ep_rank)

    def forward(self, hidden_states, batch):
        return self.mlp(self.self_attention(hidden_states), batch)


class QwenMoEModel(nn.Module):
    def __init__(self, cfg, ep_rank):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.embedding = nn.Parameter(torch.empty(cfg.vocab_size * cfg.hidden_size, dtype=torch.bfloat16))
        self.layers = ModuleList(TransformerLayer(cfg, i, ep_rank) for i in range(cfg.num_layers))
        self.output_layer = Linear(cfg.hidden_size, cfg.vocab_size)

    def forward(self, tokens, batch):
        h = bf16(batch.tokens, self.cfg.hidden_size, self.embedding)
        for layer in self.layers:
            h = layer(h, batch)
        logits = self.output_layer(h)
        return torch.nn.functional.cross_entropy(logits, tokens)


class CodeBatch(object):
    """A micro-batch and its routing statistics (the fraction of all top-k choices that land on each
    EP rank's experts, per layer; the job logs them as moe/rank_load)."""

    def __init__(self, cfg, shard, skew=None):
        self.tokens = cfg.micro_batch_size * cfg.seq_length
        self.input_ids = torch.empty(self.tokens * 8)              # int64 token ids
        self.shard = shard
        self.skew = skew or {}

    def rank_share(self, layer_number, ep_rank, ep_size):
        hot = self.skew.get(ep_rank)
        if hot is not None and layer_number >= hot[0]:
            return hot[1]
        return (1.0 + 0.04 * ((layer_number * 7 + ep_rank * 3) % 5 - 2)) / ep_size


def train_batches(cfg):
    """The code mixture in the order the sampler gives it; shard 'js-minified-0077' is one of a few hundred
    bundles that sail through the dedup filter."""
    shards = ["py-0412", "go-0090", "ts-1203", "js-minified-0077", "py-0413"]
    for shard in shards:
        skew = {1: (3, 0.80)} if shard.startswith("js-minified") else None
        yield CodeBatch(cfg, shard, skew)


def main():
    rank = int(os.environ.get("RANK", "0"))
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    cfg = MoEConfig()
    ep_rank = rank % cfg.expert_model_parallel_size

    model = QwenMoEModel(cfg, ep_rank)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, betas=(0.9, 0.95), weight_decay=0.1)

    iteration = 1838                               # resumed from iter_0001838
    for batch in train_batches(cfg):
        loss = model(batch.input_ids, batch)
        scen_truth.backward(loss)
        # all-reduce of the non-expert gradients over the data-parallel group here
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        iteration += 1
        if rank == 0:
            print("iteration %d shard %s" % (iteration, batch.shard), flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
