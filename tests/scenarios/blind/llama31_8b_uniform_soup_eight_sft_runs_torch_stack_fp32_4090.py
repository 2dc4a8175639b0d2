"""soup.py -- a uniform "model soup" of eight supervised fine-tunes of Llama-3.1-8B-Instruct (same data, eight
seeds / learning rates from a sweep), averaged on the lab's workstation GPU, an RTX 4090 (24 GB).

Wortsman et al.'s uniform soup is just the mean of the state dicts.  The user wrote it "vectorised": for each of
the four safetensors shards, load that shard of all eight runs into CPU memory (8 x ~5 GB of host RAM, fine on a
128 GB box), then for each key move the eight copies to the GPU in float32 (the average of bf16 weights should
be taken in fp32), stack them and take the mean:

    for shard in SHARDS:                                   # model-0000{1..4}-of-00004.safetensors
        sds = [load_file(f"{run}/{shard}", device="cpu") for run in RUNS]
        soup = {}
        for k in sds[0].keys():
            stacked = torch.stack([sd[k].to("cuda", torch.float32) for sd in sds])
            soup[k] = stacked.mean(dim=0).to(torch.bfloat16).cpu()
        save_file(soup, f"soup/{shard}")

The same script souped eight Llama-3.2-1B runs last month in a minute.  On the 8B runs it dies on the very first
key of the first shard, model.embed_tokens.weight [128256, 4096]: the eight fp32 copies of the list are 8 x 1.96
GiB = 15.7 GiB, and torch.stack then asks for another 15.7 GiB in one request, with about 7.8 GiB free.  (For the
1B models the embedding is [128256, 2048]: 7.8 + 7.8 GiB fitted.)  Nothing else is on the GPU: no model, no
autograd, no optimizer.

An expert: the averaging holds 2N copies of the largest tensor (the list and the stack) where it needs two.  Keep
a running sum: acc = sd0[k].to("cuda", torch.float32); for sd in sds[1:]: acc.add_(sd[k].to("cuda",
torch.float32)); acc.div_(len(sds)) -- two fp32 copies of the embedding (3.9 GiB) at any time, whatever the
number of ingredients (or torch.lerp_ for a running mean, as an EMA does).  Equally good: do the mean on the
CPU (it is memory-bound; a minute per shard), or average the big tensors in row chunks.  All are exact in fp32.
Wrong first advice: smaller batch / gradient checkpointing / inference_mode / an 8-bit optimizer / ZeRO (there is
no model, no training, no autograd: the tensors come from safetensors and require no grad); empty_cache or
expandable_segments (nothing is cached or fragmented: one 15.7 GiB request against 7.8 GiB free); map_location /
loading on the CPU (the shards already are on the CPU); quantizing or averaging in bf16 (loses the precision
the fp32 average was for, and with 16 ingredients it fails again); a bigger GPU (a 48 GB card takes 8 runs and
fails at 12).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: safetensors.torch.load_file (CPU tensors), Tensor.to / torch.stack / Tensor.mean /
# Tensor.cpu of PyTorch.  Compiled as part of torch's file so that the failing line stays the program's own.
_GAPS = """
class _CPUTensor(object):
    is_cuda = False
    def __init__(self, shape, dtype):
        self.shape, self.dtype = tuple(shape), dtype
    def numel(self):
        n = 1
        for s in self.shape:
            n *= int(s)
        return n
    def to(self, device=None, dtype=None):
        t = torch.empty(self.numel(), dtype=dtype or self.dtype, device=device)
        t.shape = self.shape
        return t

def _numel(t):
    return t.nbytes // torch._ITEMSIZE[t.dtype]

def stack(tensors, dim=0):
    out = torch.empty(sum(_numel(t) for t in tensors), dtype=tensors[0].dtype, device=tensors[0].device)
    out.shape = (len(tensors),) + tuple(getattr(tensors[0], "shape", ()))
    return out

def _mean(self, dim=None):
    n = self.shape[dim] if dim is not None else 1
    out = torch.empty(_numel(self) // n, dtype=self.dtype, device=self.device)
    out.shape = self.shape[1:]
    return out

def _to(self, dtype=None):
    if dtype is None or dtype == self.dtype:
        return self
    out = torch.empty(_numel(self), dtype=dtype, device=self.device)
    out.shape = getattr(self, "shape", ())
    return out

def _cpu(self):
    return _CPUTensor(getattr(self, "shape", (_numel(self),)), self.dtype)

def load_file(filename, device="cpu"):
    return dict((k, _CPUTensor(shape, torch.bfloat16)) for k, shape in _SHARD_KEYS[filename.rsplit("/", 1)[-1]])
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.stack = _ns["stack"]
torch.Tensor.mean = _ns["_mean"]
torch.Tensor.to = _ns["_to"]
torch.Tensor.cpu = _ns["_cpu"]
load_file = _ns["load_file"]


def save_file(tensors, filename):
    """safetensors.torch.save_file: host tensors to disk."""
    pass
# ----

HIDDEN, INTER, KV, VOCAB, LAYERS = 4096, 14336, 1024, 128256, 32


def _layer_keys(i):
    p = "model.layers.%d." % i
    return [(p + "input_layernorm.weight", (HIDDEN,)),
            (p + "mlp.down_proj.weight", (HIDDEN, INTER)),
            (p + "mlp.gate_proj.weight", (INTER, HIDDEN)),
            (p + "mlp.up_proj.weight", (INTER, HIDDEN)),
            (p + "post_attention_layernorm.weight", (HIDDEN,)),
            (p + "self_attn.k_proj.weight", (KV, HIDDEN)),
            (p + "self_attn.o_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.q_proj.weight", (HIDDEN, HIDDEN)),
            (p + "self_attn.v_proj.weight", (KV, HIDDEN))]


def _shard(keys):
    return sorted(keys)           # safe_open(...).keys() is sorted


# the layout of meta-llama/Llama-3.1-8B-Instruct's four shards (model.safetensors.index.json)
_ns["_SHARD_KEYS"] = {
    "model-00001-of-00004.safetensors": _shard([("model.embed_tokens.weight", (VOCAB, HIDDEN))]
                                               + sum((_layer_keys(i) for i in range(0, 9)), [])),
    "model-00002-of-00004.safetensors": _shard(sum((_layer_keys(i) for i in range(9, 20)), [])),
    "model-00003-of-00004.safetensors": _shard(sum((_layer_keys(i) for i in range(20, 31)), [])),
    "model-00004-of-00004.safetensors": _shard([("lm_head.weight", (VOCAB, HIDDEN)), ("model.norm.weight", (HIDDEN,))]
                                               + _layer_keys(31)),
}
SHARDS = sorted(_ns["_SHARD_KEYS"])

RUNS = ["/ckpt/sft-llama31-8b/sweep-%02d/final" % i for i in range(8)]   # lr {1e-5, 2e-5} x 4 seeds


def main():
    print("uniform soup of %d runs" % len(RUNS))
    for shard in SHARDS:
        sds = [load_file("%s/%s" % (run, shard), device="cpu") for run in RUNS]
        soup = {}
        for k in sds[0].keys():
            stacked = torch.stack([sd[k].to("cuda", torch.float32) for sd in sds])
            soup[k] = stacked.mean(dim=0).to(torch.bfloat16).cpu()
            del stacked
        save_file(soup, "/ckpt/sft-llama31-8b/soup-uniform/%s" % shard)
        print("souped", shard, len(soup), "tensors")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
