"""Merging a QLoRA adapter into Llama-3.1-70B-Instruct "properly" (dequantize first, merge in bf16) on the
same single A100 80GB the QLoRA run trained on.

The real script (merge_qlora.py, transformers 4.45 + bitsandbytes 0.44 + peft 0.13), written after
reading that merging into a 4-bit base "loses precision":

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-70B-Instruct",
                                                 quantization_config=bnb, device_map={"": 0},
                                                 torch_dtype=torch.bfloat16)
    model = model.dequantize()                  # back to bf16 so the merge is exact
    model = PeftModel.from_pretrained(model, "out/claims-70b-qlora/checkpoint-1200")
    model = model.merge_and_unload()
    model.save_pretrained("claims-70b-merged-bf16")     # then AWQ it for serving

The 4-bit load fits: 80 layers x 855.6M linear weights in nf4 with double-quantized absmax
(0.5 + 1/64 byte per weight: 0.41 GiB per layer, 32.9 GiB in all), embed_tokens and lm_head in bf16
(2 x 128256 x 8192 x 2 B = 3.9 GiB), CUDA context 0.5 GiB: about 37.3 GiB of the 80 GiB card.
model.dequantize() then walks the Linear4bit modules in order and replaces each with an nn.Linear whose
bf16 weight is dequantized on the same GPU (bitsandbytes' dequantize_4bit), the packed weight being freed
when the old module goes: each layer goes from 0.41 GiB to 1.59 GiB (+1.18 GiB).  The whole model in bf16
is 131 GiB; the card runs out in layer 35, when one projection's bf16 weight (gate/up/down: 448 MiB,
q/o: 128 MiB) no longer fits.  Memory rose layer by layer, but nothing leaked: every byte is a weight
of the model being converted.

What an expert says first: a bf16 70B (131 GiB) cannot be on an 80 GB card, whatever the order of
operations.  Do the dequantize+merge on the CPU (load the base in bf16 with device_map="cpu", ~140 GB of
RAM, merge the adapter there; it takes minutes, not hours), or spread it over several GPUs / offload with
device_map="auto" and max_memory.  (Or accept merging into the 4-bit base.)
Wrong advice: empty_cache / expandable_segments (nothing is cached that could help), smaller batch, shorter
sequences, gradient checkpointing, flash-attention (no forward runs), "release references" (the memory is
the model's weights), restarting.
"""
import scen_truth
import torch
from torch import nn

scen_truth.note_every_empty(torch)

BASE = "meta-llama/Llama-3.1-70B-Instruct"
ADAPTER = "out/claims-70b-qlora/checkpoint-1200"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 8192, 28672, 1024, 80, 128256


# ---- bitsandbytes / transformers classes, as far as memory goes ----------------------------------------
class Params4bit(nn.Parameter):
    """bnb.nn.Params4bit: nf4 weights packed two to a byte (uint8) plus the double-quantized absmax."""


def quantize_4bit_storage(out_features, in_features):
    n = out_features * in_features
    return torch.empty(n // 2 + n // 64, dtype=torch.uint8, device="cuda")


def dequantize_4bit(weight, out_features, in_features):
    """bitsandbytes.functional.dequantize_4bit: a new bf16 tensor of the full weight, on the weight's GPU."""
    return torch.empty(out_features * in_features, dtype=torch.bfloat16, device=weight.device)


class Linear4bit(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Params4bit(quantize_4bit_storage(out_features, in_features), requires_grad=False)


class Linear(nn.Module):
    """torch.nn.Linear(in, out, bias=False, dtype=torch.bfloat16)."""

    def __init__(self, in_features, out_features, weight):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(weight, requires_grad=False)


class Embedding(nn.Module):
    def __init__(self, vocab, hidden):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(vocab * hidden, dtype=torch.bfloat16, device="cuda"),
                                   requires_grad=False)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LlamaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear4bit(HIDDEN, HIDDEN)
        self.k_proj = Linear4bit(HIDDEN, KV_DIM)
        self.v_proj = Linear4bit(HIDDEN, KV_DIM)
        self.o_proj = Linear4bit(HIDDEN, HIDDEN)


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear4bit(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear4bit(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear4bit(INTERMEDIATE, HIDDEN)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(list(self._modules.values()))


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, HIDDEN)
        self.layers = ModuleList([LlamaDecoderLayer() for _ in range(N_LAYERS)])
        self.norm = LlamaRMSNorm(HIDDEN)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Embedding(VOCAB, HIDDEN)      # untied lm_head, kept in bf16 by the 4-bit load
        self.is_loaded_in_4bit = True

    @classmethod
    def from_pretrained(cls, name, quantization_config=None, device_map=None, torch_dtype=None):
        """Shards are read one at a time and each Linear's weight is quantized as it lands on cuda:0."""
        return cls()

    def named_modules(self):
        out, todo = [], [("", self)]
        while todo:
            prefix, m = todo.pop(0)
            out.append((prefix, m))
            for k, child in m._modules.items():
                todo.append(((prefix + "." + k) if prefix else k, child))
        return out

    def dequantize(self):
        """transformers' PreTrainedModel.dequantize() -> integrations.bitsandbytes.dequantize_and_replace."""
        dequantize_and_replace(self)
        self.is_loaded_in_4bit = False
        return self


def dequantize_and_replace(model):
    """As transformers' _dequantize_and_replace: walks the children recursively and swaps each Linear4bit
    for a bf16 nn.Linear in place."""
    for name, module in list(model._modules.items()):
        if isinstance(module, Linear4bit):
            weight = dequantize_4bit(module.weight, module.out_features, module.in_features)
            model._modules[name] = Linear(module.in_features, module.out_features, weight)
            del weight
        elif module._modules:
            dequantize_and_replace(module)
        del module


class PeftModel(object):
    @classmethod
    def from_pretrained(cls, model, adapter_dir):
        raise RuntimeError("not reached")


def main():
    model = LlamaForCausalLM.from_pretrained(BASE, quantization_config="nf4+double_quant",
                                             device_map={"": 0}, torch_dtype=torch.bfloat16)
    model = model.dequantize()
    model = PeftModel.from_pretrained(model, ADAPTER)
    model = model.merge_and_unload()
    model.save_pretrained("claims-70b-merged-bf16")


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
