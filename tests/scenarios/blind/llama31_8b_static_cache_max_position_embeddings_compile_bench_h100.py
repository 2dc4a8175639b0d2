"""bench_static_cache.py -- a serving team's latency benchmark for Llama-3.1-8B-Instruct (8.03B parameters,
bf16: 14.96 GiB) on one H100 80GB, following Hugging Face's "static kv-cache and torch.compile" recipe: a
StaticCache so the decode step has fixed shapes, and the forward compiled with mode="reduce-overhead" (CUDA
graphs).  To make sure torch.compile compiles once for every prompt of their eval set (prompts up to 6k
tokens, answers up to 2k) and never recompiles on a longer one, the engineer sized the cache to the model's
context, "the longest anything can ever be":

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
    past_key_values = StaticCache(config=model.config, max_batch_size=8,
                                  max_cache_len=model.config.max_position_embeddings,   # 131072
                                  device=model.device, dtype=model.dtype)
    for batch in batches(prompts, 8):
        out = model.generate(**batch, past_key_values=past_key_values, max_new_tokens=2048)

StaticCache preallocates, in its constructor, one key and one value tensor per layer of
[max_batch_size, num_key_value_heads, max_cache_len, head_dim] = [8, 8, 131072, 128] bf16 = 2 GiB each: 64
tensors, 128 GiB in all, before a single token is generated.  The weights (15 GiB) are in; the constructor
fails at layer 15's value tensor (a 2 GiB request) with 62 GiB of cache already allocated and under 2 GiB
free on the 79.2 GiB card.  The same script with max_cache_len=4096 was fine last week (4 GiB of cache).

An expert: the KV cache is preallocated for 131072 positions x 8 sequences; size it for the benchmark:
max_cache_len = longest prompt + max_new_tokens (8192 here: 8 GiB), or bucket prompts into a few cache
lengths (one compiled graph per bucket), or fewer concurrent sequences.  The weights are not the problem.
Wrong first advice: quantizing the weights or offloading them to the CPU (15 GiB of weights; 128 GiB of
cache would still not fit), a bigger GPU (no single GPU holds 143 GiB), tensor parallelism over more GPUs for
an 8B model, mixed precision (already bf16), inference_mode / no_grad (generate already runs without
autograd; the cache is plain zeros), gradient checkpointing (no training), flash attention (the cache is
preallocated whatever the kernel), expandable_segments or empty_cache (nothing is cached or fragmented; the
64 tensors are live), a smaller max_new_tokens alone (the cache length is max_cache_len, not the request).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.zeros (a C function in PyTorch, no Python frame of its own) and torch.compile
# (lazy: it wraps the function and compiles at the first call, which this run never reaches).  Compiled as
# part of torch's file, so that the failing line stays where PyTorch's would be.
_GAPS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)

def compile(model=None, *, fullgraph=False, dynamic=None, backend="inductor", mode=None, options=None,
            disable=False):
    def compiled(*args, **kwargs):
        return model(*args, **kwargs)
    compiled._torchdynamo_orig_callable = model
    return compiled
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
if not hasattr(torch, "zeros"):
    torch.zeros = _ns["zeros"]
torch.compile = _ns["compile"]

# ---- stand-in gap: transformers (cache_utils.StaticCache as 4.44 lays it out; from_pretrained places the
# checkpoint's tensors on the GPU in the checkpoint's dtype, tensor by tensor)
_TRANSFORMERS = """
class StaticCache(Cache):
    def __init__(self, config, max_batch_size, max_cache_len=None, device=None, dtype=torch.float32):
        self.max_batch_size = max_batch_size
        self.max_cache_len = config.max_position_embeddings if max_cache_len is None else max_cache_len
        self.head_dim = config.hidden_size // config.num_attention_heads
        self.dtype = dtype
        self.num_key_value_heads = config.num_key_value_heads
        self.key_cache = []
        self.value_cache = []
        cache_shape = (max_batch_size, self.num_key_value_heads, self.max_cache_len, self.head_dim)
        for idx in range(config.num_hidden_layers):
            new_layer_key_cache = torch.zeros(cache_shape, dtype=self.dtype, device=device)
            new_layer_value_cache = torch.zeros(cache_shape, dtype=self.dtype, device=device)
            self.key_cache.append(new_layer_key_cache)
            self.value_cache.append(new_layer_value_cache)
"""


class Cache(object):
    pass


_tns = {"torch": torch, "Cache": Cache}
exec(compile(_TRANSFORMERS, "/usr/local/lib/python3.10/dist-packages/transformers/cache_utils.py", "exec"), _tns)
StaticCache = _tns["StaticCache"]


class LlamaConfig(object):
    """meta-llama/Llama-3.1-8B-Instruct config.json."""
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    vocab_size = 128256
    max_position_embeddings = 131072
    rope_theta = 500000.0
    torch_dtype = "bfloat16"


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"))


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        h, kv = c.hidden_size, c.num_key_value_heads * (c.hidden_size // c.num_attention_heads)
        self.q_proj = _weight(h * h)
        self.k_proj = _weight(h * kv)
        self.v_proj = _weight(h * kv)
        self.o_proj = _weight(h * h)
        self.gate_proj = _weight(h * c.intermediate_size)
        self.up_proj = _weight(h * c.intermediate_size)
        self.down_proj = _weight(c.intermediate_size * h)
        self.input_layernorm = _weight(h)
        self.post_attention_layernorm = _weight(h)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.embed_tokens = _weight(c.vocab_size * c.hidden_size)
        for i in range(c.num_hidden_layers):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(c))
        self.norm = _weight(c.hidden_size)
        self.lm_head = _weight(c.vocab_size * c.hidden_size)
        self.device = "cuda:0"
        self.dtype = torch.bfloat16

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return cls(LlamaConfig()).eval()

    def forward(self, input_ids=None, past_key_values=None, **kw):
        raise NotImplementedError("not reached in this run")


def batches(items, n):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def main():
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda")
    nparams = sum(p.nbytes for p in model.parameters()) // 2
    print("loaded Llama-3.1-8B-Instruct: %.2fB parameters, %.2f GiB in bf16" % (nparams / 1e9,
                                                                              2.0 * nparams / (1 << 30)))
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

    # one cache length for everything: compile once, never recompile on a long prompt
    past_key_values = StaticCache(config=model.config, max_batch_size=8,
                                  max_cache_len=model.config.max_position_embeddings,
                                  device=model.device, dtype=model.dtype)
    prompts = ["eval prompt %d" % i for i in range(64)]
    for batch in batches(prompts, 8):
        input_ids = torch.empty(8 * 6144 * 8, device="cuda")      # int64 token ids, padded left to 6144
        model.generate(input_ids=input_ids, past_key_values=past_key_values, max_new_tokens=2048)
    print("done")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
