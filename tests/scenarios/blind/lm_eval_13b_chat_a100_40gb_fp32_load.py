"""run_eval.py -- a benchmark script (lm-eval style: MMLU, HellaSwag, ARC) for a 13B chat model
(Llama-2-13b-chat-hf: 40 layers, hidden 5120, published in bfloat16, 26 GB of safetensors) on one
A100 40GB.  The user reasons "26 GB of weights, 40 GB card, fits" and loads it as the model card's
first example does, without a dtype:

    model = AutoModelForCausalLM.from_pretrained(args.model, device_map="cuda:0")   # no torch_dtype
    model.eval()
    for task in tasks: evaluate(model, tokenizer, task)

transformers 4.46 builds the model in the default dtype, float32, whatever config.json says
("torch_dtype": "bfloat16"), and upcasts each bf16 tensor of the checkpoint as it places it on the
GPU: 48.5 GiB instead of 24.2 GiB.  The load fails in the second shard, about 32 of the 40 layers in,
before any evaluation ran.

An expert: the checkpoint is bf16 and the model is being materialised in fp32: pass
torch_dtype=torch.bfloat16 (or "auto"); it then takes 24 GiB and the evaluation fits.  Not a smaller
batch, not gradient checkpointing, not autocast (the weights would still be fp32), not the allocator's
settings; 8-bit loading would fit but changes the numbers the benchmark reports.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
# the truth mark's request in bytes: scen_truth.note_every_empty notes torch.empty's first argument,
# which the stand-in counts in elements of the dtype given (fp32: 4 bytes); note the bytes (compiled as
# part of torch's file, as scen_truth's wrapper is, so that the failing Python line stays the program's)
_NOTED_BYTES = """
def noted_bytes(n, *args, **kw):
    dtype = kw.get("dtype", args[0] if args else None)
    _last.update(n=int(n) * _ITEMSIZE[dtype or "uint8"], reserved=torch.cuda.memory_reserved())
    return plain(n, *args, **kw)
"""
_ns = {"_last": scen_truth._last, "torch": torch, "plain": torch.empty, "_ITEMSIZE": torch._ITEMSIZE}
exec(compile(_NOTED_BYTES, torch.__file__, "exec"), _ns)
torch.empty = _ns["noted_bytes"]

# -- the checkpoint on disk: config.json and three safetensors shards of bf16 tensors (element counts)
H, I, L, V = 5120, 13824, 40, 32000


def checkpoint_index():
    names = [("model.embed_tokens.weight", V * H)]
    for i in range(L):
        p = "model.layers.%d." % i
        names += [(p + "self_attn.q_proj.weight", H * H), (p + "self_attn.k_proj.weight", H * H),
                  (p + "self_attn.v_proj.weight", H * H), (p + "self_attn.o_proj.weight", H * H),
                  (p + "mlp.gate_proj.weight", H * I), (p + "mlp.up_proj.weight", H * I),
                  (p + "mlp.down_proj.weight", I * H),
                  (p + "input_layernorm.weight", H), (p + "post_attention_layernorm.weight", H)]
    names += [("model.norm.weight", H), ("lm_head.weight", V * H)]
    shard, shards, size = [], [], 0
    for n, numel in names:                               # ~9.9 GB shards, as the hub's
        shard.append((n, numel))
        size += numel * 2
        if size > 9900 * 1000 * 1000:
            shards.append(shard)
            shard, size = [], 0
    shards.append(shard)
    return shards


class PreTrainedModel(torch.nn.Module):
    config_class = dict

    @classmethod
    def from_pretrained(cls, path, device_map=None, torch_dtype=None, **kwargs):
        config = json.load(open(os.path.join(path, "config.json")))
        dtype = torch_dtype or torch.get_default_dtype()           # float32 unless asked otherwise
        if dtype == "auto":
            dtype = config["torch_dtype"]
        model = cls(config)
        device = 0 if device_map in ("cuda", "cuda:0", "auto", 0) else None
        for shard in checkpoint_index():
            model._load_shard(shard, dtype, device)
        return model

    def _load_shard(self, shard, dtype, device):
        for name, numel in shard:
            # the bf16 tensor read from the safetensors file, cast to the model's dtype on the device
            param = torch.nn.Parameter(torch.empty(numel, dtype=dtype, device=device), requires_grad=True)
            self._parameters[name.replace(".", "_")] = param


class LlamaForCausalLM(PreTrainedModel):
    def __init__(self, config):
        PreTrainedModel.__init__(self)
        self.config = config


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, path, **kwargs):
        return LlamaForCausalLM.from_pretrained(path, **kwargs)


def evaluate(model, task):
    return 0.0


def main():
    ckpt = tempfile.mkdtemp(prefix="Llama-2-13b-chat-hf.")
    with open(os.path.join(ckpt, "config.json"), "w") as f:
        json.dump({"architectures": ["LlamaForCausalLM"], "hidden_size": H, "intermediate_size": I,
                   "num_hidden_layers": L, "vocab_size": V, "torch_dtype": "bfloat16"}, f)
    model = AutoModelForCausalLM.from_pretrained(ckpt, device_map="cuda:0")
    model.eval()
    for task in ("mmlu", "hellaswag", "arc_challenge"):
        print(task, evaluate(model, task))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
