"""serve.py -- the platform team's in-house LLM server ("nanoserve", forked from nano-vllm: one paged KV-cache
pool, continuous batching) serving Llama-3.1-8B-Instruct in bf16.  It ran for months on whole GPUs.  The cluster's
GPU Operator now splits the A100-SXM4-80GB nodes with MIG (strategy "mixed"), and the deployment asks for a slice:

    resources:
      limits:
        nvidia.com/mig-3g.40gb: 1

The pod starts, loads the weights (15 GiB), runs its profiling forward pass, and dies sizing the KV-cache pool.
The team had replaced nano-vllm's torch.cuda.mem_get_info() with NVML because the same helper feeds their
Prometheus exporter:

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    total = pynvml.nvmlDeviceGetMemoryInfo(handle).total          # the GPU's memory
    budget = int(total * cfg.gpu_memory_utilization) - weights_bytes - peak_activation_bytes
    num_blocks = budget // block_bytes
    self.kv_cache = torch.empty(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim, dtype=torch.bfloat16)

Under MIG, handle index 0 is the parent A100, not the pod's slice (that needs nvmlDeviceGetMigDeviceHandleByIndex),
and its memory info is the whole card's 80 GiB.  So the pool is 0.9 x 80 GiB - 14.96 GiB (weights) - 1.56 GiB
(the profiled activations) = 55.5 GiB (1,775 blocks of 256 tokens) in one request, on a 39.25 GiB slice where
23.7 GiB are free after the weights.

An expert: the KV pool is sized from the wrong total -- the parent GPU's, not the MIG slice the process sees.  Size
it from what CUDA reports (torch.cuda.mem_get_info(): 39.25 GiB total), or cap it (num_gpu_blocks /
max_num_seqs x max_model_len): 0.9 x 39.25 - 14.96 - 1.56 = 18.8 GiB, about 154,000 tokens of Llama-3.1-8B's
128 KiB each, plenty for the service.
Wrong first advice: quantizing the weights (the pool is total x 0.9 minus the weights: smaller weights make it ask
for more), CPU offload, a smaller batch (max_num_seqs does not enter this formula), a bigger GPU or the
whole A100 (the point of MIG is to share it; the slice serves this model fine), other processes (a MIG slice's
memory is its own: no other pod can hold it), expandable_segments / empty_cache (one request 2.3x the free
memory), inference_mode (no autograd here).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30


# ---- stand-in gap: pynvml (nvidia-ml-py).  In a pod given a MIG slice, nvmlDeviceGetHandleByIndex(0) is the parent
# GPU and nvmlDeviceGetMemoryInfo(parent).total its whole memory (81920 MiB on an A100-SXM4-80GB), whatever slice
# CUDA shows the process.
class _Memory(object):
    def __init__(self, total, used):
        self.total, self.used, self.free = total, used, total - used


class pynvml(object):
    _PARENT_TOTAL = 81920 * MiB      # A100-SXM4-80GB, the GPU the MIG slice is carved from

    @staticmethod
    def nvmlInit():
        pass

    @staticmethod
    def nvmlDeviceGetHandleByIndex(index):
        return ("gpu", index)

    @staticmethod
    def nvmlDeviceGetMemoryInfo(handle):
        return _Memory(pynvml._PARENT_TOTAL, 14 * GiB)
# ----


class EngineConfig(object):
    model = "meta-llama/Llama-3.1-8B-Instruct"
    gpu_memory_utilization = 0.90
    max_num_batched_tokens = 16384
    max_num_seqs = 256
    max_model_len = 8192
    kvcache_block_size = 256


class LlamaConfig(object):
    vocab_size = 128256
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_key_value_heads = 8
    head_dim = 128


def load_weights(c):
    """safetensors shards straight onto the GPU (bf16), tensor by tensor."""
    w = []
    kv = c.num_key_value_heads * c.head_dim
    w.append(torch.empty(c.vocab_size * c.hidden_size, dtype=torch.bfloat16, device="cuda"))      # embed_tokens
    for _ in range(c.num_hidden_layers):
        for n in (c.hidden_size * c.hidden_size, c.hidden_size * kv, c.hidden_size * kv, c.hidden_size * c.hidden_size,
                  c.hidden_size * c.intermediate_size, c.hidden_size * c.intermediate_size,
                  c.intermediate_size * c.hidden_size, c.hidden_size, c.hidden_size):
            w.append(torch.empty(n, dtype=torch.bfloat16, device="cuda"))
    w.append(torch.empty(c.hidden_size, dtype=torch.bfloat16, device="cuda"))                    # norm
    w.append(torch.empty(c.hidden_size * c.vocab_size, dtype=torch.bfloat16, device="cuda"))     # lm_head
    return w


class ModelRunner(object):
    def __init__(self, cfg):
        self.cfg = cfg
        self.hf = LlamaConfig()
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        torch.set_default_dtype(torch.bfloat16)
        self.weights = load_weights(self.hf)
        self.weights_bytes = sum(t.nbytes for t in self.weights)
        print("loaded %s: %.2f GiB" % (cfg.model, self.weights_bytes / GiB), flush=True)
        self.warmup_model()
        self.allocate_kv_cache()

    def warmup_model(self):
        """A forward pass over max_num_batched_tokens dummy tokens, to measure the activations' peak."""
        torch.cuda.reset_peak_memory_stats()
        c, t = self.hf, self.cfg.max_num_batched_tokens
        with torch.inference_mode():
            hidden = torch.empty(t * c.hidden_size, dtype=torch.bfloat16, device="cuda")
            qkv = torch.empty(t * (c.hidden_size + 2 * c.num_key_value_heads * c.head_dim), dtype=torch.bfloat16,
                              device="cuda")
            attn = torch.empty(t * c.hidden_size, dtype=torch.bfloat16, device="cuda")
            del qkv
            gate_up = torch.empty(t * 2 * c.intermediate_size, dtype=torch.bfloat16, device="cuda")
            act = torch.empty(t * c.intermediate_size, dtype=torch.bfloat16, device="cuda")
            del gate_up, act, attn
            logits = torch.empty(self.cfg.max_num_seqs * c.vocab_size, dtype=torch.float32, device="cuda")
            del logits, hidden
        self.peak_activation_bytes = torch.cuda.max_memory_allocated() - self.weights_bytes

    def allocate_kv_cache(self):
        c, cfg = self.hf, self.cfg
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(int(os.environ.get("LOCAL_RANK", 0)))
        total = pynvml.nvmlDeviceGetMemoryInfo(handle).total
        block_bytes = 2 * c.num_hidden_layers * cfg.kvcache_block_size * c.num_key_value_heads * c.head_dim * 2
        budget = int(total * cfg.gpu_memory_utilization) - self.weights_bytes - self.peak_activation_bytes
        num_blocks = budget // block_bytes
        print("KV cache: %d blocks of %d tokens (%.2f GiB; GPU total %.2f GiB, activations peak %.2f GiB)" % (
            num_blocks, cfg.kvcache_block_size, num_blocks * block_bytes / GiB, total / GiB,
            self.peak_activation_bytes / GiB), flush=True)
        # torch.empty(2, num_layers, num_blocks, block_size, num_kv_heads, head_dim)
        self.kv_cache = torch.empty(num_blocks * block_bytes // 2, dtype=torch.bfloat16, device="cuda")


def main():
    cfg = EngineConfig()
    runner = ModelRunner(cfg)
    print("serving on :8000", flush=True)
    return runner


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
