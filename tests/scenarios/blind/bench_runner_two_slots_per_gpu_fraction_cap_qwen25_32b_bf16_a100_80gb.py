"""bench_runner/worker.py -- a platform team's nightly latency sweep runs on an 8x A100 80GB node.  To get
through the sweep's 140 configs in one night, the runner packs two configs per GPU: it starts two workers on
each card, and each worker caps itself at 45% of the card so the pair cannot starve each other (the
remaining 10% "for the two CUDA contexts"), in the worker bootstrap nobody has touched since it was written
for 7B models:

    def worker_main(cfg):                 # launched with CUDA_VISIBLE_DEVICES=<its GPU>
        torch.cuda.set_device(0)
        torch.cuda.set_per_process_memory_fraction(0.45, 0)        # two slots per GPU
        model = AutoModelForCausalLM.from_pretrained(cfg.model, torch_dtype=cfg.dtype, device_map="cuda:0")
        for _ in range(cfg.warmup): model.generate(**prompt, max_new_tokens=cfg.new_tokens)
        ... timed runs, results to the sweep database ...

An engineer adds Qwen2.5-32B-Instruct in bf16 at tp=1 (32.8B parameters: 61.0 GiB of weights) to
sweep.yaml.  Its worker shares GPU 3 with a Qwen2.5-1.5B config (another process, 4.5 GiB) and fails while
loading: layer 37 of 64 does not fit.  PyTorch's allocator refused it itself -- the reservation would pass
the 45% cap, 35.6 GiB of the 79.2 GiB card -- while cudaMemGetInfo says 39 GiB are still free.  The model
fits this card (61 GiB + a few GiB of KV cache and activations beside the neighbour's 4.5 GiB), just not a
45% slot of it.

An expert: the cap refused the allocation, not the GPU: give this config a whole card (a per-config
fraction, e.g. 0.9 with no second worker on that GPU, or no cap at all for exclusive configs), or derive
the fraction from the configs' needs instead of a fixed 0.45.
Wrong first advice: quantizing the model or offloading layers to the CPU (the sweep measures bf16 latency
at tp=1; either changes what is benchmarked), tensor parallelism over two GPUs (changes the config), a
bigger GPU (this one has room), killing the neighbouring worker (its 4.5 GiB are not why: the refusal comes
from this process's own cap), empty_cache / expandable_segments (nothing is cached or fragmented), a smaller
batch (loading the weights fails, before any batch).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: transformers' from_pretrained with a device_map (accelerate's loader): each checkpoint
# tensor is materialised on the GPU in the requested dtype, shard by shard.  Compiled under transformers' file
# name, as its frames would be.
_LOADER = """
def load_state_dict_into_meta_model(model, shard, device):
    for name, numel in shard:
        set_module_tensor_to_device(model, name, device, numel)


def set_module_tensor_to_device(model, name, device, numel):
    value = torch.empty(numel, dtype=torch.bfloat16, device=device)
    model._parameters_by_name[name] = torch.nn.Parameter(value, requires_grad=False)
"""
_lns = {"torch": torch}
exec(compile(_LOADER, "/opt/conda/lib/python3.11/site-packages/transformers/modeling_utils.py", "exec"), _lns)
load_state_dict_into_meta_model = _lns["load_state_dict_into_meta_model"]

ARCH = {  # config.json of each model in the sweep
    "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden=1536, inter=8960, layers=28, vocab=151936, kv=256, tied=True),
    "Qwen/Qwen2.5-32B-Instruct": dict(hidden=5120, inter=27648, layers=64, vocab=152064, kv=1024, tied=False),
}


def checkpoint_tensors(a):
    h, kv = a["hidden"], a["kv"]
    out = [("model.embed_tokens.weight", a["vocab"] * h)]
    for i in range(a["layers"]):
        p = "model.layers.%d." % i
        out += [(p + "input_layernorm.weight", h),
                (p + "self_attn.q_proj.weight", h * h), (p + "self_attn.q_proj.bias", h),
                (p + "self_attn.k_proj.weight", kv * h), (p + "self_attn.k_proj.bias", kv),
                (p + "self_attn.v_proj.weight", kv * h), (p + "self_attn.v_proj.bias", kv),
                (p + "self_attn.o_proj.weight", h * h),
                (p + "post_attention_layernorm.weight", h),
                (p + "mlp.gate_proj.weight", a["inter"] * h),
                (p + "mlp.up_proj.weight", a["inter"] * h),
                (p + "mlp.down_proj.weight", h * a["inter"])]
    out.append(("model.norm.weight", h))
    if not a["tied"]:
        out.append(("lm_head.weight", a["vocab"] * h))
    return out


class AutoModelForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_parameters_by_name", {})

    def parameters(self):
        return list(self._parameters_by_name.values())

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        model = cls()
        tensors = checkpoint_tensors(ARCH[name])
        per = 1 + len(tensors) // 17                       # model-000NN-of-00017.safetensors
        for i in range(0, len(tensors), per):
            load_state_dict_into_meta_model(model, tensors[i:i + per], device_map)
        return model

    def generate(self, input_ids=None, max_new_tokens=128):
        raise NotImplementedError("not reached in this run")


class Config(object):
    def __init__(self, model, dtype, batch, prompt_len, new_tokens, warmup=3, runs=10):
        self.model, self.dtype, self.batch = model, dtype, batch
        self.prompt_len, self.new_tokens, self.warmup, self.runs = prompt_len, new_tokens, warmup, runs


SLOT_FRACTION = 0.45          # two workers per GPU


def worker_main(cfg):                     # launched with CUDA_VISIBLE_DEVICES=<its GPU>
    torch.cuda.set_device(0)
    torch.cuda.set_per_process_memory_fraction(SLOT_FRACTION, 0)        # two slots per GPU
    model = AutoModelForCausalLM.from_pretrained(cfg.model, torch_dtype=cfg.dtype, device_map="cuda:0")
    prompt = torch.empty(cfg.batch * cfg.prompt_len * 8, device="cuda")
    for _ in range(cfg.warmup):
        model.generate(input_ids=prompt, max_new_tokens=cfg.new_tokens)
    return {"model": cfg.model}


if __name__ == "__main__":
    # the runner starts this slot as: CUDA_VISIBLE_DEVICES=3 python -m bench_runner.worker
    #     --config sweep.yaml#qwen2.5-32b-instruct-bf16-tp1-bs1
    cfg = Config("Qwen/Qwen2.5-32B-Instruct", torch.bfloat16, batch=1, prompt_len=2048, new_tokens=256)
    try:
        worker_main(cfg)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
