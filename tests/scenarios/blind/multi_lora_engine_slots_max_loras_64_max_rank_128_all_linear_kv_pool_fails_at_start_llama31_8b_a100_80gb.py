"""engine/start.py -- a B2B assistant platform serves one fine-tuned LoRA adapter per customer on a shared
Llama-3.1-8B-Instruct base (bf16, 14.96 GiB), with the team's own engine on one NVIDIA A100-SXM4-80GB
(81920 MiB).  Adapters are hot-swapped: to make a swap a copy into preallocated memory (no allocation, no
recompile of the Punica-style batched LoRA kernels), the engine preallocates LoRA "slots" at start, one
per adapter that may be resident, each as wide as the largest rank allowed, for every targeted module:

    # engine/lora.py
    for layer in model.layers:
        for name, (d_in, d_out) in lora_targets(layer, cfg.lora.target_modules).items():
            layer.lora_a[name] = torch.zeros((cfg.lora.max_loras, cfg.lora.max_lora_rank, d_in), dtype=torch.bfloat16, device="cuda")
            layer.lora_b[name] = torch.zeros((cfg.lora.max_loras, d_out, cfg.lora.max_lora_rank), dtype=torch.bfloat16, device="cuda")
    # engine/kv.py: the paged KV pool, a fixed share of the card
    num_blocks = int(cfg.kv_cache.fraction_of_total * total_memory) // block_bytes

Until last week the config said max_loras: 16, max_lora_rank: 64 (10 GiB of slots), with the KV pool at
0.35 of the card (28 GiB) and 26 GiB to spare.  Then the platform passed 60 customers and the legal
team's new adapter came back from training at r=128, so the config became:

    lora:
      max_loras: 64            # "one slot per customer, no more swapping"
      max_lora_rank: 128       # the legal adapter
      target_modules: [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj]
    kv_cache:
      fraction_of_total: 0.35

The deploy's engine dies at start, in the KV pool: layer 28's block tensor (896 MiB) with 0.8 GiB free.
The slots take 40.0 GiB (64 slots x rank 128 x 81,920 elements a rank in a layer's seven modules --
8192 + 5120 + 5120 + 8192 + 3 x 18432 -- x 32 layers x 2 bytes), the weights 14.96 GiB, the 27 KV layers
made so far 23.6 GiB.

An expert: the memory is the LoRA slots, not the KV cache that failed: 40 GiB reserved for 64 adapters
at rank 128, while a batch seldom holds more than 8 distinct adapters and 58 of the 61 adapters are
r=16.  A slot is needed per adapter *in a batch*, not per customer: keep all adapters in host memory (a
CPU LRU, swapped into a slot in milliseconds) and set max_loras to the distinct adapters a batch may
mix (8-16); size max_lora_rank for the common case (16 or 32) and serve the r=128 adapter from its own
deployment or truncate it (SVD to r=32).  16 slots at rank 32: 2.5 GiB.  (Engines that page LoRA
weights and KV in one pool, as S-LoRA does, avoid reserving unused rank at all.)
Wrong first advice: a smaller KV pool (the failing line, but the pool is what serves traffic: shrinking
it to start the engine cuts concurrency while 38 GiB of slots sit idle), quantizing the base (frees 10
GiB; the slots still take 40), tensor parallelism over two GPUs, a bigger GPU (an H200's 141 GB would
hold this and fail at max_loras: 128), expandable_segments / empty_cache (nothing is cached or
fragmented at start), a smaller batch or shorter sequences (the KV pool is a fixed share of the card,
whatever they are), inference_mode or gradient checkpointing (nothing is trained), "use LoRA" (it is
LoRA already).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: torch.zeros (a C function in PyTorch, no Python frame of its own), compiled as part
# of torch's file so that the failing line of the program stays the program's own.
_ZEROS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)
"""
if not hasattr(torch, "zeros"):
    _ns = {"torch": torch}
    exec(compile(_ZEROS, torch.__file__, "exec"), _ns)
    torch.zeros = _ns["zeros"]
# ----

GiB = 2.0 ** 30
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256

CONFIG = {   # engine.yaml, as deployed
    "model": "meta-llama/Llama-3.1-8B-Instruct",
    "lora": {"max_loras": 64, "max_lora_rank": 128,
             "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]},
    "kv_cache": {"fraction_of_total": 0.35, "block_size": 16},
    "scheduler": {"max_num_seqs": 128, "max_model_len": 32768},
}

SHAPES = {"q_proj": (HIDDEN, HEADS * HEAD_DIM), "k_proj": (HIDDEN, KV_HEADS * HEAD_DIM),
          "v_proj": (HIDDEN, KV_HEADS * HEAD_DIM), "o_proj": (HEADS * HEAD_DIM, HIDDEN),
          "gate_proj": (HIDDEN, INTER), "up_proj": (HIDDEN, INTER), "down_proj": (INTER, HIDDEN)}


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, (d_in, d_out) in SHAPES.items():
            setattr(self, name, _weight(d_in * d_out))
        self.input_layernorm = _weight(HIDDEN)
        self.post_attention_layernorm = _weight(HIDDEN)
        self.lora_a, self.lora_b = {}, {}


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = DecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)


def lora_targets(layer, target_modules):
    return dict((name, SHAPES[name]) for name in target_modules)


def init_lora_slots(model, cfg):
    for layer in model.layers:
        for name, (d_in, d_out) in lora_targets(layer, cfg["target_modules"]).items():
            layer.lora_a[name] = torch.zeros((cfg["max_loras"], cfg["max_lora_rank"], d_in), dtype=torch.bfloat16,
                                             device="cuda")
            layer.lora_b[name] = torch.zeros((cfg["max_loras"], d_out, cfg["max_lora_rank"]), dtype=torch.bfloat16,
                                             device="cuda")


def init_kv_pool(cfg):
    total = torch.cuda.get_device_properties(0).total_memory
    block_bytes = cfg["block_size"] * KV_HEADS * HEAD_DIM * 2 * 2 * LAYERS     # K and V, bf16, every layer
    num_blocks = int(cfg["fraction_of_total"] * total) // block_bytes
    print("KV pool: %d blocks of %d tokens (%.1f GiB)" % (num_blocks, cfg["block_size"], num_blocks * block_bytes / GiB))
    pool = []
    for _ in range(LAYERS):
        pool.append(torch.empty(2 * num_blocks * cfg["block_size"] * KV_HEADS * HEAD_DIM, dtype=torch.bfloat16,
                                device="cuda"))
    return pool, num_blocks


def main():
    print("engine: loading %s" % CONFIG["model"])
    model = LlamaForCausalLM()          # safetensors straight to the GPU, bf16
    print("weights: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))
    init_lora_slots(model, CONFIG["lora"])
    print("LoRA slots: %d x rank %d on %s: %.2f GiB allocated in all" % (
        CONFIG["lora"]["max_loras"], CONFIG["lora"]["max_lora_rank"], ",".join(CONFIG["lora"]["target_modules"]),
        torch.cuda.memory_allocated() / GiB))
    kv_pool, num_blocks = init_kv_pool(CONFIG["kv_cache"])
    print("engine ready")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
