"""qlora_sft.py -- QLoRA fine-tuning of Qwen2.5-14B-Instruct on a workstation RTX 3090 (24 GB; the
desktop session holds ~0.6 GB).  4-bit NF4 weights (~9 GB) plus LoRA adapters is the standard recipe
for a 14B model on a 24 GB card, and the script builds the quantization config:

    bnb_config = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                    bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, device_map={"": 0},
                                                 attn_implementation="sdpa")      # quantization_config= forgotten
    model = prepare_model_for_kbit_training(model)
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))

but the call never passes it (quantization_config=bnb_config was lost in a refactor).  The weights are
loaded in bf16, 27.5 GiB, shard by shard onto cuda:0; the load fails around layer 40 of 48, before
any adapter, optimizer or batch exists.

An expert: pass the quantization config (4-bit weights, ~9 GiB: QLoRA as intended).  What the job was
doing decides it: the failure is in from_pretrained, so batch size, sequence length, checkpointing,
8-bit optimizers and LoRA itself (the adapters come after the load) change nothing; the weights are
already bf16; the desktop's 0.6 GB is not the problem.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

MODEL = "Qwen/Qwen2.5-14B-Instruct"
VOCAB, HIDDEN, INTER, KV = 152064, 5120, 13824, 1024
LAYER_TENSORS = [("self_attn.q_proj.weight", HIDDEN * HIDDEN), ("self_attn.k_proj.weight", HIDDEN * KV),
                 ("self_attn.v_proj.weight", HIDDEN * KV), ("self_attn.o_proj.weight", HIDDEN * HIDDEN),
                 ("mlp.gate_proj.weight", HIDDEN * INTER), ("mlp.up_proj.weight", HIDDEN * INTER),
                 ("mlp.down_proj.weight", INTER * HIDDEN), ("input_layernorm.weight", HIDDEN),
                 ("post_attention_layernorm.weight", HIDDEN)]


class Qwen2DecoderLayer(torch.nn.Module):
    """Its weights are set by the loader, tensor by tensor."""


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, num_layers):
        torch.nn.Module.__init__(self)
        self.layers = []
        for i in range(num_layers):
            layer = Qwen2DecoderLayer()
            self.layers.append(layer)
            setattr(self, "layers_%d" % i, layer)


def checkpoint_index():
    """(name, elements) of every tensor of the safetensors shards, in the shards' order."""
    names = [("model.embed_tokens.weight", VOCAB * HIDDEN)]
    for i in range(48):
        names += [("model.layers.%d.%s" % (i, n), k) for n, k in LAYER_TENSORS]
    names += [("model.norm.weight", HIDDEN), ("lm_head.weight", VOCAB * HIDDEN)]
    return names


def _load_state_dict_into_meta_model(model, shard, dtype, device):
    for name, numel in shard:
        value = torch.empty(numel, dtype=dtype, device=device)        # set_module_tensor_to_device
        parts = name.split(".")
        if parts[0] == "model" and parts[1] == "layers":
            owner, attr = model.layers[int(parts[2])], "_".join(parts[3:-1])
        else:
            owner, attr = model, "_".join(parts[:-1])
        setattr(owner, attr, torch.nn.Parameter(value))


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, quantization_config=None,
                        attn_implementation=None):
        device = "cuda:%d" % device_map[""]
        model = Qwen2ForCausalLM(48)                                  # on the meta device first
        index = checkpoint_index()
        shards = [index[i:i + 55] for i in range(0, len(index), 55)]   # model-0000N-of-00008.safetensors
        for shard in shards:
            if quantization_config is not None:
                raise NotImplementedError("bitsandbytes is not part of this stand-in")
            _load_state_dict_into_meta_model(model, shard, torch_dtype or torch.float32, device)
        return model


def main():
    bnb_config = {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4",
                  "bnb_4bit_compute_dtype": torch.bfloat16, "bnb_4bit_use_double_quant": True}
    lora_config = {"r": 16, "lora_alpha": 32, "target_modules": "all-linear", "task_type": "CAUSAL_LM"}
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, device_map={"": 0},
                                                 attn_implementation="sdpa")
    print("loaded", model, "quantization:", bnb_config, "lora:", lora_config)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
