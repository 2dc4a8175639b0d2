"""dpo_train.py -- a hobbyist with two RTX 4090s (24 GB each) writes his own DPO loop (the loss of the DPO
paper, no TRL) to align Qwen2.5-7B-Instruct with LoRA on a preference set of his own.  The policy is the
bf16 model (14.2 GiB) with LoRA adapters on every linear layer; the frozen reference policy is "the same
model, unchanged", and since one 4090 cannot hold two 7B models he puts it on the second card:

    policy = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16)
    policy.to("cuda:0")
    policy.gradient_checkpointing_enable()
    policy = get_peft_model(policy, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    # reference policy on the second 4090, which has nothing else to do
    ref_model = copy.deepcopy(policy).to("cuda:1")
    ref_model.eval().requires_grad_(False)

The script dies at the deepcopy, on cuda:0, with GPU 1 still untouched (no context, 0 bytes).
copy.deepcopy clones every tensor on the device it lives on (Tensor.__deepcopy__ is a clone) and only then
does .to("cuda:1") move the copy: for that moment both 7B copies have to fit on GPU 0, which has 9 GiB
left after the policy.  It fails about two-thirds of the way through the copy.

An expert: the reference policy of a LoRA run is the base model, and the policy already contains it: run
the reference forward through the policy with its adapters disabled (`with policy.disable_adapter():`,
what TRL's DPOTrainer does with a PEFT model and ref_model=None) -- no second copy anywhere, and GPU 1 is
free for a second run.  If a separate reference on GPU 1 is wanted, load it there directly
(from_pretrained(..., torch_dtype=torch.bfloat16, device_map={"": 1})) instead of copying through GPU 0.
Precomputing the reference log-probabilities in one pass before training (then dropping the reference) also
works.
Wrong first advice: a smaller batch, gradient checkpointing (no batch has run; the copy is weights), 4-bit
quantization / QLoRA or CPU offload (shrink what needs no second copy at all), a bigger GPU (a 48 GB card
only hides the detour through GPU 0), expandable_segments / empty_cache (nothing is cached or fragmented),
"use the idle GPU" (that is what the line tries to do; the point is how the copy gets there).
"""
import copy
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

BF16, F32 = torch.bfloat16, torch.float32
MODEL = "Qwen/Qwen2.5-7B-Instruct"

# ---- stand-in gap: Module.to / Module._apply as PyTorch runs them (each parameter converted in turn:
# param_applied = fn(param), a new tensor on the device, replacing the old one), under torch's file name.
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
# ----


class HostParameter(object):
    """A parameter as from_pretrained leaves it without a device_map: read into host memory."""
    is_cuda = False
    device = "cpu"
    requires_grad = True

    def __init__(self, numel, dtype):
        self.dtype = dtype
        self.nbytes = numel * torch._ITEMSIZE[dtype]


class Qwen2Config(object):
    vocab_size = 152064
    hidden_size = 3584
    intermediate_size = 18944
    num_hidden_layers = 28
    num_attention_heads = 28
    num_key_value_heads = 4
    head_dim = 128


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=False, dtype=BF16):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self._parameters["weight"] = HostParameter(in_features * out_features, dtype)
        if bias:
            self._parameters["bias"] = HostParameter(out_features, dtype)


class RMSNorm(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self._parameters["weight"] = HostParameter(n, BF16)


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * cfg.head_dim
        self.model = torch.nn.Module()
        self.model.embed_tokens = torch.nn.Module()
        self.model.embed_tokens._parameters["weight"] = HostParameter(cfg.vocab_size * h, BF16)
        self.model.layers = torch.nn.Module()
        for n in range(cfg.num_hidden_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            layer.self_attn.q_proj = Linear(h, h, bias=True)
            layer.self_attn.k_proj = Linear(h, kv, bias=True)
            layer.self_attn.v_proj = Linear(h, kv, bias=True)
            layer.self_attn.o_proj = Linear(h, h)
            layer.mlp = torch.nn.Module()
            layer.mlp.gate_proj = Linear(h, i)
            layer.mlp.up_proj = Linear(h, i)
            layer.mlp.down_proj = Linear(i, h)
            layer.input_layernorm = RMSNorm(h)
            layer.post_attention_layernorm = RMSNorm(h)
            setattr(self.model.layers, str(n), layer)
        self.model.norm = RMSNorm(h)
        self.lm_head = Linear(h, cfg.vocab_size)

    def gradient_checkpointing_enable(self, **kw):
        self.is_gradient_checkpointing = True


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, **kw):
        return Qwen2ForCausalLM(Qwen2Config())


# ---- peft, as far as this script uses it: get_peft_model wraps the model (PeftModelForCausalLM -> LoraModel
# -> the base model) and gives every target Linear a lora_A (r x in) and lora_B (out x r) on the base layer's
# device, in float32 (autocast_adapter_dtype=True upcasts bf16 adapters); the base weights are frozen.
class LoraConfig(object):
    def __init__(self, r=8, lora_alpha=8, target_modules=None, lora_dropout=0.0, task_type="CAUSAL_LM"):
        self.r, self.lora_alpha, self.target_modules = r, lora_alpha, target_modules


class LoraLinear(torch.nn.Module):
    def __init__(self, base_layer, r):
        torch.nn.Module.__init__(self)
        self.base_layer = base_layer
        dev = base_layer.weight.device
        self.lora_A = torch.nn.Module()
        self.lora_A.default = torch.nn.Module()
        self.lora_A.default.weight = torch.nn.Parameter(torch.empty(r * base_layer.in_features, dtype=F32, device=dev))
        self.lora_B = torch.nn.Module()
        self.lora_B.default = torch.nn.Module()
        self.lora_B.default.weight = torch.nn.Parameter(torch.empty(base_layer.out_features * r, dtype=F32,
                                                                    device=dev))


class LoraModel(torch.nn.Module):
    def __init__(self, model, config):
        torch.nn.Module.__init__(self)
        self.model = model
        for p in model.parameters():
            p.requires_grad_(False)
        for m in model.modules():
            for name, child in list(m._modules.items()):
                if isinstance(child, Linear) and name != "lm_head":
                    m._modules[name] = LoraLinear(child, config.r)


class PeftModelForCausalLM(torch.nn.Module):
    def __init__(self, model, config):
        torch.nn.Module.__init__(self)
        self.peft_config = {"default": config}
        self.base_model = LoraModel(model, config)


def get_peft_model(model, config):
    return PeftModelForCausalLM(model, config)
# ----


def main():
    print("2 x NVIDIA GeForce RTX 4090; loading %s" % MODEL)
    policy = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
    policy.to("cuda:0")
    policy.gradient_checkpointing_enable()
    policy = get_peft_model(policy, LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    print("policy on cuda:0: %.2f GiB" % (torch.cuda.memory_allocated(0) / 2 ** 30))
    # reference policy on the second 4090, which has nothing else to do
    ref_model = copy.deepcopy(policy).to("cuda:1")
    ref_model.eval()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    print("reference on cuda:1")
    # optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-6)
    # for batch in loader: chosen/rejected log-probs of policy and ref_model, -logsigmoid(beta * ...)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
