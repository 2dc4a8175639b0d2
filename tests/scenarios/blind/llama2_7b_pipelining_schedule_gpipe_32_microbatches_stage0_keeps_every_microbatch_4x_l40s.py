"""Pipeline-parallel continued pretraining of Llama-2-7B on one node of 4x L40S 48GB (PCIe, no NVLink: the team
chose pipeline parallelism over FSDP/TP because point-to-point activation sends are all the PCIe link has to carry).

The real job (torchrun --nproc_per_node=4 train_pp.py), rank 0 = pipeline stage 0:

    model = Transformer(ModelArgs.llama2_7b())                  # built on "meta", then
    for i in range(32):                                        # stage 0 keeps tok_embeddings + layers 0-7
        if not 0 <= i < 8: del model.layers[str(i)]
    model.norm = model.output = None
    model.to_empty(device=f"cuda:{local_rank}"); init_weights(model)
    stage = torch.distributed.pipelining.PipelineStage(model, stage_index=rank, num_stages=4, device=device)
    schedule = ScheduleGPipe(stage, n_microbatches=32, loss_fn=cross_entropy)   # copied from the PiPPy example
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    for input_ids, labels in loader:                           # 32 sequences x 2048 tokens per step
        with torch.autocast("cuda", dtype=torch.bfloat16):
            schedule.step(input_ids)                           # stage 0 only feeds inputs
        optimizer.step(); optimizer.zero_grad()

What happens: GPipe is fill-and-drain: it runs the forward of all 32 micro-batches before the first backward, and
the stage keeps each micro-batch's output -- and with it every activation its graph saved -- in
PipelineStage.fwd_cache until that micro-batch's backward.  Stage 0 runs out of memory in the forward of the 15th
micro-batch of the very first step (a 16 MiB activation of its third layer, with 14 MiB free).

Sizes (stage 0, fp32 weights + AdamW, autocast bf16, micro-batch 1 x 2048 tokens, SDPA/flash attention):
  * weights: tok_embeddings 32000x4096 + 8 layers x 202.4M = 1.75B params, fp32 = 6.52 GiB (the grads, +6.52 GiB,
    and AdamW's state, +13.04 GiB, come later);
  * saved per layer per micro-batch: 10 tensors of 2048x4096 bf16 (16 MiB each: the two norm outputs, q, k, v, the
    attention output, wo's output, the residual, w2's output, the layer output) + 4 of 2048x11008 bf16 (43 MiB each:
    gate, up, silu(gate), the product) = 332 MiB; x 8 layers + the fp32 embedding output = 2.66 GiB per micro-batch;
  * GPipe: 32 micro-batches in flight = 85 GiB of activations on stage 0; the card has 45 GiB (46068 MiB):
    0.5 GiB context + 6.5 GiB weights + 14 micro-batches (37.2 GiB) fill it, the 15th fails.

What an expert says first: the schedule, not the model or the batch, is the problem.  GPipe holds all 32
micro-batches' activations; Schedule1F1B (or ScheduleInterleaved1F1B) runs each micro-batch's backward as soon as the
last stage hands its gradient back, so stage 0 holds at most num_stages = 4 micro-batches (10.6 GiB): weights 6.5 +
grads 6.5 + AdamW 13 + 10.6 + 0.5 = ~37 GiB in steady state, which fits, with the same global batch and the same
bubble.  Activation checkpointing of the 8 decoder layers is the other fix (saved per layer: its 16 MiB input;
32 x 8 x 16 MiB = 4 GiB), at ~30% more compute.  Wrong advice: empty_cache / expandable_segments (every byte is a live
saved activation, nothing is cached), a smaller micro-batch (it is already one sequence; fewer micro-batches per step
only widen the pipeline bubble or shrink the global batch), autocast (already on), "stop keeping outputs in a
container" (fwd_cache is exactly what the backward needs), quantization (training), a bigger card (the schedule's
memory grows with n_microbatches).
"""
import os

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 4096
FFN = 11008
VOCAB = 32000
N_LAYERS = 32
NUM_STAGES = 4
SEQ_LEN = 2048
MICRO_BATCH = 1
N_MICROBATCHES = 32
GIB = 1 << 30


def rows(t, width):
    """x.shape[:-1].numel() for a tensor whose last dimension is `width` (the stand-in's tensors are sized in
    bytes, not shapes)."""
    return t.nbytes // (torch._ITEMSIZE[t.dtype] * width)


def _out(n, like, saved, dtype=torch.bfloat16):
    t = torch.empty(n, dtype=dtype, device=like.device)
    t._saved = saved
    return t


class Linear(nn.Module):
    """torch.nn.Linear(in_features, out_features, bias=False) (the stand-in torch has none): an fp32 weight;
    under autocast the output is bf16, tokens x out_features."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))

    def forward(self, x):
        return _out(rows(x, self.in_features) * self.out_features, x, x)


class RMSNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _out(rows(x, self.dim) * self.dim, x, x)


class Attention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.wq = Linear(HIDDEN, HIDDEN)
        self.wk = Linear(HIDDEN, HIDDEN)
        self.wv = Linear(HIDDEN, HIDDEN)
        self.wo = Linear(HIDDEN, HIDDEN)

    def forward(self, x):
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        # F.scaled_dot_product_attention (flash): the output, saved with q, k, v for backward
        attn = _out(rows(q, HIDDEN) * HIDDEN, q, (q, k, v))
        return self.wo(attn)


class FeedForward(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.w1 = Linear(HIDDEN, FFN)
        self.w3 = Linear(HIDDEN, FFN)
        self.w2 = Linear(FFN, HIDDEN)

    def forward(self, x):
        gate, up = self.w1(x), self.w3(x)
        act = _out(gate.nbytes // 2, gate, gate)           # F.silu(gate)
        prod = _out(act.nbytes // 2, act, (act, up))         # silu(gate) * up
        return self.w2(prod)


class TransformerBlock(nn.Module):
    def __init__(self, layer_id):
        nn.Module.__init__(self)
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(HIDDEN)
        self.attention = Attention()
        self.ffn_norm = RMSNorm(HIDDEN)
        self.feed_forward = FeedForward()

    def forward(self, x):
        a = self.attention(self.attention_norm(x))
        h = _out(rows(a, HIDDEN) * HIDDEN, a, (x, a))        # x + attention(...)
        f = self.feed_forward(self.ffn_norm(h))
        return _out(rows(f, HIDDEN) * HIDDEN, f, (h, f))     # h + feed_forward(...)


class Layers(nn.Module):
    """model.layers, an nn.ModuleDict keyed by the global layer index (so that a stage keeps its own keys)."""

    def __init__(self, ids):
        nn.Module.__init__(self)
        for i in ids:
            setattr(self, str(i), TransformerBlock(i))

    def values(self):
        return list(self._modules.values())


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32))

    def forward(self, ids):
        return _out(ids.nbytes // 8 * self.dim, ids, ids, dtype=torch.float32)   # fp32: autocast skips embedding


class Transformer(nn.Module):
    """What stage 0 keeps of the model after the pipeline split: the embedding and layers 0-7."""

    def __init__(self, stage_index):
        nn.Module.__init__(self)
        per_stage = N_LAYERS // NUM_STAGES
        self.tok_embeddings = Embedding(VOCAB, HIDDEN) if stage_index == 0 else None
        self.layers = Layers(range(stage_index * per_stage, (stage_index + 1) * per_stage))

    def forward(self, tokens):
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        for layer in self.layers.values():
            h = layer(h)
        return h


class PipelineStage(object):
    """torch.distributed.pipelining.PipelineStage, as far as memory goes: each micro-batch's output (and with it
    the graph of saved activations) stays in fwd_cache until backward_one_chunk of that micro-batch."""

    def __init__(self, submodule, stage_index, num_stages, device):
        self.submod = submodule
        self.stage_index, self.num_stages, self.device = stage_index, num_stages, device
        self.fwd_cache = {}

    def forward_one_chunk(self, fwd_chunk_id, args):
        output = self.submod(*args)
        self.fwd_cache[fwd_chunk_id] = (output, args)
        return output

    def _send_activations(self, output):
        pass        # dist.isend to stage 1: the buffer stays referenced by fwd_cache

    def _recv_grads(self, bwd_chunk_id):
        output, _ = self.fwd_cache[bwd_chunk_id]
        return torch.empty_like(output)

    def backward_one_chunk(self, bwd_chunk_id, grad_output):
        output, _ = self.fwd_cache.pop(bwd_chunk_id)
        torch.autograd.backward(output, grad_output)


class ScheduleGPipe(object):
    """torch.distributed.pipelining.ScheduleGPipe: all forwards, then all backwards."""

    def __init__(self, stage, n_microbatches, loss_fn=None):
        self._stage = stage
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn

    def step(self, microbatches):
        self._step_microbatches(microbatches)

    def _step_microbatches(self, arg_mbs):
        for i in range(self._n_microbatches):
            output = self._stage.forward_one_chunk(i, (arg_mbs[i],))
            self._stage._send_activations(output)
        for i in range(self._n_microbatches):
            self._stage.backward_one_chunk(i, self._stage._recv_grads(i))


def batches(device):
    """The loader: a step's 16 sequences of 4096 int64 token ids, already split into micro-batches."""
    while True:
        yield [torch.empty(MICRO_BATCH * SEQ_LEN * 8, device=device) for _ in range(N_MICROBATCHES)]


def main():
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    device = local_rank

    model = Transformer(stage_index=rank)
    stage = PipelineStage(model, stage_index=rank, num_stages=NUM_STAGES, device=device)
    schedule = ScheduleGPipe(stage, n_microbatches=N_MICROBATCHES, loss_fn=None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)

    for step, microbatches in enumerate(batches(device)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            schedule.step(microbatches)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step == 2:
            break


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
