"""Tensor-parallel (TP=8) x FSDP (DP=4) training of a 34B code model whose script builds the WHOLE
model, in fp32, on every GPU before cutting it into shards.

The real program is a team's fork of a torchtitan-style trainer (train_tp.py) for continued
pretraining of a CodeLlama-34B-shaped model (48 layers, dim 8192, GQA 64/8 heads, FFN 22016, vocab
32016), launched with `torchrun --nnodes 4 --nproc-per-node 8 train_tp.py` on 4 nodes of 8 H100
80GB.  The sharding is right; the order is not:

    world_mesh = init_device_mesh("cuda", (4, 8), mesh_dim_names=("dp", "tp"))
    torch.cuda.set_device(local_rank)
    init_device = "cuda"                 # torchtitan: "meta"; changed while debugging on one GPU
    with torch.device(init_device):
        model = Transformer(model_args)  # fp32 (default dtype)
    model.init_weights()
    parallelize_module(model, world_mesh["tp"], tp_plan)    # ColwiseParallel / RowwiseParallel
    for block in model.layers.values():
        fully_shard(block, mesh=world_mesh["dp"], mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16))
    fully_shard(model, mesh=world_mesh["dp"])

While debugging a 2-layer config on one GPU someone set init_device = "cuda" (to_empty on a meta
model "did not work" with their custom RoPE buffer); the change went into the 34B run.  Each of the
32 ranks now materializes the full 33.7B-parameter model in fp32 on its own GPU before
parallelize_module ever runs:
  tok_embeddings 32016 x 8192 x 4 B                                              = 0.98 GiB
  one TransformerBlock  (2 x 8192^2 + 2 x 8192 x 1024 + 3 x 8192 x 22016) x 4 B  = 2.58 GiB
  48 blocks + output                                                             = 125.6 GiB
  the card: 79.6 GiB, 79.1 GiB after the CUDA context
Every rank dies inside Transformer.__init__, building block 30 (the 31st of 48): a 688 MiB request
(its w1, one 8192 x 22016 fp32 FFN weight) with 78.9 GiB allocated and 267 MiB free.  After sharding, a rank would hold
33.7e9 x 4 B / 32 = 3.9 GiB of fp32 parameters.

What an expert says first: never materialize the full model on each GPU -- build it on the meta
device (with torch.device("meta")), apply parallelize_module / fully_shard, then
model.to_empty(device="cuda") and init_weights() (or load the DCP shards): each GPU only ever holds
its own 1/32.  (Building it in bf16 would squeeze the 63 GiB full copy onto the card, but is still
the whole model per GPU and loses the fp32 master weights the FSDP mixed-precision policy expects.)
Wrong advice: smaller batch, gradient checkpointing, flash-attention, shorter sequences (nothing has
run yet: no activations), expandable_segments / empty_cache (nothing freed or cached), quantization
or inference_mode (training), an 8-bit optimizer (no optimizer exists yet), a bigger GPU (the job
already has 32 of them).
"""
import os

import torch

import scen_truth

scen_truth.note_every_empty(torch)


class ModelArgs(object):
    dim = 8192
    n_layers = 48
    n_heads = 64
    n_kv_heads = 8
    vocab_size = 32016
    ffn_dim = 22016
    norm_eps = 1e-5
    rope_theta = 1_000_000
    max_seq_len = 16384


TP_DEGREE = 8
SEQ_LEN = 16384
LOCAL_BATCH_SIZE = 1


class Linear(torch.nn.Module):
    """nn.Linear(in_features, out_features, bias=False), its weight made on the current default device."""

    def __init__(self, in_features, out_features, device=None, dtype=None):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features * in_features, dtype=dtype or torch.get_default_dtype(),
                                                     device=device))


class Embedding(torch.nn.Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(num_embeddings * embedding_dim,
                                                     dtype=dtype or torch.get_default_dtype(), device=device))


class RMSNorm(torch.nn.Module):
    def __init__(self, dim, eps=1e-5, device=None):
        torch.nn.Module.__init__(self)
        self.eps = eps
        self.weight = torch.nn.Parameter(torch.empty(dim, dtype=torch.get_default_dtype(), device=device))


class Attention(torch.nn.Module):
    def __init__(self, args, device=None):
        torch.nn.Module.__init__(self)
        head_dim = args.dim // args.n_heads
        self.n_heads, self.n_kv_heads, self.head_dim = args.n_heads, args.n_kv_heads, head_dim
        self.wq = Linear(args.dim, args.n_heads * head_dim, device=device)
        self.wk = Linear(args.dim, args.n_kv_heads * head_dim, device=device)
        self.wv = Linear(args.dim, args.n_kv_heads * head_dim, device=device)
        self.wo = Linear(args.n_heads * head_dim, args.dim, device=device)


class FeedForward(torch.nn.Module):
    def __init__(self, dim, hidden_dim, device=None):
        torch.nn.Module.__init__(self)
        self.w1 = Linear(dim, hidden_dim, device=device)
        self.w2 = Linear(hidden_dim, dim, device=device)
        self.w3 = Linear(dim, hidden_dim, device=device)


class TransformerBlock(torch.nn.Module):
    def __init__(self, layer_id, args, device=None):
        torch.nn.Module.__init__(self)
        self.layer_id = layer_id
        self.attention = Attention(args, device=device)
        self.feed_forward = FeedForward(args.dim, args.ffn_dim, device=device)
        self.attention_norm = RMSNorm(args.dim, args.norm_eps, device=device)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps, device=device)


class Transformer(torch.nn.Module):
    def __init__(self, args, device=None):
        torch.nn.Module.__init__(self)
        self.args = args
        self.tok_embeddings = Embedding(args.vocab_size, args.dim, device=device)
        self.layers = torch.nn.Module()            # nn.ModuleDict, keys "0".."47" as torchtitan keeps them
        for layer_id in range(args.n_layers):
            setattr(self.layers, str(layer_id), TransformerBlock(layer_id, args, device=device))
        self.norm = RMSNorm(args.dim, args.norm_eps, device=device)
        self.output = Linear(args.dim, args.vocab_size, device=device)

    def init_weights(self):
        pass                                       # trunc_normal_ per weight, in place


def parallelize_module(model, tp_rank, tp_degree):
    """torch.distributed.tensor.parallel.parallelize_module with the Colwise/Rowwise plan: each weight
    replaced by its 1/tp_degree DTensor shard (the full tensor is dropped afterwards)."""
    for m in model.modules():
        w = m._parameters.get("weight")
        if w is not None and isinstance(m, Linear):
            m.weight = torch.nn.Parameter(torch.empty(w.nbytes // tp_degree, dtype=torch.uint8, device=w.device))
    return model


def fully_shard(module, dp_degree):
    """torch.distributed._composable.fsdp.fully_shard over the dp mesh dimension (no memory here)."""
    return module


def main():
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ["LOCAL_RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dp_degree = world_size // TP_DEGREE
    tp_rank, dp_rank = rank % TP_DEGREE, rank // TP_DEGREE
    # dist.init_process_group("nccl"); world_mesh = init_device_mesh("cuda", (dp_degree, TP_DEGREE), ...)
    torch.cuda.set_device(local_rank)

    model_args = ModelArgs()
    init_device = "cuda"                  # torchtitan: "meta" -- then model.to_empty(device="cuda") after sharding
    model = Transformer(model_args, device=init_device)
    model.init_weights()

    model = parallelize_module(model, tp_rank, TP_DEGREE)
    for layer_id in range(model_args.n_layers):
        fully_shard(model.layers._modules[str(layer_id)], dp_degree)
    fully_shard(model, dp_degree)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1.5e-5, betas=(0.9, 0.95), weight_decay=0.1)
    if rank == 0:
        print("model sharded: tp=%d dp=%d" % (TP_DEGREE, dp_degree))
    return model, optimizer


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
