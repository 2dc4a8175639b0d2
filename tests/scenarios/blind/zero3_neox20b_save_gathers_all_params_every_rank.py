"""finetune_neox.py -- full fine-tuning of GPT-NeoX-20B with DeepSpeed ZeRO-3 (optimizer offloaded to
CPU, activation checkpointing, micro batch 1 x 2048 tokens) on one p4d.24xlarge (8x A100 40GB), launched
with `torchrun --nproc-per-node 8 finetune_neox.py --deepspeed ds_zero3_offload.json`.

Training runs fine in under 10 GB a GPU.  Every --save_steps the script writes a Hugging Face
checkpoint with its own helper:

    def save_hf_checkpoint(engine, out_dir):
        # gather the full weights so save_pretrained sees real tensors, not ZeRO-3 placeholders
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
            if dist.get_rank() == 0:
                engine.module.save_pretrained(out_dir, safe_serialization=True)
        dist.barrier()

The user: "the first checkpoint kills all eight ranks with CUDA OOM; training itself never uses more
than 10 GB of the 40."

What happens: GatheredParameters over ALL parameters all-gathers every one of them at once, on every
rank (it is a collective: rank 0 writes, but all eight materialise): the whole 41 GB of bf16 weights
(44 layers of 906 MB, embeddings and the output head of 620 MB each) on top of each rank's 5 GB
ZeRO-3 partition and the 1 GB gradient bucket, on a 40 GB card.  Every rank runs out part way through
the gather (around layer 39).

An expert: never unshard the whole model on the GPU to save it.  Save each rank's shard
(engine.save_checkpoint, then consolidate offline on the CPU with zero_to_fp32.py), or let DeepSpeed
gather one module at a time to rank 0's CPU memory (stage3_gather_16bit_weights_on_model_save: true with
engine.save_16bit_model / the HF Trainer's save_model).  Not ZeRO-3 (it is ZeRO-3 already), not a
smaller batch, checkpointing or bf16 (training fits; activations are gone at the save), not the
cache, not a bigger GPU: the job trains in under 10 of 40 GB.
"""
import os
import subprocess
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, VOCAB = 6144, 24576, 44, 50432
SEQ, MICRO_BATCH = 2048, 1
SAVE_STEPS = 3                 # --save_steps 500 in the real run; the failure is the same


def launch(nproc):
    """torchrun --nproc-per-node nproc: one process per GPU, each told who it is."""
    procs = []
    for r in range(nproc):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT="29500", TORCHELASTIC_RUN_ID="neox20b-sft")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    failed = [p.wait() for p in procs]
    return 1 if any(failed) else 0


# ---- ZeRO-3, as far as memory goes: each parameter is a placeholder whose ds_tensor is this rank's
# 1/world_size partition; small parameters (norms, biases) stay whole ("persistent")
PERSISTENCE_THRESHOLD = 10 * HIDDEN


def zero3_param(numel, world, device):
    if numel <= PERSISTENCE_THRESHOLD:
        return nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device=device))
    p = nn.Parameter(torch.empty(0, dtype=torch.bfloat16, device=device))
    p.ds_numel = numel
    p.ds_tensor = torch.empty((numel + world - 1) // world, dtype=torch.bfloat16, device=device)
    return p


class Linear(nn.Module):
    def __init__(self, n_in, n_out, world, device):
        nn.Module.__init__(self)
        self.weight = zero3_param(n_in * n_out, world, device)
        self.bias = zero3_param(n_out, world, device)


class LayerNorm(nn.Module):
    def __init__(self, world, device):
        nn.Module.__init__(self)
        self.weight = zero3_param(HIDDEN, world, device)
        self.bias = zero3_param(HIDDEN, world, device)


class GPTNeoXLayer(nn.Module):
    def __init__(self, world, device):
        nn.Module.__init__(self)
        self.input_layernorm = LayerNorm(world, device)
        self.post_attention_layernorm = LayerNorm(world, device)
        self.query_key_value = Linear(HIDDEN, 3 * HIDDEN, world, device)
        self.dense = Linear(HIDDEN, HIDDEN, world, device)
        self.dense_h_to_4h = Linear(HIDDEN, FFN, world, device)
        self.dense_4h_to_h = Linear(FFN, HIDDEN, world, device)

    def forward(self, hidden):
        # the layer's weights are gathered for the forward and released after it (ZeRO-3 fetch/release)
        fetched = [torch.empty(p.ds_numel, dtype=torch.bfloat16) for p in self.parameters() if hasattr(p, "ds_tensor")]
        out = torch.empty(MICRO_BATCH * SEQ * FFN, dtype=torch.bfloat16)      # the MLP's inner activation
        del fetched
        out._saved = hidden
        return out


class Embedding(nn.Module):
    def __init__(self, world, device):
        nn.Module.__init__(self)
        self.weight = zero3_param(VOCAB * HIDDEN, world, device)


class Layers(nn.Module):
    pass


class GPTNeoXForCausalLM(nn.Module):
    def __init__(self, world, device):
        nn.Module.__init__(self)
        self.embed_in = Embedding(world, device)
        self.layers = Layers()
        for i in range(LAYERS):
            setattr(self.layers, str(i), GPTNeoXLayer(world, device))
        self.final_layer_norm = LayerNorm(world, device)
        self.embed_out = Embedding(world, device)

    def forward(self, input_ids):
        h = torch.empty(MICRO_BATCH * SEQ * HIDDEN, dtype=torch.bfloat16)
        checkpoints = []
        for i in range(LAYERS):
            layer = getattr(self.layers, str(i))
            checkpoints.append(h)                       # activation checkpointing keeps the layer inputs
            h = layer(h)
            h = torch.empty(MICRO_BATCH * SEQ * HIDDEN, dtype=torch.bfloat16)
        logits = torch.empty(MICRO_BATCH * SEQ * VOCAB * 4)                     # fp32 logits for the loss
        logits._saved = checkpoints
        return logits


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    """the fp32 master weights and Adam moments live in CPU memory (offload_optimizer: cpu)"""

    def __init__(self, params, lr=1e-5):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr))


class DeepSpeedEngine(object):
    def __init__(self, module, world, device):
        self.module = module
        self.world, self.device = world, device
        self.optimizer = DeepSpeedCPUAdam([])
        # reduce_bucket_size 5e8: the bucket gradients are reduce-scattered through before going to the CPU
        self.ipg_buffer = torch.empty(500000000, dtype=torch.bfloat16)

    def __call__(self, input_ids):
        return self.module(input_ids)

    def backward(self, loss):
        loss._saved = None           # recomputation and reduce-scatter; the partitions' gradients go to the CPU

    def step(self):
        self.optimizer.step()


class GatheredParameters(object):
    """deepspeed.zero.GatheredParameters(params, modifier_rank): all-gathers each partitioned parameter
    into a full tensor on every rank for the duration of the with block."""

    def __init__(self, params, modifier_rank=None):
        self.params = [p for p in params if hasattr(p, "ds_tensor")]
        self.placeholders = []

    def __enter__(self):
        for p in self.params:
            self._all_gather(p)
        return self

    def _all_gather(self, p):
        """param.data = the gathered full tensor (the placeholder's data replaced, as ZeRO-3 does;
        in the stand-in a Parameter's data is its _base)"""
        full = torch.empty(p.ds_numel, dtype=torch.bfloat16)
        self.placeholders.append((p, p._base))
        p._base, p.nbytes = full, full.nbytes

    def __exit__(self, *exc):
        for p, placeholder in self.placeholders:        # partitioned again: the placeholder back
            p._base, p.nbytes = placeholder, placeholder.nbytes
        del self.placeholders[:]
        return False


def save_hf_checkpoint(engine, out_dir, rank):
    with GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
        if rank == 0:
            os.makedirs(out_dir, exist_ok=True)


def main():
    local_rank, rank, world = int(os.environ["LOCAL_RANK"]), int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(local_rank)
    # test scaffolding: the truth mark at the failing allocation itself
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))

    model = GPTNeoXForCausalLM(world, local_rank)          # deepspeed.zero.Init: built partitioned
    engine = DeepSpeedEngine(model, world, local_rank)
    for step in range(1, 10000):
        input_ids = torch.empty(MICRO_BATCH * SEQ * 8)
        loss = engine(input_ids)
        engine.backward(loss)
        engine.step()
        del loss, input_ids
        if step % SAVE_STEPS == 0:
            save_hf_checkpoint(engine, os.path.join(os.environ.get("TMPDIR", "/tmp"), "ckpt-%d" % step), rank)


if __name__ == "__main__":
    if "LOCAL_RANK" not in os.environ:
        sys.exit(launch(8))
    try:
        main()
    except torch.OutOfMemoryError:
        raise                      # marked by the observer above
    sys.exit(0)
