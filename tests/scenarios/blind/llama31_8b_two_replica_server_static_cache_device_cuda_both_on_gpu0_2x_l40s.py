"""serve.py -- an internal assistant for a support team: a small FastAPI service on one box with two L40S
(48 GB each), one replica of Llama-3.1-8B-Instruct (bf16, 15 GiB) per GPU behind a round-robin queue.  For
latency the engineer follows the transformers guide on static caches and torch.compile: each replica gets a
StaticCache sized for its batcher (16 concurrent requests, 8k context: 32 layers x (K, V) x [16, 8, 8192,
128] bf16 = 16 GiB) and a compiled forward.  Start-up builds the replicas in a loop:

    replicas = []
    for i in range(torch.cuda.device_count()):
        model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16).to(f"cuda:{i}")
        model.eval()
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        cache = StaticCache(config=model.config, max_batch_size=16, max_cache_len=8192,
                            device="cuda", dtype=torch.bfloat16)        # copied from the single-GPU example
        replicas.append(Replica(model, cache))

device="cuda" means the current CUDA device, and nothing here changes it: it is cuda:0 for both replicas.
Replica 0 ends with 15 GiB of weights and its 16 GiB cache on GPU 0; replica 1's weights go to GPU 1, and
its cache goes to GPU 0 as well, where it runs out after about 13 of its 16 GiB -- while GPU 1 holds nothing
but replica 1's weights and has 29 GiB free.  (Had the cache fitted, the first request to replica 1 would
have failed with "Expected all tensors to be on the same device".)

An expert: the second cache is on the wrong GPU.  Create each replica's cache on its model's device
(device=model.device), or select the GPU before building each replica (torch.cuda.set_device(i) /
`with torch.cuda.device(i):`), so that "cuda" means cuda:i.  Then each L40S holds 15 GiB of weights + 16 GiB
of cache, as planned.
Wrong first advice: a smaller KV cache or max batch (halves both replicas' capacity for a placement bug),
quantizing the weights, a bigger GPU, expandable_segments / empty_cache (one request of 256 MiB, nothing
cached), fewer CUDA-graph shapes (nothing has been captured yet), stopping other processes (there are none).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# ---- stand-in gaps, under the file names of the code they stand for:
# torch.zeros (a C function in PyTorch), torch.compile (lazy: nothing is compiled or captured before the first
# call), torch._dynamo.mark_static_address (a tag, no memory); Module.to / _apply as PyTorch runs them.
_TORCH = '''
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    return torch.empty(n, dtype=dtype or torch.get_default_dtype(), device=device)


def compile(model=None, mode=None, fullgraph=False, dynamic=None, backend="inductor"):
    return model


class _Dynamo(object):
    @staticmethod
    def mark_static_address(t, guard=True):
        t._dynamo_static_input_type = "unguarded"
'''
_ns = {"torch": torch}
exec(compile(_TORCH, torch.__file__, "exec"), _ns)
torch.zeros, torch.compile, torch._dynamo = _ns["zeros"], _ns["compile"], _ns["_Dynamo"]()

_MODULE_TO = '''
def _apply(self, fn, recurse=True):
    for module in self.modules():
        for key, param in list(module._parameters.items()):
            if param is None:
                continue
            param_applied = fn(param)
            if param_applied is not param:
                module._parameters[key] = torch.nn.Parameter(param_applied, param.requires_grad)
    return self


def to(self, *args, **kwargs):
    dev = kwargs.get("device", args[0] if args else None)
    index = torch.cuda._device_index(dev)

    def convert(t):
        if getattr(t, "is_cuda", False) and t.device == index:
            return t
        return torch.empty(t.nbytes // torch._ITEMSIZE[t.dtype], dtype=t.dtype, device=index)
    return self._apply(convert)
'''
_ns = {"torch": torch}
exec(compile(_MODULE_TO, torch.__file__.replace("__init__.py", "nn/modules/module.py"), "exec"), _ns)
torch.nn.Module._apply = _ns["_apply"]
torch.nn.Module.to = _ns["to"]

# transformers 4.44's StaticCache (transformers/cache_utils.py): one key and one value tensor per layer, of
# [max_batch_size, num_key_value_heads, max_cache_len, head_dim], made with torch.zeros on `device`.
_CACHE_UTILS = '''
class Cache(object):
    pass


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
            torch._dynamo.mark_static_address(new_layer_key_cache)
            torch._dynamo.mark_static_address(new_layer_value_cache)
            self.key_cache.append(new_layer_key_cache)
            self.value_cache.append(new_layer_value_cache)
'''
_ns = {"torch": torch}
exec(compile(_CACHE_UTILS, "/usr/local/lib/python3.11/site-packages/transformers/cache_utils.py", "exec"), _ns)
StaticCache = _ns["StaticCache"]
# ----


class HostParameter(object):
    """A parameter as from_pretrained leaves it without a device_map: read into host memory."""
    is_cuda = False
    device = "cpu"
    requires_grad = True

    def __init__(self, numel, dtype):
        self.dtype = dtype
        self.nbytes = numel * torch._ITEMSIZE[dtype]


class LlamaConfig(object):
    vocab_size = 128256
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    max_position_embeddings = 131072


def _host_module(**shapes):
    m = torch.nn.Module()
    for name, numel in shapes.items():
        m._parameters[name] = HostParameter(numel, BF16)
    return m


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        h, i = cfg.hidden_size, cfg.intermediate_size
        kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
        self.model = torch.nn.Module()
        self.model.embed_tokens = _host_module(weight=cfg.vocab_size * h)
        self.model.layers = torch.nn.Module()
        for n in range(cfg.num_hidden_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            for proj, numel in (("q_proj", h * h), ("k_proj", kv * h), ("v_proj", kv * h), ("o_proj", h * h)):
                setattr(layer.self_attn, proj, _host_module(weight=numel))
            layer.mlp = torch.nn.Module()
            for proj in ("gate_proj", "up_proj", "down_proj"):
                setattr(layer.mlp, proj, _host_module(weight=h * i))
            layer.input_layernorm = _host_module(weight=h)
            layer.post_attention_layernorm = _host_module(weight=h)
            setattr(self.model.layers, str(n), layer)
        self.model.norm = _host_module(weight=h)
        self.lm_head = _host_module(weight=cfg.vocab_size * h)

    @property
    def device(self):
        return "cuda:%d" % self.model.embed_tokens.weight.device

    def forward(self, input_ids=None, past_key_values=None, cache_position=None, **kw):
        raise NotImplementedError("not reached in this start-up")


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, **kw):
        return LlamaForCausalLM(LlamaConfig())


class Replica(object):
    def __init__(self, model, cache):
        self.model, self.cache = model, cache


MAX_BATCH = 16        # the batcher's concurrent requests per replica
MAX_CONTEXT = 8192    # prompt + answer


def build_replicas():
    replicas = []
    for i in range(torch.cuda.device_count()):
        model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16).to(f"cuda:{i}")
        model.eval()
        model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
        cache = StaticCache(config=model.config, max_batch_size=MAX_BATCH, max_cache_len=MAX_CONTEXT,
                            device="cuda", dtype=torch.bfloat16)
        replicas.append(Replica(model, cache))
        print("replica %d ready (cuda:%d: %.1f GiB allocated)" % (
            i, i, torch.cuda.memory_allocated(i) / 2 ** 30), flush=True)
    return replicas


def main():
    print("startup: %d x NVIDIA L40S, %s" % (torch.cuda.device_count(), MODEL), flush=True)
    replicas = build_replicas()
    print("serving on :8000 with %d replicas" % len(replicas))
    # uvicorn.run(app, host="0.0.0.0", port=8000)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
