"""A Jupyter notebook (ipykernel) trying out a 7B instruct model (Mistral-7B-Instruct class, bf16,
13.5 GiB) on a 24 GiB workstation card.  One cell loads the model and generates:

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="cuda")
    out = model.generate(**tok(prompt, return_tensors="pt").to("cuda"), max_new_tokens=256,
                         do_sample=True, temperature=0.7)
    print(tok.decode(out[0]))

It runs fine.  The user edits the temperature in the same cell and runs it again (Shift+Enter).  The
name `model` still holds the first copy (and Out[] / `out` the first answer) while from_pretrained
builds the second one: the re-run fails half way through loading, at 24 GiB with 13.5 GiB of it the
first model's.

An expert: the previous run's model is still alive in the kernel; `del model; gc.collect();
torch.cuda.empty_cache()` (or restart the kernel), and keep the load in its own cell so that editing
the generation settings does not load the model again.  Not quantization, not a bigger GPU, not a
smaller batch: one copy fits with room to spare.
"""
import gc
import os
import sys
import traceback

import torch

import scen_truth

MiB = 1 << 20
# the truth mark's request in bytes: scen_truth.note_every_empty notes torch.empty's first argument,
# which the stand-in counts in elements of the dtype given (bf16: 2 bytes); note the bytes (compiled as
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

H, I, L, V = 4096, 14336, 32, 32768


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(torch.empty(H * H, dtype=dtype, device="cuda"))
        self.k_proj = torch.nn.Parameter(torch.empty(H * 1024, dtype=dtype, device="cuda"))
        self.v_proj = torch.nn.Parameter(torch.empty(H * 1024, dtype=dtype, device="cuda"))
        self.o_proj = torch.nn.Parameter(torch.empty(H * H, dtype=dtype, device="cuda"))
        self.gate_proj = torch.nn.Parameter(torch.empty(H * I, dtype=dtype, device="cuda"))
        self.up_proj = torch.nn.Parameter(torch.empty(H * I, dtype=dtype, device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(I * H, dtype=dtype, device="cuda"))


class MistralForCausalLM(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(V * H, dtype=dtype, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(L):
            setattr(self.layers, str(i), MistralDecoderLayer(dtype))
        self.lm_head = torch.nn.Parameter(torch.empty(V * H, dtype=dtype, device="cuda"))

    def generate(self, input_ids, max_new_tokens=20, do_sample=False, temperature=1.0):
        with torch.no_grad():
            past = []
            for _ in range(L):                            # the KV cache, freed when generate returns
                past.append(torch.empty(2 * 1024 * (input_ids.nbytes + max_new_tokens), dtype=torch.bfloat16,
                                        device="cuda"))
            return torch.empty(input_ids.nbytes + max_new_tokens, device="cuda")


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return MistralForCausalLM(torch_dtype or torch.get_default_dtype())


class Tokenizer(object):
    def __call__(self, text, return_tensors=None):
        return {"input_ids": torch.empty(len(text.split()) * 8, device="cuda")}

    def decode(self, ids):
        return "..."


CELL_2 = '''
model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16, device_map="cuda")
out = model.generate(**tok(prompt, return_tensors="pt"), max_new_tokens=256,
                     do_sample=True, temperature=%s)
print(tok.decode(out))
out
'''


class Kernel(object):
    """What ipykernel does with a cell: compile it under /tmp/ipykernel_PID/HASH.py, run it in the
    user namespace, keep the value of its last line in Out[n] (and _), and on an error show the
    traceback and keep it (sys.last_traceback) for %debug."""

    def __init__(self):
        self.count = 0
        self.user_ns = {"__name__": "__main__", "In": [""], "Out": {}, "torch": torch,
                        "AutoModelForCausalLM": AutoModelForCausalLM, "gc": gc}
        self.dir = "/tmp/ipykernel_%d" % os.getpid()

    def run_cell(self, source):
        self.count += 1
        self.user_ns["In"].append(source)
        body, last = source.strip().rsplit("\n", 1)
        fname = "%s/%d.py" % (self.dir, 2749384521 + self.count)
        exec(compile(body, fname, "exec"), self.user_ns)
        value = eval(compile(last, fname, "eval"), self.user_ns)
        if value is not None:
            self.user_ns["Out"][self.count] = self.user_ns["_"] = value


kernel = Kernel()
kernel.run_cell("name = 'mistralai/Mistral-7B-Instruct-v0.3'\nNone")
kernel.user_ns.update(tok=Tokenizer(), prompt="Write a haiku about GPUs running out of memory.")
try:
    kernel.run_cell(CELL_2 % "0.7")              # loads, answers
    kernel.run_cell(CELL_2 % "0.9")              # the same cell, edited and run again
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
    traceback.print_exc()
    sys.exit(1)
sys.exit(0)
