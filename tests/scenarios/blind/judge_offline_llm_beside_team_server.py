"""judge.py -- an offline LLM-as-judge run (vLLM 0.5's offline engine, Llama-3-8B-Instruct, bf16)
scoring 2,000 answer pairs, started on an 80 GiB H100 that the team already serves a Mistral-7B
endpoint from (`vllm serve ... --gpu-memory-utilization 0.45`, 36 GiB, started days ago from
another shell).  The judge script keeps vLLM's defaults:

    llm = LLM(model="meta-llama/Meta-Llama-3-8B-Instruct", dtype="bfloat16")   # gpu_memory_utilization=0.9
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))

The engine loads its weights (15 GiB), profiles one forward pass, then sizes its KV cache as 90% of
the card minus its own peak -- 55 GiB, as if the card were its own -- and allocates it layer by layer;
the 18th layer's cache tensor fails: the server's 36 GiB were never in the budget.

An expert: another process holds 36 GiB of this GPU; the engine's default pre-reserves 90% of the
whole card; give the judge its share (gpu_memory_utilization=0.4, or max_model_len/max_num_seqs
smaller), or stop/move the team's server for the run.  Not a smaller batch, not quantization (the
cache would still claim 90% of the card), not the allocator's settings.

Run with --team-server, the same file is the team's endpoint (the case's background process).
"""
import os
import sys
import time

GiB = 1 << 30
MiB = 1 << 20


def team_server():
    """`vllm serve mistralai/Mistral-7B-Instruct-v0.3 --gpu-memory-utilization 0.45`, started long ago
    from another shell: it is no child of whatever starts the judge (the intermediate process exits
    once the server is up and the server lives on, reparented)."""
    ready = os.environ.get("SCEN_READY")
    if os.fork():
        while ready and not os.path.exists(ready):
            time.sleep(0.05)
        os._exit(0)
    import torch
    held = [torch.empty(512 * MiB, device="cuda") for _ in range(27)]           # weights, 13.5 GiB
    held += [torch.empty(688 * MiB, device="cuda") for _ in range(32)]          # its KV cache, 21.5 GiB
    if ready:
        open(ready, "w").close()
    for _ in range(600):
        time.sleep(1)


if "--team-server" in sys.argv:
    team_server()
    sys.exit(0)

import torch  # noqa: E402

import scen_truth  # noqa: E402

scen_truth.note_every_empty(torch)

L, H, I, V = 32, 4096, 14336, 128256


class SamplingParams(object):
    def __init__(self, temperature=1.0, max_tokens=16):
        self.temperature, self.max_tokens = temperature, max_tokens


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(V * H * 2, device="cuda"), requires_grad=False)
        self.layers = []
        for i in range(L):
            layer = torch.nn.Module()
            layer.qkv_proj = torch.nn.Parameter(torch.empty(H * (H + 2048) * 2, device="cuda"), requires_grad=False)
            layer.o_proj = torch.nn.Parameter(torch.empty(H * H * 2, device="cuda"), requires_grad=False)
            layer.gate_up_proj = torch.nn.Parameter(torch.empty(H * 2 * I * 2, device="cuda"), requires_grad=False)
            layer.down_proj = torch.nn.Parameter(torch.empty(I * H * 2, device="cuda"), requires_grad=False)
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(V * H * 2, device="cuda"), requires_grad=False)

    def forward(self, num_tokens):
        acts = [torch.empty(num_tokens * I * 2 * 2, device="cuda") for _ in range(6)]
        return torch.empty(num_tokens * 8, device="cuda")


class CacheEngine(object):
    def __init__(self, num_gpu_blocks, block_bytes_per_layer):
        self.gpu_cache = self._allocate_kv_cache(num_gpu_blocks, block_bytes_per_layer)

    def _allocate_kv_cache(self, num_blocks, block_bytes_per_layer):
        kv_cache = []
        for _ in range(L):
            kv_cache.append(torch.empty(num_blocks * block_bytes_per_layer, device="cuda"))
        return kv_cache


class Worker(object):
    def __init__(self, gpu_memory_utilization):
        self.gpu_memory_utilization = gpu_memory_utilization
        torch.cuda.init()
        self.init_gpu_memory = torch.cuda.mem_get_info()[0]

    def load_model(self):
        self.model = LlamaForCausalLM()

    def determine_num_available_blocks(self, max_num_batched_tokens=8192):
        with torch.inference_mode():
            self.model(max_num_batched_tokens)                  # the profiling run
        free_gpu_memory, total_gpu_memory = torch.cuda.mem_get_info()
        peak_memory = self.init_gpu_memory - free_gpu_memory    # this process's own peak only
        torch.cuda.empty_cache()
        cache_block_size = 16 * 2 * 8 * 128 * 2 * L             # block of 16 tokens, K and V, 8 KV heads
        num_gpu_blocks = int((total_gpu_memory * self.gpu_memory_utilization - peak_memory) // cache_block_size)
        return num_gpu_blocks, cache_block_size // L

    def initialize_cache(self, num_gpu_blocks, block_bytes_per_layer):
        self.cache_engine = CacheEngine(num_gpu_blocks, block_bytes_per_layer)


class LLM(object):
    def __init__(self, model, dtype="auto", gpu_memory_utilization=0.9, max_model_len=None):
        self.worker = Worker(gpu_memory_utilization)
        self.worker.load_model()
        num_gpu_blocks, per_layer = self.worker.determine_num_available_blocks()
        print("# GPU blocks: %d" % num_gpu_blocks)
        self.worker.initialize_cache(num_gpu_blocks, per_layer)

    def generate(self, prompts, sampling_params):
        return ["" for _ in prompts]


def main():
    pairs = [("question %d" % i, "answer a", "answer b") for i in range(2000)]
    prompts = ["Which answer is better? %s\nA: %s\nB: %s" % p for p in pairs]
    llm = LLM(model="meta-llama/Meta-Llama-3-8B-Instruct", dtype="bfloat16")
    outputs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16))
    print(len(outputs))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
