"""best_of_n.py -- rejection sampling for an SFT mix: 8 responses per prompt for 20,000 prompts with
Llama-3.1-8B-Instruct on vLLM, each scored by Skywork-Reward-Llama-3.1-8B-v0.2, the best kept.  One script,
one A100-SXM4-80GB (81,920 MiB), vllm 0.6.3 (the V0 engine: LLM() runs the model in this very process),
transformers 4.45, torch 2.4:

    llm = LLM("meta-llama/Meta-Llama-3.1-8B-Instruct", dtype="bfloat16", max_model_len=4096, seed=0)
    params = SamplingParams(n=8, temperature=0.8, top_p=0.95, max_tokens=1024)
    outputs = llm.generate(prompts, params)                    # 3 h 20 min

    rm = AutoModelForSequenceClassification.from_pretrained(
        "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2", torch_dtype=torch.bfloat16, device_map="cuda",
        attn_implementation="flash_attention_2", num_labels=1)
    for prompt, out in zip(prompts, outputs):
        ... rm(**tok.apply_chat_template(...)).logits ...  # pick the best of 8

Two 8B models in bfloat16 are 15 + 14 GiB: the author reckoned they fit an 80 GB card twice over.  The
generation finishes; loading the reward model fails half way (at its 16th of 32 decoder layers), and the 3
hours of generations, never written to disk, die with the process.

Why: vLLM sizes its KV cache by a setting, not by need.  At start-up it profiles a forward pass and then
hands the KV cache everything up to gpu_memory_utilization (default 0.9) of the card: here 28,839 blocks
of 16 tokens = 56.3 GiB of KV cache, on top of its 15 GiB of weights and its CUDA-graph pool.  vLLM's own
log said so ("# GPU blocks: 28839", "Maximum concurrency for 4096 tokens per request: 112.65x": 461k tokens
of cache for a batch that never holds more than a fraction of it).  What is left for anything else in the
process is under 10% of the card: 7.4 GiB, where the reward model needs 14 GiB.

An expert: the memory is vLLM's preallocated KV cache, sized by gpu_memory_utilization.  Give the engine
less (gpu_memory_utilization=0.5 still leaves it a 24 GiB KV cache, 12k blocks, 48 concurrent 4k-token
requests) so the reward model fits beside it; or, since generation is finished before scoring starts, run the two stages one after the other:
save the generations, free the engine (del llm, destroy_model_parallel, gc.collect(), empty_cache) or score
in a second script.  (And save the generations before loading anything else.)
Wrong first advice: quantizing the reward model (8-bit is still 7.5 GiB and hurts the scores; the 56 GiB
KV cache is the point), a smaller batch (nothing is batched: this is a weights load), mixed precision
(already bf16), empty_cache / expandable_segments (vLLM's cache is allocated tensors, not a cache of free
blocks), inference_mode, CPU offload of the reward model, a bigger GPU (vLLM takes 90% of any card).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SITE = "/opt/conda/lib/python3.11/site-packages/"
MiB = 1 << 20


def _library(relpath, src, **names):
    """Library code (vllm, transformers, accelerate) as it sits in site-packages: its frames show its files."""
    ns = {"torch": torch, "nn": torch.nn, "__name__": relpath[:-3].replace("/", ".")}
    ns.update(names)
    exec(compile(src, SITE + relpath, "exec"), ns)
    return ns


# ---- stand-in gaps (C builtins in PyTorch), compiled as part of torch's file
_GAPS = """
def zeros(n, dtype=None, device=None, pin_memory=False):
    return torch.empty(n, dtype=dtype, device=device)

def synchronize(device=None):
    pass

def _decorate(self, func):
    # torch.inference_mode() used as a decorator, as vLLM's workers use it
    def wrapper(*args, **kwargs):
        with type(self)():
            return func(*args, **kwargs)
    return wrapper
"""
_g = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _g)
torch.zeros = _g["zeros"]
torch.cuda.synchronize = _g["synchronize"]
torch.inference_mode.__call__ = _g["_decorate"]

# ---- vllm 0.6.3, as far as memory goes (sizes in elements of the dtype)
_LLAMA = """
HIDDEN, INTER, LAYERS, VOCAB, KV_HEADS, HEAD_DIM = 4096, 14336, 32, 128256, 8, 128


def _weight(n, dtype):
    # vLLM makes every parameter on the GPU (under `with torch.device("cuda")`), requires_grad=False,
    # and copies the safetensors weights into it
    return nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False)


class QKVParallelLinear(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.weight = _weight(HIDDEN * (HIDDEN + 2 * KV_HEADS * HEAD_DIM), dtype)


class RowParallelLinear(nn.Module):
    def __init__(self, n_in, n_out, dtype):
        nn.Module.__init__(self)
        self.weight = _weight(n_in * n_out, dtype)


class MergedColumnParallelLinear(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.weight = _weight(HIDDEN * 2 * INTER, dtype)


class RMSNorm(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.weight = _weight(HIDDEN, dtype)


class LlamaAttention(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.qkv_proj = QKVParallelLinear(dtype)
        self.o_proj = RowParallelLinear(HIDDEN, HIDDEN, dtype)


class LlamaMLP(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.gate_up_proj = MergedColumnParallelLinear(dtype)
        self.down_proj = RowParallelLinear(INTER, HIDDEN, dtype)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.self_attn = LlamaAttention(dtype)
        self.mlp = LlamaMLP(dtype)
        self.input_layernorm = RMSNorm(dtype)
        self.post_attention_layernorm = RMSNorm(dtype)


class VocabParallelEmbedding(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.weight = _weight(VOCAB * HIDDEN, dtype)


class LlamaModel(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.embed_tokens = VocabParallelEmbedding(dtype)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(dtype))
        self.norm = RMSNorm(dtype)


class LlamaForCausalLM(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.model = LlamaModel(dtype)
        self.lm_head = VocabParallelEmbedding(dtype)

    def forward(self, num_tokens, num_seqs):
        # a forward over num_tokens tokens: the residual stream, qkv, the MLP's gate_up and its activation;
        # logits for the last token of each sequence (float32 in the sampler)
        dt = torch.bfloat16
        hidden = torch.empty(num_tokens * HIDDEN, dtype=dt, device="cuda")
        residual = torch.empty(num_tokens * HIDDEN, dtype=dt, device="cuda")
        for i in range(LAYERS):
            qkv = torch.empty(num_tokens * (HIDDEN + 2 * KV_HEADS * HEAD_DIM), dtype=dt, device="cuda")
            attn = torch.empty(num_tokens * HIDDEN, dtype=dt, device="cuda")
            del qkv
            gate_up = torch.empty(num_tokens * 2 * INTER, dtype=dt, device="cuda")
            act = torch.empty(num_tokens * INTER, dtype=dt, device="cuda")
            del gate_up
            out = torch.empty(num_tokens * HIDDEN, dtype=dt, device="cuda")
            del act, attn
            hidden, out = out, None
        logits = torch.empty(num_seqs * VOCAB, dtype=torch.float32, device="cuda")
        probs = torch.empty(num_seqs * VOCAB, dtype=torch.float32, device="cuda")
        logprobs = torch.empty(num_seqs * VOCAB, dtype=torch.float32, device="cuda")
        del hidden, residual
        return logits, probs, logprobs
"""
_llama = _library("vllm/model_executor/models/llama.py", _LLAMA)

_CACHE_ENGINE = """
class CacheEngine(object):
    # one [2, num_blocks, block_size, num_kv_heads, head_size] tensor per layer, allocated once, up front
    def __init__(self, num_gpu_blocks, block_size=16, num_layers=32, num_kv_heads=8, head_size=128,
                 dtype=torch.bfloat16):
        self.num_gpu_blocks = num_gpu_blocks
        self.block_size = block_size
        self.gpu_cache = self._allocate_kv_cache(num_gpu_blocks, "cuda", num_layers, num_kv_heads, head_size,
                                                 dtype)

    def _allocate_kv_cache(self, num_blocks, device, num_layers, num_kv_heads, head_size, dtype):
        kv_cache_shape = (2, num_blocks, self.block_size, num_kv_heads, head_size)
        n = 1
        for s in kv_cache_shape:
            n *= s
        kv_cache = []
        for _ in range(num_layers):
            kv_cache.append(torch.zeros(n, dtype=dtype, device=device))
        return kv_cache
"""
_cache = _library("vllm/worker/cache_engine.py", _CACHE_ENGINE)

_MODEL_RUNNER = """
class ModelRunner(object):
    def __init__(self, max_num_batched_tokens, max_num_seqs):
        self.max_num_batched_tokens, self.max_num_seqs = max_num_batched_tokens, max_num_seqs
        self.model = None
        self.graph_memory_pool = None
        self.graph_runners = {}

    def load_model(self):
        self.model = LlamaForCausalLM(torch.bfloat16)
        gib = sum(p.nbytes for p in self.model.parameters()) / float(2 ** 30)
        print("INFO model_runner.py:1067] Loading model weights took %.4f GB" % gib)

    @torch.inference_mode()
    def profile_run(self):
        out = self.model(self.max_num_batched_tokens, self.max_num_seqs)
        del out
        torch.cuda.synchronize()

    @torch.inference_mode()
    def capture_model(self, kv_caches):
        print("INFO model_runner.py:1402] Capturing the model for CUDA graphs. This may lead to unexpected "
              "consequences if the model is not static. ...")
        # the 35 batch sizes 256, 248, ..., 2, 1 share one graph pool: the largest capture sizes it
        pool = (1, 1)
        self.graph_runners["static_buffers"] = [
            torch.empty(256 * 4096, dtype=torch.bfloat16, device="cuda", pool_id=pool),     # hidden states
            torch.empty(256 * 6144, dtype=torch.bfloat16, device="cuda", pool_id=pool),     # qkv
            torch.empty(256 * 28672, dtype=torch.bfloat16, device="cuda", pool_id=pool),    # gate_up
            torch.empty(256 * 128256, dtype=torch.bfloat16, device="cuda", pool_id=pool),   # logits (bf16)
            torch.empty(256 * 128256 * 2, dtype=torch.float32, device="cuda", pool_id=pool),  # sampler
            torch.empty(512 * MiB, dtype=torch.uint8, device="cuda", pool_id=pool),         # 35 graphs' workspaces
        ]
        print("INFO model_runner.py:1530] Graph capturing finished in 14 secs.")

    @torch.inference_mode()
    def execute_model(self, num_tokens, num_seqs):
        return self.model(num_tokens, num_seqs)
"""
_runner = _library("vllm/worker/model_runner.py", _MODEL_RUNNER, LlamaForCausalLM=_llama["LlamaForCausalLM"], MiB=MiB)

_WORKER = """
class Worker(object):
    def __init__(self, gpu_memory_utilization, max_num_batched_tokens, max_num_seqs):
        self.gpu_memory_utilization = gpu_memory_utilization
        self.model_runner = ModelRunner(max_num_batched_tokens, max_num_seqs)
        self.cache_engine = None
        self.gpu_cache = None

    def init_device(self):
        torch.cuda.set_device(0)
        torch.cuda.empty_cache()
        self.init_gpu_memory = torch.cuda.mem_get_info()[0]

    def load_model(self):
        self.model_runner.load_model()

    @torch.inference_mode()
    def determine_num_available_blocks(self):
        torch.cuda.empty_cache()
        self.model_runner.profile_run()
        torch.cuda.synchronize()
        free_gpu_memory, total_gpu_memory = torch.cuda.mem_get_info()
        peak_memory = self.init_gpu_memory - free_gpu_memory
        cache_block_size = 16 * 8 * 128 * 2 * 32 * 2        # block_size x kv heads x head dim x (k, v) x layers x bf16
        num_gpu_blocks = int((total_gpu_memory * self.gpu_memory_utilization - peak_memory) // cache_block_size)
        torch.cuda.empty_cache()
        return max(num_gpu_blocks, 0), 2048

    def initialize_cache(self, num_gpu_blocks, num_cpu_blocks):
        self.cache_engine = [CacheEngine(num_gpu_blocks)]
        self.gpu_cache = [self.cache_engine[0].gpu_cache]
        self.model_runner.capture_model(self.gpu_cache)
"""
_worker = _library("vllm/worker/worker.py", _WORKER, ModelRunner=_runner["ModelRunner"],
                   CacheEngine=_cache["CacheEngine"])

_LLM = """
class SamplingParams(object):
    def __init__(self, n=1, temperature=1.0, top_p=1.0, max_tokens=16, seed=None):
        self.n, self.temperature, self.top_p, self.max_tokens = n, temperature, top_p, max_tokens


class RequestOutput(object):
    def __init__(self, prompt, texts):
        self.prompt, self.outputs = prompt, texts


class GPUExecutor(object):
    def __init__(self, gpu_memory_utilization, max_model_len, max_num_seqs):
        self.driver_worker = Worker(gpu_memory_utilization, max(max_model_len, 2048), max_num_seqs)
        self.driver_worker.init_device()
        self.driver_worker.load_model()
        num_gpu_blocks, num_cpu_blocks = self.driver_worker.determine_num_available_blocks()
        print("INFO gpu_executor.py:122] # GPU blocks: %d, # CPU blocks: %d" % (num_gpu_blocks, num_cpu_blocks))
        print("INFO gpu_executor.py:126] Maximum concurrency for %d tokens per request: %.2fx"
              % (max_model_len, num_gpu_blocks * 16.0 / max_model_len))
        self.driver_worker.initialize_cache(num_gpu_blocks, num_cpu_blocks)


class LLMEngine(object):
    def __init__(self, model, dtype, max_model_len, gpu_memory_utilization, max_num_seqs):
        print("INFO llm_engine.py:237] Initializing an LLM engine (v0.6.3.post1) with config: model='%s', "
              "dtype=%s, max_seq_len=%d, gpu_memory_utilization=%s, ..." % (model, dtype, max_model_len,
                                                                         gpu_memory_utilization))
        self.model_executor = GPUExecutor(gpu_memory_utilization, max_model_len, max_num_seqs)

    def step(self, num_tokens, num_seqs):
        runner = self.model_executor.driver_worker.model_runner
        out = runner.execute_model(num_tokens, num_seqs)
        del out


class LLM(object):
    def __init__(self, model, dtype="auto", max_model_len=None, gpu_memory_utilization=0.9, seed=0,
                 max_num_seqs=256, tensor_parallel_size=1):
        self.llm_engine = LLMEngine(model, dtype, max_model_len, gpu_memory_utilization, max_num_seqs)

    def generate(self, prompts, sampling_params):
        # the scheduler's prefills (up to max_num_batched_tokens per step) and decodes (CUDA graphs);
        # a few representative steps here -- the stand-in computes nothing
        for _ in range(3):
            self.llm_engine.step(4096, 8)
        for _ in range(3):
            self.llm_engine.step(2816, 11)
        return [RequestOutput(p, ["..."] * sampling_params.n) for p in prompts]
"""
_vllm = _library("vllm/entrypoints/llm.py", _LLM, Worker=_worker["Worker"])
LLM, SamplingParams = _vllm["LLM"], _vllm["SamplingParams"]

# ---- transformers 4.45 + accelerate 0.34: from_pretrained(..., device_map="cuda") of a Llama reward model
_ACCEL = """
def set_module_tensor_to_device(module, tensor_name, device, value=None, dtype=None):
    # the checkpoint's tensor (host memory, from safetensors) copied into a new tensor on the device
    new_value = torch.empty(value, dtype=dtype, device=device)
    setattr(module, tensor_name, nn.Parameter(new_value))
"""
_accel = _library("accelerate/utils/modeling.py", _ACCEL)

_HF_LLAMA = """
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 128256, 1024


class LlamaRMSNorm(nn.Module):
    shapes = {"weight": HIDDEN}


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.shapes = {"weight": n_in * n_out}


class Embedding(nn.Module):
    shapes = {"weight": VOCAB * HIDDEN}


class LlamaSdpaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)


class LlamaFlashAttention2(LlamaSdpaAttention):
    pass


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = LlamaFlashAttention2()
        self.mlp = LlamaMLP()
        self.input_layernorm = LlamaRMSNorm()
        self.post_attention_layernorm = LlamaRMSNorm()


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding()
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.norm = LlamaRMSNorm()


class LlamaForSequenceClassification(nn.Module):
    def __init__(self, num_labels=1):
        nn.Module.__init__(self)
        self.num_labels = num_labels
        self.model = LlamaModel()
        self.score = Linear(HIDDEN, num_labels)
"""
_hf_llama = _library("transformers/models/llama/modeling_llama.py", _HF_LLAMA)

_HF_MODELING_UTILS = """
def _checkpoint_tensors(model):
    # the safetensors shards' tensors in file order: (module, name, numel); the model was built on the meta
    # device (init_empty_weights), so nothing is on the GPU until each is loaded
    for prefix, m in _walk(model, ""):
        for name, numel in sorted(getattr(m, "shapes", {}).items()):
            yield prefix + name, m, name, numel


def _walk(m, prefix):
    yield prefix, m
    for k, sub in m._modules.items():
        for item in _walk(sub, prefix + k.replace("layers_", "layers.") + "."):
            yield item


def _load_state_dict_into_meta_model(model, state_dict, start_prefix, expected_keys, device_map=None,
                                     dtype=None):
    for param_name, module, tensor_name, numel in state_dict:
        set_module_tensor_to_device(module, tensor_name, device_map[""], value=numel, dtype=dtype)


class PreTrainedModel(object):
    @classmethod
    def from_pretrained(cls, model_class, pretrained_model_name_or_path, torch_dtype=None, device_map=None,
                        attn_implementation=None, num_labels=None):
        model = model_class(num_labels=num_labels)
        device_map = {"": device_map}
        print("Loading checkpoint shards: 4 files (%s)" % pretrained_model_name_or_path)
        _load_state_dict_into_meta_model(model, _checkpoint_tensors(model), "", [], device_map=device_map,
                                         dtype=torch_dtype)
        return model.eval()
"""
_hf_utils = _library("transformers/modeling_utils.py", _HF_MODELING_UTILS,
                     set_module_tensor_to_device=_accel["set_module_tensor_to_device"])


class AutoModelForSequenceClassification(object):
    """transformers.AutoModelForSequenceClassification: config.json's "LlamaForSequenceClassification"."""

    @staticmethod
    def from_pretrained(name, torch_dtype=None, device_map=None, attn_implementation=None, num_labels=None):
        return _hf_utils["PreTrainedModel"].from_pretrained(
            _hf_llama["LlamaForSequenceClassification"], name, torch_dtype=torch_dtype, device_map=device_map,
            attn_implementation=attn_implementation, num_labels=num_labels)
# ----

POLICY = "meta-llama/Meta-Llama-3.1-8B-Instruct"
REWARD_MODEL = "Skywork/Skywork-Reward-Llama-3.1-8B-v0.2"


def load_prompts():
    # 20,000 prompts sampled from UltraFeedback + a slice of the team's own tickets (host memory)
    return ["prompt %d" % i for i in range(20000)]


def main():
    prompts = load_prompts()
    llm = LLM(POLICY, dtype="bfloat16", max_model_len=4096, seed=0)
    params = SamplingParams(n=8, temperature=0.8, top_p=0.95, max_tokens=1024)
    outputs = llm.generate(prompts, params)
    print("generated %d x %d responses" % (len(outputs), params.n))

    rm = AutoModelForSequenceClassification.from_pretrained(
        REWARD_MODEL, torch_dtype=torch.bfloat16, device_map="cuda",
        attn_implementation="flash_attention_2", num_labels=1)
    best = []
    for prompt, out in zip(prompts, outputs):
        pass                                             # score the 8 responses with rm, keep the argmax
    return best


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
