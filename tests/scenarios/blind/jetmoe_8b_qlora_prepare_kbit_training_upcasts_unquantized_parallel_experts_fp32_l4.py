"""qlora_jetmoe.py -- a provincial e-government team fine-tunes JetMoE-8B (8.5B parameters, 2.2B active) on
their Indonesian public-services FAQ with QLoRA, on one rented L4 (24 GB, 22.5 GiB usable), the recipe copied
from a Llama QLoRA notebook:

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)
    model = AutoModelForCausalLM.from_pretrained("jetmoe/jetmoe-8b", quantization_config=bnb,
                                                 torch_dtype=torch.bfloat16, device_map={"": 0})
    print(model.get_memory_footprint())
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    model = get_peft_model(model, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", ...))

"8B in 4-bit is ~5 GB", the notebook says.  But bitsandbytes quantizes nn.Linear layers only, and JetMoE keeps
its experts -- the mixture-of-attention heads and the MoE MLPs, 97% of its weights -- as 3-D nn.Parameters of
JetMoeParallelExperts modules.  Only kv_proj and the routers became 4-bit; the model loads as 15.7 GiB of bf16
(the printed footprint says 16.9 GB; nobody looked).  Loading works.  Then prepare_model_for_kbit_training does
what PEFT does for k-bit models: it freezes everything and casts every parameter that is still fp16/bf16 to
float32 -- meant for the layer norms and the embeddings of a really quantized model, here the whole expert
stack.  Each cast makes the fp32 copy before the bf16 one is freed; the model grows by 0.69 GiB a layer and
the cast of the ninth layer's MoE input_linear (8 x 11264 x 2048: 704 MiB in fp32) fails with 21.1 GiB
allocated.  No batch has been seen.

An expert: the failure is in the k-bit preparation, not in training: don't upcast the frozen weights
(skip prepare_model_for_kbit_training, or cast only the norms; enable gradient checkpointing and input
gradients yourself) and keep the experts bf16 -- 15.7 GiB frozen + LoRA fits the L4.  And know the base is not
4-bit at all: LoRA "all-linear" can only reach kv_proj and the routers too; a real QLoRA of this model needs
experts unfused into nn.Linear (or a quantizer that handles fused expert tensors).  Wrong first advice: a
smaller batch, gradient checkpointing, shorter sequences, flash attention (no forward pass has run), an 8-bit
optimizer or LoRA (the optimizer and adapters do not exist yet), empty_cache / expandable_segments.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, N_EXPERTS, VOCAB = 2048, 5632, 24, 8, 32000
KV_CHANNELS, KV_HEADS = 128, 16


class BitsAndBytesConfig(object):
    def __init__(self, load_in_4bit=False, bnb_4bit_quant_type="fp4", bnb_4bit_compute_dtype=None,
                 bnb_4bit_use_double_quant=False, llm_int8_skip_modules=None):
        self.load_in_4bit = load_in_4bit
        self.bnb_4bit_quant_type = bnb_4bit_quant_type
        self.bnb_4bit_compute_dtype = bnb_4bit_compute_dtype
        self.bnb_4bit_use_double_quant = bnb_4bit_use_double_quant
        self.llm_int8_skip_modules = llm_int8_skip_modules or ["lm_head"]


class Linear4bit(torch.nn.Module):
    """bitsandbytes.nn.Linear4bit: nf4 weight (0.5 B/param, packed in uint8) + double-quantized absmax."""

    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        n = in_features * out_features
        self.weight = torch.nn.Parameter(torch.empty(n // 2 + n // 64, dtype=torch.uint8, device="cuda"),
                                         requires_grad=False)


class Linear(torch.nn.Module):
    """torch.nn.Linear in the checkpoint's dtype (what bitsandbytes would have replaced)."""

    def __init__(self, in_features, out_features, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=dtype, device="cuda"))


def make_linear(in_features, out_features, name, dtype, bnb):
    if bnb is not None and bnb.load_in_4bit and name not in bnb.llm_int8_skip_modules:
        return Linear4bit(in_features, out_features)
    return Linear(in_features, out_features, dtype)


class JetMoeParallelExperts(torch.nn.Module):
    """transformers' JetMoeParallelExperts: all experts' weights in ONE 3-D nn.Parameter
    (num_experts, output_size, input_size) -- not an nn.Linear, so bitsandbytes leaves it alone."""

    def __init__(self, num_experts, input_size, output_size, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(num_experts * output_size * input_size, dtype=dtype,
                                                     device="cuda"))


class JetMoeTopKGating(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.layer = make_linear(HIDDEN, N_EXPERTS, "layer", dtype, bnb)


class JetMoeMoA(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.router = JetMoeTopKGating(dtype, bnb)
        self.input_linear = JetMoeParallelExperts(N_EXPERTS, HIDDEN, KV_CHANNELS * KV_HEADS, dtype)
        self.output_linear = JetMoeParallelExperts(N_EXPERTS, KV_CHANNELS * KV_HEADS, HIDDEN, dtype)
        self.bias = torch.nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))


class JetMoeAttention(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.experts = JetMoeMoA(dtype, bnb)
        self.kv_proj = make_linear(HIDDEN, 2 * KV_CHANNELS * KV_HEADS, "kv_proj", dtype, bnb)


class JetMoeMoE(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.router = JetMoeTopKGating(dtype, bnb)
        self.input_linear = JetMoeParallelExperts(N_EXPERTS, HIDDEN, 2 * FFN, dtype)
        self.output_linear = JetMoeParallelExperts(N_EXPERTS, FFN, HIDDEN, dtype)
        self.bias = torch.nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))


class JetMoeBlock(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.input_layernorm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))
        self.self_attention = JetMoeAttention(dtype, bnb)
        self.post_layernorm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))
        self.mlp = JetMoeMoE(dtype, bnb)


class JetMoeForCausalLM(torch.nn.Module):
    def __init__(self, dtype, bnb):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, JetMoeBlock(dtype, bnb))
        self.norm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))
        self.lm_head = make_linear(HIDDEN, VOCAB, "lm_head", dtype, bnb)
        self.is_loaded_in_4bit = bnb is not None and bnb.load_in_4bit

    @classmethod
    def from_pretrained(cls, name, quantization_config=None, torch_dtype=None, device_map=None):
        """Loads the shards straight onto GPU 0, replacing nn.Linear by Linear4bit as transformers'
        bitsandbytes integration does (lm_head skipped)."""
        return cls(torch_dtype or torch.float32, quantization_config)

    def get_memory_footprint(self):
        return sum(p.nbytes for p in self.parameters())


def _cast(param, dtype):
    """param.data.to(dtype): a new tensor of the same number of elements, on the same device."""
    n = param.nbytes // torch._ITEMSIZE[param.dtype]
    return torch.empty(n, dtype=dtype, device="cuda")


def _modules(m):
    """nn.Module.modules() as PyTorch orders it: depth first, in registration order."""
    yield m
    for c in m._modules.values():
        for x in _modules(c):
            yield x


def prepare_model_for_kbit_training(model, use_gradient_checkpointing=True, gradient_checkpointing_kwargs=None):
    """peft.prepare_model_for_kbit_training (peft/utils/other.py), as far as memory goes."""
    loaded_in_kbit = getattr(model, "is_loaded_in_8bit", False) or getattr(model, "is_loaded_in_4bit", False)
    for name, param in model.named_parameters():
        # freeze base model's layers
        param.requires_grad = False
    # cast all non INT8 parameters to fp32
    for module in _modules(model):
        for pname, param in list(module._parameters.items()):
            if param is not None and param.dtype in (torch.float16, torch.bfloat16):
                module._parameters[pname] = torch.nn.Parameter(_cast(param, torch.float32), requires_grad=False)
    if loaded_in_kbit and use_gradient_checkpointing:
        model.gradient_checkpointing = True
    return model


def main():
    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                             bnb_4bit_compute_dtype=torch.bfloat16, bnb_4bit_use_double_quant=True)
    model = JetMoeForCausalLM.from_pretrained("jetmoe/jetmoe-8b", quantization_config=bnb,
                                              torch_dtype=torch.bfloat16, device_map={"": 0})
    print("memory footprint: %.2f GB" % (model.get_memory_footprint() / 1e9))
    model = prepare_model_for_kbit_training(model, use_gradient_checkpointing=True)
    print("prepared; allocated %.2f GiB" % (torch.cuda.memory_allocated() / float(1 << 30)))
    # get_peft_model(model, LoraConfig(r=16, lora_alpha=32, lora_dropout=0.05, target_modules="all-linear"))
    # SFTTrainer(..., max_seq_length=2048, per_device_train_batch_size=2, gradient_accumulation_steps=8).train()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
