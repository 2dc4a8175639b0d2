"""A router-statistics script started on the GPU box that serves the same MoE model with vLLM.

The team serves OLMoE-1B-7B-0924-Instruct with `vllm serve allenai/OLMoE-1B-7B-0924-Instruct
--gpu-memory-utilization 0.90` on a single L40S (44.99 GiB usable): vLLM takes 90% of the card at start-up
(weights + CUDA graphs + a KV-cache pool sized to fill the rest), 40.5 GiB, whether or not traffic comes.
A researcher wants to know how often each of the 64 experts of each layer is picked on production prompts,
so she ssh'es to the same box and runs profile_router.py:

    model = AutoModelForCausalLM.from_pretrained("allenai/OLMoE-1B-7B-0924-Instruct",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    for i, layer in enumerate(model.model.layers):
        layer.mlp.gate.register_forward_hook(count_topk(i))      # counts[i] += bincount(topk(logits, 8))
    with torch.inference_mode():
        for prompt in sample_prompts("prod_prompts_2026-11.jsonl", n=5000):
            model(**tok(prompt, return_tensors="pt").to("cuda"))

"It is a 1B model" (1.3B parameters are active per token), so 2.6 GB "easily fits in the 4 GB nvidia-smi
shows free".  But every expert's weights must be resident: 16 layers x 64 experts x 3 x 2048 x 1024 = 6.44B
expert parameters + 0.47B attention/embeddings = 6.92B parameters, 12.9 GiB in bf16.  The card has
44.99 - 40.49 (vLLM) - 0.5 (this process's CUDA context) = 4.0 GiB free, so from_pretrained fails about a
third of the way through the layers, on a 4 MiB expert weight.  Alone on the card the script would need
~13.5 GiB and run fine.

What an expert says first: the memory is held by another process -- the vLLM server's 90% reservation.  Stop
it (or restart it with --gpu-memory-utilization 0.55 for the hour of profiling), or do not load a second copy
at all: get the routing counts from the server itself.  Wrong advice: empty_cache / expandable_segments
(nothing cached, nothing fragmented), smaller batch / gradient checkpointing / inference_mode (the load is
what fails; no forward ran), 4-bit quantization (changes the router's numbers the profile is meant to
measure, and 6.92B x 0.5 B is still 3.2 GiB + overhead on a 4 GiB sliver).
"""
import json
import os

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "allenai/OLMoE-1B-7B-0924-Instruct"


class OlmoeConfig(object):
    vocab_size = 50304
    hidden_size = 2048
    intermediate_size = 1024
    num_hidden_layers = 16
    num_attention_heads = 16
    num_experts = 64
    num_experts_per_tok = 8


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __getitem__(self, i):
        return self._modules[str(i)]


class Linear(nn.Module):
    """nn.Linear(bias=False), its weight read from the checkpoint straight onto the device (device_map="cuda")."""

    def __init__(self, in_features, out_features, dtype, device):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=dtype, device=device),
                                   requires_grad=False)


class OlmoeRMSNorm(nn.Module):
    def __init__(self, hidden_size, dtype, device):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=dtype, device=device), requires_grad=False)


class OlmoeAttention(nn.Module):
    def __init__(self, config, dtype, device):
        nn.Module.__init__(self)
        h = config.hidden_size
        self.q_proj = Linear(h, h, dtype, device)
        self.k_proj = Linear(h, h, dtype, device)
        self.v_proj = Linear(h, h, dtype, device)
        self.o_proj = Linear(h, h, dtype, device)
        self.q_norm = OlmoeRMSNorm(h, dtype, device)
        self.k_norm = OlmoeRMSNorm(h, dtype, device)


class OlmoeMLP(nn.Module):
    def __init__(self, config, dtype, device):
        nn.Module.__init__(self)
        h, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, f, dtype, device)
        self.up_proj = Linear(h, f, dtype, device)
        self.down_proj = Linear(f, h, dtype, device)


class OlmoeSparseMoeBlock(nn.Module):
    def __init__(self, config, dtype, device):
        nn.Module.__init__(self)
        self.num_experts, self.top_k = config.num_experts, config.num_experts_per_tok
        self.gate = Linear(config.hidden_size, config.num_experts, dtype, device)
        self.experts = ModuleList(OlmoeMLP(config, dtype, device) for _ in range(config.num_experts))


class OlmoeDecoderLayer(nn.Module):
    def __init__(self, config, dtype, device):
        nn.Module.__init__(self)
        self.self_attn = OlmoeAttention(config, dtype, device)
        self.mlp = OlmoeSparseMoeBlock(config, dtype, device)
        self.input_layernorm = OlmoeRMSNorm(config.hidden_size, dtype, device)
        self.post_attention_layernorm = OlmoeRMSNorm(config.hidden_size, dtype, device)


class OlmoeModel(nn.Module):
    def __init__(self, config, dtype, device):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size * config.hidden_size, dtype=dtype,
                                                     device=device), requires_grad=False)
        self.layers = ModuleList(OlmoeDecoderLayer(config, dtype, device) for _ in range(config.num_hidden_layers))
        self.norm = OlmoeRMSNorm(config.hidden_size, dtype, device)


class OlmoeForCausalLM(nn.Module):
    def __init__(self, config, dtype=torch.float32, device=None):
        nn.Module.__init__(self)
        self.config = config
        self.model = OlmoeModel(config, dtype, device)
        self.lm_head = Linear(config.hidden_size, config.vocab_size, dtype, device)

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None, device_map=None):
        """What AutoModelForCausalLM.from_pretrained(model_id, torch_dtype=..., device_map="cuda") does here:
        each layer's tensors are read from the safetensors shards and placed on the GPU as the model is built."""
        device = "cuda:0" if device_map in ("cuda", "auto", 0) else device_map
        model = cls(OlmoeConfig(), dtype=torch_dtype or torch.float32, device=device)
        return model.eval()


def count_topk(counts, layer_idx):
    def hook(module, inputs, router_logits):
        counts[layer_idx] = counts.get(layer_idx, 0) + 1       # torch.bincount(topk(router_logits, 8)) in the job
    return hook


def sample_prompts(path, n):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["prompt"] for _, line in zip(range(n), f)]


def main():
    model = OlmoeForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16, device_map="cuda")
    counts = {}
    hooks = [count_topk(counts, i) for i, _ in enumerate(model.model.layers)]
    with torch.inference_mode():
        for prompt in sample_prompts("prod_prompts_2026-11.jsonl", n=5000):
            pass                     # model(**tok(prompt, return_tensors="pt").to("cuda")) with the hooks
    print(json.dumps({"layers": len(hooks), "counted": sum(counts.values())}))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
