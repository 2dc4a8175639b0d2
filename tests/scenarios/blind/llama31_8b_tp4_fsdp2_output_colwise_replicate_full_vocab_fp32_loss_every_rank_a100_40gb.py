"""2-D parallel continued pretraining of Llama-3.1-8B on one p4d node (8x A100-SXM4-40GB): FSDP2 over dp_shard=2
x tensor parallel over tp=4, sequence parallel on, full activation checkpointing, bf16 compute with fp32 sharded
weights, written by hand after the PyTorch tensor-parallel tutorial instead of using torchtitan.

The real job (torchrun --nproc_per_node=8 train_2d.py):

    mesh = init_device_mesh("cuda", (2, 4), mesh_dim_names=("dp", "tp"))
    for block in model.layers:
        parallelize_module(block, mesh["tp"], layer_plan)            # Colwise/Rowwise + SequenceParallel norms
        block = checkpoint_wrapper(block)
    parallelize_module(model, mesh["tp"], {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),   # <- from the tutorial
    })
    fully_shard(model, mesh=mesh["dp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    ...
    logits = model(input_ids)                                   # 4 sequences x 8192 tokens per dp rank
    loss = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(0, 1))

What happens: output_layouts=Replicate() makes the vocab-sharded lm-head all-gather its output, so every one of the
4 TP ranks holds the whole [4, 8192, 128256] logits; `.float()` copies them to fp32 and cross_entropy's log_softmax
makes a second fp32 tensor of the same size.  The first step's forward fails on that log_softmax (15.66 GiB).

Sizes per rank (A100 40GB = 40 GiB, 0.5 GiB CUDA context):
  * weights: 8.03B params / 8 (TP x FSDP), fp32 = 3.74 GiB (grads +3.74 GiB and AdamW +7.48 GiB later);
  * activations with full checkpointing + sequence parallel: each of the 32 layers saves its input,
    32768/4 tokens x 4096 x bf16 = 64 MiB -> 2 GiB (one layer's intermediates live at a time, ~0.7 GiB);
  * lm-head output, local shard: 32768 x 32064 x bf16 = 1.96 GiB; all-gathered to Replicate: 32768 x 128256 x bf16
    = 7.83 GiB (plus the same again for a moment: all_gather_into_tensor's buffer, then the cat along the vocab dim);
  * .float(): 15.66 GiB; log_softmax: 15.66 GiB -> 0.5 + 3.74 + 2 + 1.96 + 7.83 + 15.66 = 31.7 GiB, and the second
    15.66 GiB does not fit (7.8 GiB free).

What an expert says first: keep the logits vocab-sharded and compute the loss on the shards: output_layouts=Shard(-1),
use_local_output=False and the loss under torch.distributed.tensor.parallel.loss_parallel() (what torchtitan does):
each rank then holds 1/4 of the logits and of the fp32 loss temporaries (1.96 + 2 x 3.9 GiB instead of 7.83 +
2 x 15.66 GiB), ~28 GiB peak in steady state with grads and AdamW.  A chunked / fused linear-cross-entropy (the loss
computed over slices of the tokens without materialising all fp32 logits) is the other good fix.  Wrong advice:
empty_cache or expandable_segments (the memory is live tensors; the launch script, copied from torchtitan's
run_train.sh, already sets expandable_segments:True), gradient checkpointing (already full), quantization or a smaller
model, ZeRO/FSDP (already sharded: the weights are 3.7 GiB of the 40), stopping other processes (there are none).  A
smaller batch or shorter sequences would also make it fit, but they give up throughput to pay for a per-rank replica
of the logits that loss parallelism removes.
"""
import os

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DIM = 4096
N_LAYERS = 32
FFN = 14336
N_KV = 1024                 # 8 kv heads x 128
VOCAB = 128256
SEQ_LEN = 8192
LOCAL_BATCH = 4             # per dp rank
TP, DP = 4, 2
SHARDS = TP * DP


def numel(t):
    """t.numel() (the stand-in's tensors are sized in bytes)."""
    return t.nbytes // torch._ITEMSIZE[t.dtype]


def sharded_weight(rows, cols):
    """A weight as each rank holds it after parallelize_module + fully_shard: 1/8 of it, fp32."""
    return nn.Parameter(torch.empty(rows * cols // SHARDS, dtype=torch.float32))


class TransformerBlock(nn.Module):
    """attention + SwiGLU feed-forward, TP-sharded (Colwise wq/wk/wv/w1/w3, Rowwise wo/w2), norms sequence-parallel;
    wrapped by checkpoint_wrapper: only its input is saved, its intermediates live while it runs."""

    def __init__(self, layer_id):
        nn.Module.__init__(self)
        self.layer_id = layer_id
        self.wq = sharded_weight(DIM, DIM)
        self.wk = sharded_weight(DIM, N_KV)
        self.wv = sharded_weight(DIM, N_KV)
        self.wo = sharded_weight(DIM, DIM)
        self.w1 = sharded_weight(DIM, FFN)
        self.w3 = sharded_weight(DIM, FFN)
        self.w2 = sharded_weight(FFN, DIM)
        self.attention_norm = nn.Parameter(torch.empty(DIM, dtype=torch.float32))
        self.ffn_norm = nn.Parameter(torch.empty(DIM, dtype=torch.float32))

    def forward(self, h):
        tokens = numel(h) // DIM * TP                          # sequence-parallel input: 1/TP of the tokens
        # under checkpoint: these are freed when the block returns and recomputed in backward
        gathered = torch.empty(tokens * DIM, dtype=torch.bfloat16, device=h.device)       # all-gather for wq/wk/wv
        mlp = [torch.empty(tokens * FFN // TP, dtype=torch.bfloat16, device=h.device) for _ in range(3)]
        del gathered, mlp
        out = torch.empty(numel(h), dtype=torch.bfloat16, device=h.device)
        out._saved = h
        return out


class ColwiseParallelOutput(nn.Module):
    """model.output after ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()): the weight is
    vocab-sharded; the local logits [B, S, V/TP] are all-gathered along the vocab dim to a Replicate DTensor and
    handed back as a plain full-vocab tensor (use_local_output=True)."""

    def __init__(self, dim, vocab):
        nn.Module.__init__(self)
        self.weight = sharded_weight(dim, vocab)
        self.vocab = vocab
        self.output_layouts = "Replicate"

    def forward(self, h):
        tokens = numel(h) // DIM * TP
        local = torch.empty(tokens * self.vocab // TP, dtype=torch.bfloat16, device=h.device)
        local._saved = h
        if self.output_layouts == "Replicate":
            return self._redistribute_to_replicate(local)
        return local

    def _redistribute_to_replicate(self, local):
        # funcol.all_gather_tensor: [TP, B*S, V/TP], then cat along the last dim -> [B*S, V]
        gather_buf = torch.empty(numel(local) * TP, dtype=torch.bfloat16, device=local.device)
        full = torch.empty(numel(local) * TP, dtype=torch.bfloat16, device=local.device)
        full._saved = local
        del gather_buf
        return full


class Transformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.tok_embeddings = sharded_weight(VOCAB, DIM)
        self.blocks = []
        for i in range(N_LAYERS):
            block = TransformerBlock(i)
            setattr(self, "layers_%d" % i, block)
            self.blocks.append(block)
        self.norm = nn.Parameter(torch.empty(DIM, dtype=torch.float32))
        self.output = ColwiseParallelOutput(DIM, VOCAB)

    def forward(self, tokens):
        n_tokens = tokens.nbytes // 8
        h = torch.empty(n_tokens // TP * DIM, dtype=torch.bfloat16, device=tokens.device)   # Shard(1) after embed
        h._saved = tokens
        for block in self.blocks:
            h = block(h)
        return self.output(h)


def to_float32(t):
    """t.float(): a float32 copy (the stand-in's Tensor has no .float())."""
    out = torch.empty(numel(t), dtype=torch.float32, device=t.device)
    out._saved = t
    out._params = t._params       # in t's autograd graph
    return out


def cross_entropy_loss(pred, labels):
    return F.cross_entropy(to_float32(pred), labels)


def main():
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local_rank)
    model = Transformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.95), weight_decay=0.1)
    for step in range(1000):
        input_ids = torch.empty(LOCAL_BATCH * SEQ_LEN * 8, device=local_rank)    # int64 token ids
        labels = torch.empty(LOCAL_BATCH * SEQ_LEN * 8, device=local_rank)
        logits = model(input_ids)                 # bf16 compute: FSDP2's MixedPrecisionPolicy, no autocast
        loss = cross_entropy_loss(logits, labels)
        del logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
