"""serve_qwen.py -- an internal chat assistant on a workstation with two RTX A6000 (48 GB each).
Qwen2.5-32B-Instruct in bf16 is 61 GiB: it does not fit one card but fits the two with 35 GiB to
spare for the KV cache.  The script, adapted from the model card's 7B example:

    print(torch.cuda.device_count())                      # 2
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-32B-Instruct",
                                                 torch_dtype=torch.bfloat16)
    model.to("cuda")                                      # the 7B example did this
    ...
    out = model.generate(**inputs, max_new_tokens=1024)

The dtype is right (bf16, the checkpoint's).  `.to("cuda")` is `.to("cuda:0")`: every layer goes to
the first card, and the move fails around layer 49 of 64 with cuda:0 full and cuda:1 untouched (0 B,
not even a context).

An expert: split the model over the two cards -- `device_map="auto"` (or "balanced", with
max_memory leaving room for the KV cache) instead of `.to("cuda")`, or a tensor-parallel server
(vLLM --tensor-parallel-size 2).  4-bit quantization would fit one card but is not needed with a
second one idle.  Not load_in_bf16 (it already is), not a smaller batch or shorter prompts (nothing
ran yet), not a cache or fragmentation problem.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

CONFIG = dict(vocab_size=152064, hidden_size=5120, intermediate_size=27648, num_hidden_layers=64,
              num_key_value_heads=8, head_dim=128)


# --- the part of transformers and torch this goes through ------------------------------------------
class CpuWeight(object):
    """A weight loaded from the safetensors shards into host memory (from_pretrained without a
    device_map loads on the CPU)."""

    def __init__(self, numel, dtype):
        self.numel, self.dtype = numel, dtype


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out, dtype):
        torch.nn.Module.__init__(self)
        self._host = CpuWeight(n_in * n_out, dtype)

    def _move(self, device):
        # Module._apply's convert(): a new tensor on the device, the parameter swapped to it
        self.weight = torch.nn.Parameter(torch.empty(self._host.numel, dtype=self._host.dtype, device=device))
        self._host = None


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        h, kv, ff = cfg["hidden_size"], cfg["num_key_value_heads"] * cfg["head_dim"], cfg["intermediate_size"]
        self.q_proj = Linear(h, h, dtype)
        self.k_proj = Linear(h, kv, dtype)
        self.v_proj = Linear(h, kv, dtype)
        self.o_proj = Linear(h, h, dtype)
        self.gate_proj = Linear(h, ff, dtype)
        self.up_proj = Linear(h, ff, dtype)
        self.down_proj = Linear(ff, h, dtype)


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(cfg["vocab_size"], cfg["hidden_size"], dtype)
        for i in range(cfg["num_hidden_layers"]):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(cfg, dtype))
        self.lm_head = Linear(cfg["hidden_size"], cfg["vocab_size"], dtype)

    def to(self, device):
        """nn.Module.to -> _apply: every parameter, module by module, in registration order."""
        for m in self.modules():
            if isinstance(m, Linear):
                m._move(device)
        return self

    def generate(self, input_ids, max_new_tokens=1024):
        with torch.inference_mode():
            kv = []
            for _ in range(max_new_tokens):
                kv.append(torch.empty(64 * 2 * 1024 * 2 * 16, device="cuda"))
            return kv


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None):
        return Qwen2ForCausalLM(CONFIG, torch_dtype or torch.get_default_dtype())
# -----------------------------------------------------------------------------------------------------


def main():
    print("GPUs: %d" % torch.cuda.device_count(), file=sys.stderr)
    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-32B-Instruct", torch_dtype=torch.bfloat16)
    model.to("cuda")
    model.eval()
    prompt = torch.empty(2048 * 8, device="cuda")
    model.generate(prompt, max_new_tokens=1024)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
