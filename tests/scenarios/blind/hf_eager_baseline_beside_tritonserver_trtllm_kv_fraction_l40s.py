"""bench_hf_baseline.py -- an inference engineer is writing up how much faster the TensorRT-LLM engine of
Llama-3.1-8B-Instruct is than plain Hugging Face transformers.  The engine is served on the team's dev box
(one L40S, 48 GB) by tritonserver with the tensorrtllm backend, started an hour ago from the
tensorrtllm_backend model repository with its defaults, and it still answers the load generator's requests.
For the baseline column of the table the engineer runs, on the same box:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    model.eval()
    with torch.inference_mode():
        for _ in range(3): model.generate(**warmup_batch, max_new_tokens=32)        # warmup
        ... timed generate over 16 prompts ...

and it fails while loading the weights: model.layers.3.mlp.up_proj (112 MiB) does not fit, with 2.4 GiB of
the model on the GPU and 18 MiB free of 44.5 GiB.  nvidia-smi shows why: tritonserver holds
41.6 GiB.  The tensorrtllm backend's kv_cache_free_gpu_mem_fraction (0.9 unless set in config.pbtxt) gives
the engine's paged KV cache 90% of the memory left after the engine's weights (8.6 GiB in FP8) and its
activations, so the server takes nearly the whole card however little traffic it serves.  Alone on the
card the bf16 baseline needs 15 GiB of weights and about a GiB of activations at batch 16.

An expert: another process holds the card: stop (or pause) the Triton server while the baseline runs, or
run the baseline on another GPU; if both must share the card, lower kv_cache_free_gpu_mem_fraction in the
server's config.pbtxt (e.g. 0.5) and restart it -- and note that a latency comparison with both on one GPU
is not a fair one anyway.
Wrong first advice: quantizing the baseline (it is meant to be bf16; it would also stop being the baseline),
CPU offload, a smaller batch or shorter prompts (the failure is in from_pretrained, before any input),
expandable_segments or empty_cache (this process caches nothing: 2.4 GiB are live weights), inference_mode
(already on; loading has no autograd), a bigger GPU (the server would take 90% of that one too), restarting
the benchmark (the server is not a leftover of it; it is alive and serving).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: transformers' from_pretrained with device_map="cuda" (accelerate's loader): the model is
# built on the meta device, then each checkpoint tensor is materialised on the GPU in the checkpoint's dtype
# (bf16), shard by shard, layer by layer.  Compiled under transformers' file name, as its frames would be.
_LOADER = """
def load_state_dict_into_meta_model(model, shard, device):
    for name, numel in shard:
        set_module_tensor_to_device(model, name, device, numel)


def set_module_tensor_to_device(model, name, device, numel):
    value = torch.empty(numel, dtype=torch.bfloat16, device=device)
    model._parameters_by_name[name] = torch.nn.Parameter(value, requires_grad=False)
"""
_lns = {"torch": torch}
exec(compile(_LOADER, "/usr/local/lib/python3.10/dist-packages/transformers/modeling_utils.py", "exec"), _lns)
load_state_dict_into_meta_model = _lns["load_state_dict_into_meta_model"]

HIDDEN, INTER, LAYERS, VOCAB, KV = 4096, 14336, 32, 128256, 1024


def checkpoint_shards():
    """model-0000N-of-00004.safetensors of meta-llama/Llama-3.1-8B-Instruct, in file order."""
    tensors = [("model.embed_tokens.weight", VOCAB * HIDDEN)]
    for i in range(LAYERS):
        p = "model.layers.%d." % i
        tensors += [(p + "input_layernorm.weight", HIDDEN),
                    (p + "self_attn.q_proj.weight", HIDDEN * HIDDEN),
                    (p + "self_attn.k_proj.weight", KV * HIDDEN),
                    (p + "self_attn.v_proj.weight", KV * HIDDEN),
                    (p + "self_attn.o_proj.weight", HIDDEN * HIDDEN),
                    (p + "post_attention_layernorm.weight", HIDDEN),
                    (p + "mlp.gate_proj.weight", INTER * HIDDEN),
                    (p + "mlp.up_proj.weight", INTER * HIDDEN),
                    (p + "mlp.down_proj.weight", HIDDEN * INTER)]
    tensors += [("model.norm.weight", HIDDEN), ("lm_head.weight", VOCAB * HIDDEN)]
    per = (len(tensors) + 3) // 4
    return [tensors[i:i + per] for i in range(0, len(tensors), per)]


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_parameters_by_name", {})

    def parameters(self):
        return list(self._parameters_by_name.values())

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        model = cls()                       # init_empty_weights(): on the meta device, no memory
        for shard in checkpoint_shards():
            load_state_dict_into_meta_model(model, shard, device_map)
        return model

    def generate(self, input_ids=None, max_new_tokens=32):
        raise NotImplementedError("not reached in this run")


def main():
    print("free before loading: %.2f GiB of %.2f GiB" % tuple(x / float(1 << 30) for x in torch.cuda.mem_get_info()))
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda")
    model.eval()
    with torch.inference_mode():
        batch = torch.empty(16 * 512 * 8, device="cuda")
        for _ in range(3):
            model.generate(input_ids=batch, max_new_tokens=32)
    print("done")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
