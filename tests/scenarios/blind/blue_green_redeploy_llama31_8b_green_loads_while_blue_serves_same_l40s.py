"""server.py (green slot) -- a support-chat model server, refreshed in place every week by a blue/green deploy.
The service is Llama-3.1-8B-Instruct (fine-tuned weekly on resolved tickets, merged, bfloat16: 14.96 GiB of
weights) behind a small FastAPI app that decodes gpt-fast style: a static KV cache preallocated at start
(max_batch_size 8, max_cache_len 8192: 8 GiB) and torch.compile(mode="reduce-overhead").  deploy.sh was written
when the box had two L40S: it starts the new version in the idle slot, waits for /health, switches the nginx
upstream, then stops the old slot -- zero downtime:

    # deploy.sh
    start_slot "$NEW" "$MODEL_DIR/$VERSION"       # CUDA_VISIBLE_DEVICES=$(gpu_of "$NEW") uvicorn server:app ...
    wait_healthy "$NEW" && switch_upstream "$NEW" && stop_slot "$OLD"

    # server.py, lifespan()
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, torch_dtype=torch.bfloat16, device_map="cuda")
    cache = StaticCache(model.config, max_batch_size=8, max_cache_len=8192, device="cuda", dtype=torch.bfloat16)
    model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)

Last month the service moved to a single-GPU g6e.xlarge (one NVIDIA L40S, 46,068 MiB) and gpu_of() now answers 0
for both slots.  This week's deploy started green while blue (pid 2716941, up for 12 days) was serving with
27.3 GiB on the card: weights, its static cache, compiled graphs and cached blocks.  Green loaded its weights
(15 GiB fit in the 17.2 GiB left) and failed while allocating the static cache, at layer 8 of 32, a 128 MiB
key tensor with 107 MiB free.  The health check timed out, the deploy aborted, blue kept serving: no outage,
but the weekly refresh never ships.

An expert: this process asks for nothing unusual (the same 23 GiB that blue runs with); 27.3 GiB of the card
belong to another process -- the old replica, which the deploy keeps alive on purpose.  Two full replicas of
this service do not fit one 48 GB card.  Stop (drain) the old slot before starting the new one, put the
slots on separate GPUs again, or refresh in place: load the new state dict to CPU memory in the running
server and copy_ it into the live parameters.  Wrong advice: shrinking the new replica's KV cache or
batch, quantizing it, or offloading layers to the CPU (it would start crippled, and the crippled replica is
what then serves after blue stops), a bigger GPU, expandable_segments / empty_cache (this process caches
nothing; the memory is not its own), restarting this process (it starts fresh; blue is a live server, not a
leftover context).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
GiB = float(1 << 30)


class LlamaConfig(object):
    """meta-llama/Llama-3.1-8B-Instruct config.json"""
    vocab_size = 128256
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    head_dim = 128
    max_position_embeddings = 131072


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=BF16, device="cuda"), requires_grad=False)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        h, kv = c.hidden_size, c.num_key_value_heads * c.head_dim
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

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map=None):
        """transformers' from_pretrained with device_map="cuda": each safetensors shard's tensors are
        materialised straight on the GPU, in bfloat16 as stored."""
        return cls(LlamaConfig())


AutoModelForCausalLM = LlamaForCausalLM


class StaticCache(object):
    """transformers.StaticCache: for every layer a key and a value tensor of
    [max_batch_size, num_key_value_heads, max_cache_len, head_dim], allocated up front."""

    def __init__(self, config, max_batch_size, max_cache_len, device, dtype):
        shape = (max_batch_size, config.num_key_value_heads, max_cache_len, config.head_dim)
        n = 1
        for s in shape:
            n *= s
        self.key_cache, self.value_cache = [], []
        for layer in range(config.num_hidden_layers):
            self.key_cache.append(torch.empty(n, dtype=dtype, device=device))
            self.value_cache.append(torch.empty(n, dtype=dtype, device=device))


STATE = {}


def lifespan(model_dir):
    print("loading %s on %s" % (model_dir, "cuda:0"))
    model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.bfloat16, device_map="cuda")
    STATE["model"] = model
    nbytes = sum(p.nbytes for p in model.parameters())
    print("weights on GPU: %.2f GiB; free now %.2f GiB" % (nbytes / GiB, torch.cuda.mem_get_info()[0] / GiB))
    cache = StaticCache(model.config, max_batch_size=8, max_cache_len=8192, device="cuda", dtype=torch.bfloat16)
    STATE["cache"] = cache
    # model.forward = torch.compile(model.forward, mode="reduce-overhead", fullgraph=True); warm-up ...
    print("ready")


try:
    lifespan("/srv/models/support-llama31-8b/2025-w22-merged")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
