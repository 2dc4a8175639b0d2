"""Sparse upcycling of a dense model into an 8-expert MoE, done on a 24 GB RTX 4090 in fp32 for no reason.

upcycle.py (the first step of a "Qwen2.5-1.5B-8x MoE" project; training comes later, on rented 8x H100):

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B").cuda()   # no torch_dtype: fp32
    for layer in model.model.layers:
        dense_mlp = layer.mlp
        moe = UpcycledSparseMoeBlock(config, num_experts=8, top_k=2)
        moe.experts = nn.ModuleList([copy.deepcopy(dense_mlp) for _ in range(8)])   # sparse upcycling
        layer.mlp = moe
    model.config.update(dict(num_local_experts=8, num_experts_per_tok=2, architectures=["Qwen2MoeForCausalLM"]))
    model.save_pretrained("qwen2.5-1.5b-8x-upcycled", safe_serialization=True)

".cuda() because it is faster".  Nothing is trained or run here: the script only copies weights.  But
from_pretrained without torch_dtype gives float32 (the checkpoint is bf16), and the copies are made where
the weights are, on the GPU.

Sizes (Qwen2.5-1.5B: hidden 1536, MLP 8960, 28 layers, GQA 12/2 heads, vocab 151936 tied):
  dense model 1.54B params = 5.75 GiB fp32; one layer's MLP 3 x 1536 x 8960 = 41.3M params = 157.5 MiB fp32
  each layer gains 7 MLP copies (the original goes when the loop moves on): +1.08 GiB per layer;
  the finished 8-expert model: 1.54B - 1.16B + 8 x 1.16B = 9.6B params = 35.8 GiB fp32, 17.9 GiB bf16.
The card has 23.99 GiB, 23.5 after the CUDA context: after 15 layers (5.75 + 15 x 1.08 = 21.9 GiB, plus
~0.6 GiB of 1.5 MiB segment tails the 52.5 MiB weights leave in the cache) the copies run out in layer 16 of
28, on a 52.5 MiB expert weight.

What an expert says first: this needs no GPU at all -- do the upcycling on the CPU (load on the CPU, in
bf16, deepcopy there, save); if it must be the GPU, load in bf16 (the result is 17.9 GiB and fits).  Wrong
advice: smaller batch, gradient checkpointing, autocast, flash-attention, inference_mode (no pass runs, the
weights themselves are what is copied), expandable_segments / empty_cache (nothing is cached or fragmented),
quantizing the experts (they are about to be trained).
"""
import copy
import os

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "Qwen/Qwen2.5-1.5B"
OUT_DIR = "qwen2.5-1.5b-8x-upcycled"
NUM_EXPERTS = 8
TOP_K = 2


class Qwen2Config(object):
    vocab_size = 151936
    hidden_size = 1536
    intermediate_size = 8960
    num_hidden_layers = 28
    num_attention_heads = 12
    num_key_value_heads = 2
    head_dim = 128
    tie_word_embeddings = True

    def update(self, d):
        for k, v in d.items():
            setattr(self, k, v)


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class Linear(nn.Module):
    """nn.Linear: weight out x in (+ bias), float32 unless told otherwise, as torch's default dtype is."""

    def __init__(self, in_features, out_features, bias=False, device="cuda"):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features * in_features, dtype=torch.get_default_dtype(),
                                               device=device))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.get_default_dtype(), device=device))


class Qwen2RMSNorm(nn.Module):
    def __init__(self, hidden_size):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden_size, dtype=torch.get_default_dtype(), device="cuda"))


class Qwen2Attention(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.q_proj = Linear(h, h, bias=True)
        self.k_proj = Linear(h, kv, bias=True)
        self.v_proj = Linear(h, kv, bias=True)
        self.o_proj = Linear(h, h)


class Qwen2MLP(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        h, f = config.hidden_size, config.intermediate_size
        self.gate_proj = Linear(h, f)
        self.up_proj = Linear(h, f)
        self.down_proj = Linear(f, h)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.self_attn = Qwen2Attention(config)
        self.mlp = Qwen2MLP(config)
        self.input_layernorm = Qwen2RMSNorm(config.hidden_size)
        self.post_attention_layernorm = Qwen2RMSNorm(config.hidden_size)


class Qwen2Model(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(config.vocab_size * config.hidden_size,
                                                     dtype=torch.get_default_dtype(), device="cuda"))
        self.layers = ModuleList(Qwen2DecoderLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = Qwen2RMSNorm(config.hidden_size)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.model = Qwen2Model(config)          # lm_head is tied to embed_tokens

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None):
        """AutoModelForCausalLM.from_pretrained(model_id) then .cuda(): without torch_dtype the weights are
        torch's default dtype, float32 (the stand-in builds them on the GPU directly)."""
        if torch_dtype is not None:
            torch.set_default_dtype(torch_dtype)
        return cls(Qwen2Config())


class UpcycledSparseMoeBlock(nn.Module):
    """Mixtral-style block: a fresh router and num_experts copies of the dense MLP."""

    def __init__(self, config, num_experts, top_k):
        nn.Module.__init__(self)
        self.num_experts, self.top_k = num_experts, top_k
        self.gate = Linear(config.hidden_size, num_experts)
        self.experts = ModuleList()


def upcycle(model, num_experts, top_k):
    config = model.config
    for idx, layer in enumerate(model.model.layers):
        dense_mlp = layer.mlp
        moe = UpcycledSparseMoeBlock(config, num_experts, top_k)
        moe.experts = ModuleList([copy.deepcopy(dense_mlp) for _ in range(num_experts)])
        layer.mlp = moe
        print("layer %d upcycled" % idx, flush=True)
    config.update(dict(num_local_experts=num_experts, num_experts_per_tok=top_k,
                       architectures=["Qwen2MoeForCausalLM"]))
    return model


def save_upcycled(model, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    torch.save(model.state_dict(), os.path.join(out_dir, "pytorch_model.bin"))


def main():
    model = Qwen2ForCausalLM.from_pretrained(MODEL_ID).cuda()
    model = upcycle(model, NUM_EXPERTS, TOP_K)
    save_upcycled(model, OUT_DIR)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
