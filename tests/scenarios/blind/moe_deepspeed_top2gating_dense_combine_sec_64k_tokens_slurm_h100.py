"""pretrain_gpt_moe.py -- Megatron-DeepSpeed style pretraining of a "1.3B+MoE-32" GPT (24 layers, d_model
2048, an MoE layer every other layer with 32 experts of 8192 hidden units, top-2 gating, 14B parameters
in all), 16 ranks on 2 nodes of 8 H100 80GB, launched with `srun --ntasks-per-node=8 --gpus-per-task=1`
(each rank sees its one GPU as cuda:0), expert parallelism 16 (two experts of each MoE layer per rank),
ZeRO stage 2, bf16, activation checkpointing on, PyTorch 1.13 (the pinned stack of the DeepSpeed-MoE
examples).  The gating is DeepSpeed's sharded_moe.top2gating, vendored into the repository:

    capacity = ceil(S / E * capacity_factor * 2)                       # S tokens of the micro-batch
    locations1_sc = _one_hot_to_float(locations1_s, capacity)          # [S, C]
    combine1_sec = torch.einsum("se,sc->sec", gates1, locations1_sc)   # [S, E, C] fp32
    combine2_sec = torch.einsum("se,sc->sec", gates2, locations2_sc)
    combine_weights = combine1_sec + combine2_sec
    dispatch_mask = combine_weights.bool()
    dispatched = torch.einsum("sec,sm->ecm", dispatch_mask.type_as(x), x)

With capacity_factor 1.25, on the old A100 40GB cluster the job ran micro-batch 4 x 2048 (S = 8192
tokens, C = 640: each [S, E, C] tensor 640 MiB).  Moving to H100 80GB the user raised it to 16 x 4096
(S = 65,536, C = 5120), expecting about 8x the activations for 2x the memory; the dense one-hot dispatch
grows with S squared (cf x k x S^2 elements): each [S, E, C] tensor is now 40 GiB.  Every rank fails
in the first MoE layer of the first step, inside the checkpointed forward (run under no_grad, as
reentrant checkpointing does), making combine2_sec (combine1_sec took 40 GiB); 13 GiB of weights and
ZeRO-2 optimizer state are almost all the rest.

An expert: the dense [tokens, experts, capacity] dispatch/combine tensors are the problem, not the
model: dispatch by index (gather/scatter of the routed tokens, as Tutel -- DeepSpeed's use_tutel=True
-- or MegaBlocks' dropless MoE do: memory linear in tokens), or gate over smaller groups of tokens
(fewer tokens per gating call: GShard's groups, or a smaller micro-batch with more gradient
accumulation, which shrinks these tensors quadratically).  Not activation checkpointing (on; one
layer's forward alone does not fit), not an allocator setting, not optimizer-state sharding or an
8-bit optimizer (the state is a small part), not inference mode (autograd is off only because the
checkpointed forward runs so).
"""
import math
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

D, LAYERS, EXPERTS, LOCAL_EXPERTS, EXPERT_FFN, VOCAB = 2048, 24, 32, 2, 8192, 50304
BF16, FP32, I64 = 2, 4, 8


def weight(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems, dtype=torch.bfloat16, device="cuda"))


def act(nbytes, saved=None, dtype=torch.bfloat16):
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved if torch.is_grad_enabled() else None
    return t


def top2gating(logits, tokens, capacity_factor, min_capacity):
    """deepspeed.moe.sharded_moe.top2gating, as vendored (sizes only)."""
    gates = act(tokens * EXPERTS * FP32, logits, torch.float32)                 # softmax(logits, dim=1)
    capacity = max(min_capacity, int(math.ceil(tokens / EXPERTS * capacity_factor * 2)))
    mask1 = act(tokens * EXPERTS * I64, gates, torch.uint8)                     # one_hot(argmax(gates))
    mask2 = act(tokens * EXPERTS * I64, gates, torch.uint8)                     # one_hot(argmax(logits w/o 1st))
    locations1 = act(tokens * EXPERTS * I64, mask1, torch.uint8)                # cumsum(mask1, dim=0) - 1
    locations2 = act(tokens * EXPERTS * I64, mask2, torch.uint8)
    gates1 = act(tokens * EXPERTS * FP32, gates, torch.float32)                 # einsum("s,se->se", ...)
    gates2 = act(tokens * EXPERTS * FP32, gates, torch.float32)
    locations1_sc = act(tokens * capacity * FP32, locations1, torch.float32)    # _one_hot_to_float(.., capacity)
    locations2_sc = act(tokens * capacity * FP32, locations2, torch.float32)
    combine1_sec = act(tokens * EXPERTS * capacity * FP32, gates1, torch.float32)   # einsum("se,sc->sec")
    combine2_sec = act(tokens * EXPERTS * capacity * FP32, gates2, torch.float32)
    combine_weights = act(tokens * EXPERTS * capacity * FP32, combine1_sec, torch.float32)
    dispatch_mask = act(tokens * EXPERTS * capacity, combine_weights, torch.uint8)  # .bool()
    return combine_weights, dispatch_mask, capacity


class TopKGate(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wg = torch.nn.Parameter(torch.empty(D * EXPERTS, dtype=torch.float32, device="cuda"))
        self.capacity_factor, self.min_capacity = 1.25, 4

    def forward(self, x, tokens):
        logits = act(tokens * EXPERTS * FP32, x, torch.float32)                 # self.wg(x.float())
        return top2gating(logits, tokens, self.capacity_factor, self.min_capacity)


class Experts(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(LOCAL_EXPERTS):
            setattr(self, "fc1_%d" % i, weight(D * EXPERT_FFN))
            setattr(self, "fc2_%d" % i, weight(EXPERT_FFN * D))


class MOELayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate = TopKGate()
        self.experts = Experts()

    def forward(self, x, tokens):
        combine_weights, dispatch_mask, capacity = self.gate(x, tokens)
        dispatched = act(EXPERTS * capacity * D * BF16, dispatch_mask)      # einsum("sec,sm->ecm", ...)
        expert_out = act(EXPERTS * capacity * D * BF16, dispatched)          # all-to-all, experts, all-to-all
        return act(tokens * D * BF16, expert_out)                            # einsum("sec,ecm->sm", combine...)


class ParallelAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query_key_value = weight(D * 3 * D)
        self.dense = weight(D * D)

    def forward(self, h, tokens):
        qkv = act(tokens * 3 * D * BF16, h)
        return act(tokens * D * BF16, qkv)


class ParallelTransformerLayer(torch.nn.Module):
    def __init__(self, moe):
        torch.nn.Module.__init__(self)
        self.self_attention = ParallelAttention()
        if moe:
            self.mlp = MOELayer()
        else:
            self.dense_h_to_4h = weight(D * 4 * D)
            self.dense_4h_to_h = weight(4 * D * D)
        self.moe = moe

    def forward(self, h, tokens):
        a = self.self_attention(h, tokens)
        if self.moe:
            return self.mlp(a, tokens)
        up = act(tokens * 4 * D * BF16, a)
        return act(tokens * D * BF16, up)


def checkpoint(function, *args):
    """deepspeed.checkpointing.checkpoint (reentrant): the forward runs under no_grad, only the inputs are
    kept; backward recomputes."""
    with torch.no_grad():
        out = function(*args)
    return out


class GPTMoEModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = weight(VOCAB * D)
        self.layers = []
        for i in range(LAYERS):
            layer = ParallelTransformerLayer(moe=(i % 2 == 1))
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.checkpoint_activations = True

    def forward(self, tokens_ids, tokens):
        h = act(tokens * D * BF16, tokens_ids)
        for layer in self.layers:
            h = checkpoint(layer, h, tokens)
        return act(tokens * VOCAB * BF16, h)


class DeepSpeedZeroOptimizer(object):
    """what deepspeed.initialize builds for ZeRO stage 2 on this rank: fp32 master partitions (the dense
    parameters split over the 16 data-parallel ranks, this rank's experts whole) and the Adam states,
    initialised at engine creation (initialize_optimizer_states steps once on zero gradients)."""

    def __init__(self, model, dp_world_size):
        masters = []
        for name, p in model.named_parameters():
            share = p.nbytes if name.startswith("fc") else p.nbytes // dp_world_size
            masters.append(torch.nn.Parameter(torch.empty(share // BF16, dtype=torch.float32, device="cuda")))
        self.single_partition_of_fp32_groups = masters
        self.optimizer = torch.optim.AdamW(masters, lr=1.2e-4, weight_decay=0.1)
        self.optimizer.step()


def main():
    model = GPTMoEModel()
    optimizer = DeepSpeedZeroOptimizer(model, dp_world_size=16)
    train_micro_batch_size_per_gpu, seq_length = 16, 4096
    tokens = train_micro_batch_size_per_gpu * seq_length
    for iteration in range(1, 300001):
        tokens_ids = act(tokens * 8, None, torch.uint8)
        logits = model(tokens_ids, tokens)
        # (loss, engine.backward, engine.step: never reached)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
