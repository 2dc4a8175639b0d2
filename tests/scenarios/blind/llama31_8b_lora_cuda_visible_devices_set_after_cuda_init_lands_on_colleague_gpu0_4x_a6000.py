"""finetune_lora.py -- a research group's shared server with four RTX A6000s (48 GB each) and no scheduler: the
rule is "look at nvidia-smi, take a free GPU".  This morning nvidia-smi shows GPU 0 at 38 GiB (Priya's SD3
fine-tune), GPU 1 at 30 GiB, GPU 2 at 44 GiB and GPU 3 empty, so a master's student starts his LoRA run of
Llama-3.1-8B-Instruct (bf16, 15 GiB of weights) with `python finetune_lora.py --gpu 3`.  The script picks
the GPU itself, a few lines after its environment check:

    import torch
    ...
    args = parser.parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    print(f"Found {torch.cuda.device_count()} GPUs")
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu          # "use only the GPU I picked"
    device = torch.device("cuda")
    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
    model.to(device)
    model = get_peft_model(model, lora_config)

torch.cuda.is_available() asks the driver for the device count (cudaGetDeviceCount, cuInit), and the driver
reads CUDA_VISIBLE_DEVICES once, at cuInit: the assignment two lines later changes the environment of a
process whose CUDA has already enumerated all four GPUs.  "cuda" is then cuda:0 -- Priya's GPU -- and the
model's move to it fails two-thirds of the way through the weights, with 9.5 GiB free on a 48 GB card while
GPU 3 sits idle.

An expert: you are on the wrong GPU.  The environment variable was set after CUDA initialised, so it had no
effect; the process enumerated all four GPUs and used GPU 0.  Set CUDA_VISIBLE_DEVICES in the shell
(`CUDA_VISIBLE_DEVICES=3 python finetune_lora.py`) or at the very top of the script before torch touches
CUDA (before torch.cuda.is_available()), or select the device explicitly (torch.device("cuda:3") /
torch.cuda.set_device(3)).  On GPU 3 the model and the LoRA run fit with room to spare.
Wrong first advice: stopping the other processes on GPU 0 (a colleague's training run, which this job has no
business being next to), 4-bit quantization, CPU offload, a smaller batch, gradient checkpointing (all of
them squeeze this run into what is left of someone else's card, and it still fails the moment her job
grows), a bigger GPU (it is a 48 GB card; 15 GiB of weights fit), expandable_segments / empty_cache (nothing
is cached), restarting the process (it lands on GPU 0 again with the same script).
"""
import argparse
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MODEL = "meta-llama/Llama-3.1-8B-Instruct"

# ---- stand-in gaps, under the file names of the PyTorch code they stand for:
# torch.device, and Module.to / Module._apply as PyTorch runs them: each parameter is converted in turn
# (param_applied = fn(param): a new tensor on the device) and replaces the old one in _parameters.
_GAPS = '''
class device(object):
    def __init__(self, type, index=None):
        if ":" in type:
            type, index = type.split(":")
        self.type = type
        self.index = None if index is None else int(index)

    def __repr__(self):
        return "device(type=%r%s)" % (self.type, "" if self.index is None else ", index=%d" % self.index)
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.device = _ns["device"]

_MODULE_TO = '''
def _apply(self, fn, recurse=True):
    for module in self.modules():
        for key, param in list(module._parameters.items()):
            if param is None:
                continue
            param_applied = fn(param)
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
    """A parameter as from_pretrained leaves it without a device_map: safetensors read into host memory."""
    is_cuda = False
    device = "cpu"
    requires_grad = True

    def __init__(self, numel, dtype):
        self.dtype = dtype
        self.nbytes = numel * torch._ITEMSIZE[dtype]


class LlamaConfig(object):
    vocab_size = 128256
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 8
    head_dim = 128


def _host_module(**shapes):
    m = torch.nn.Module()
    for name, (numel, dtype) in shapes.items():
        m._parameters[name] = HostParameter(numel, dtype)
    return m


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.config = cfg
        h, i, kv = cfg.hidden_size, cfg.intermediate_size, cfg.num_key_value_heads * cfg.head_dim
        self.model = torch.nn.Module()
        self.model.embed_tokens = _host_module(weight=(cfg.vocab_size * h, dtype))
        self.model.layers = torch.nn.Module()
        for n in range(cfg.num_hidden_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Module()
            for proj, numel in (("q_proj", h * h), ("k_proj", kv * h), ("v_proj", kv * h), ("o_proj", h * h)):
                setattr(layer.self_attn, proj, _host_module(weight=(numel, dtype)))
            layer.mlp = torch.nn.Module()
            for proj in ("gate_proj", "up_proj", "down_proj"):
                setattr(layer.mlp, proj, _host_module(weight=(h * i, dtype)))
            layer.input_layernorm = _host_module(weight=(h, dtype))
            layer.post_attention_layernorm = _host_module(weight=(h, dtype))
            setattr(self.model.layers, str(n), layer)
        self.model.norm = _host_module(weight=(h, dtype))
        self.lm_head = _host_module(weight=(cfg.vocab_size * h, dtype))


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, **kwargs):
        # no device_map: the four safetensors shards are read into host memory
        return LlamaForCausalLM(LlamaConfig(), torch_dtype or torch.float32)


def parse_args():
    parser = argparse.ArgumentParser()
    parser.add_argument("--gpu", default="0", help="which GPU to use (index as nvidia-smi shows it)")
    parser.add_argument("--dataset", default="data/support_tickets_sft.jsonl")
    parser.add_argument("--lora_r", type=int, default=16)
    parser.add_argument("--per_device_train_batch_size", type=int, default=4)
    parser.add_argument("--max_seq_length", type=int, default=2048)
    return parser.parse_args()


def main():
    args = parse_args()
    if not torch.cuda.is_available():
        sys.exit("no CUDA device")
    print(f"Found {torch.cuda.device_count()} GPUs")
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpu          # "use only the GPU I picked"
    device = torch.device("cuda")
    print(f"Training on GPU {args.gpu} ({device})")

    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16)
    model.to(device)
    print("model on", device)
    # model = get_peft_model(model, LoraConfig(r=args.lora_r, ...)); trainer = SFTTrainer(...); trainer.train()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
