"""Supervised fine-tuning of Llama-2-70B with PyTorch FSDP on four nodes of 8x A100-SXM4-80GB (32 ranks), bf16
mixed precision over fp32 sharded weights, activation checkpointing on every decoder layer.

The job ran with ShardingStrategy.FULL_SHARD.  After reading that "ZeRO-2 is faster because it skips the all-gather in
backward", the user switches one line:

    model = FSDP(model, auto_wrap_policy=partial(transformer_auto_wrap_policy,
                                                 transformer_layer_cls={LlamaDecoderLayer}),
                 sharding_strategy=ShardingStrategy.SHARD_GRAD_OP,          # was FULL_SHARD
                 mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16),
                 device_id=torch.cuda.current_device(), limit_all_gathers=True, use_orig_params=False)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, LlamaDecoderLayer))

What happens: SHARD_GRAD_OP does not reshard after forward: each decoder layer's all-gathered bf16 parameters stay
on the GPU from its forward until its backward, so by the end of the forward every rank would hold the whole
bf16 model.  Rank 0 runs out of memory in the first forward, in layer 44 of 80: its all-gather still fits, then a
224 MiB MLP intermediate (4096 x 28672 bf16) does not.

Sizes per rank (A100 80GB = 80 GiB, 0.5 GiB CUDA context):
  * sharded fp32 flat parameters: 69B / 32 x 4 bytes = 8.0 GiB (grads 8.0 GiB and AdamW 16 GiB come after the first
    backward and step: ~32 GiB of sharded state in steady state);
  * one decoder layer unsharded in bf16 (_full_param_padded): 856M params x 2 = 1.59 GiB; the whole bf16 model is
    128 GiB, more than the card;
  * saved activations with checkpointing: each layer keeps its input, 1 x 4096 tokens x 8192 x bf16 = 64 MiB;
  * the root unit (embed_tokens + lm_head) unsharded: 1 GiB;
  * 0.5 + 8.0 + 1 + 44 x (1.59 + 0.06) = 82 GiB wanted by the time layer 44 runs: the card is full inside it.
    ~0.75 GiB sits cached in pieces of earlier layers' freed intermediates; reclaiming it (expandable_segments) would
    let this one 224 MiB request through, and layer 45's 1.59 GiB all-gather would fail instead.

What an expert says first: go back to FULL_SHARD (ZeRO-3).  ZeRO-2 only pays when the unsharded model fits next to
the training state; a 70B model never fits on an 80 GB card in bf16.  With FULL_SHARD each layer's parameters are
freed right after its forward and all-gathered again in backward: ~1-2 layers unsharded at a time (3.2 GiB), ~40 GiB
per rank in steady state.  (HYBRID_SHARD would still unshard per layer and is the option to cut inter-node traffic.)
Wrong advice: a smaller batch or shorter sequences (the activations are 2.7 GiB of the 80 at the failure), gradient
checkpointing (already on), mixed precision (bf16 already), flash-attention, CPU offload of parameters
(offload_params keeps the sharded copy on the host but still gathers each layer onto the GPU and, under
SHARD_GRAD_OP, keeps it there), empty_cache / expandable_segments (0.75 GiB against a 128 GiB model), quantization
(full fine-tune), a bigger GPU (128 GiB of bf16 weights plus the training state).
"""
import os

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DIM = 8192
FFN = 28672
N_KV = 1024                     # 8 kv heads x 128
N_LAYERS = 80
VOCAB = 32000
SEQ_LEN = 4096
MICRO_BATCH = 1
LAYER_PARAMS = 2 * DIM * DIM + 2 * DIM * N_KV + 3 * DIM * FFN + 2 * DIM
ROOT_PARAMS = 2 * VOCAB * DIM + DIM


class FlatParameter(nn.Parameter):
    """torch.distributed.fsdp._flat_param.FlatParameter: this rank's fp32 shard; while the unit is unsharded,
    _full_param_padded holds the all-gathered parameters in the mixed-precision dtype."""
    _full_param_padded = None


class LlamaDecoderLayer(nn.Module):
    """The layer's own weights live in its FSDP unit's flat parameter (use_orig_params=False); wrapped by
    checkpoint_wrapper: its intermediates are freed as it returns and recomputed in backward."""

    def forward(self, hidden_states, full_params):
        tokens = hidden_states.nbytes // (2 * DIM)
        mlp = [torch.empty(tokens * FFN, dtype=torch.bfloat16, device=hidden_states.device) for _ in range(3)]
        del mlp
        out = torch.empty(tokens * DIM, dtype=torch.bfloat16, device=hidden_states.device)
        out._saved = hidden_states
        return out


class FullyShardedDataParallel(nn.Module):
    """torch.distributed.fsdp.FullyShardedDataParallel around one module, as far as memory goes."""

    def __init__(self, module, numel, world_size, sharding_strategy, param_dtype=torch.bfloat16):
        nn.Module.__init__(self)
        self._fsdp_wrapped_module = module
        self.world_size = world_size
        self.numel = numel
        self.sharding_strategy = sharding_strategy
        self.param_dtype = param_dtype
        self._reshard_after_forward = sharding_strategy in ("FULL_SHARD", "HYBRID_SHARD")
        self.flat_param = FlatParameter(torch.empty((numel + world_size - 1) // world_size, dtype=torch.float32))

    def _unshard(self):
        fp = self.flat_param
        if fp._full_param_padded is None:
            # _alloc_padded_unsharded_flat_param + all_gather_into_tensor of the bf16 shards
            fp._full_param_padded = torch.empty(fp.nbytes // 4 * self.world_size, dtype=self.param_dtype,
                                                device=fp.device)

    def _reshard(self):
        self.flat_param._full_param_padded = None        # _free_storage(flat_param._full_param_padded)

    def forward(self, *args):
        self._unshard()
        out = self._fsdp_wrapped_module(*args, self.flat_param._full_param_padded)
        if self._reshard_after_forward:
            self._reshard()
        return out


class LlamaForCausalLM(nn.Module):
    """The root FSDP unit's module: embed_tokens, norm and lm_head live in the root's flat parameter, each decoder
    layer is an FSDP unit of its own."""

    def __init__(self, world_size, sharding_strategy):
        nn.Module.__init__(self)
        self.layers = []
        for i in range(N_LAYERS):
            unit = FullyShardedDataParallel(LlamaDecoderLayer(), LAYER_PARAMS, world_size, sharding_strategy)
            setattr(self, "layers_%d" % i, unit)
            self.layers.append(unit)

    def forward(self, input_ids, root_params):
        tokens = input_ids.nbytes // 8
        h = torch.empty(tokens * DIM, dtype=torch.bfloat16, device=input_ids.device)      # embed_tokens
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        normed = torch.empty(tokens * DIM, dtype=torch.bfloat16, device=h.device)
        normed._saved = h
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device=h.device)     # lm_head
        logits._saved = normed
        return logits


SHARDING_STRATEGY = "SHARD_GRAD_OP"         # was "FULL_SHARD"


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    model = FullyShardedDataParallel(LlamaForCausalLM(world_size, SHARDING_STRATEGY), ROOT_PARAMS, world_size,
                                     SHARDING_STRATEGY)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    for step in range(1000):
        input_ids = torch.empty(MICRO_BATCH * SEQ_LEN * 8, device=local_rank)      # int64 ids
        labels = torch.empty(MICRO_BATCH * SEQ_LEN * 8, device=local_rank)
        logits = model(input_ids)
        loss = F.cross_entropy(logits, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
