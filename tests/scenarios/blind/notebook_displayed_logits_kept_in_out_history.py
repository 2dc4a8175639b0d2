"""A Jupyter notebook on a workstation with an RTX A6000 (48 GB): Llama-3-8B-Instruct in bf16 (15 GiB),
looking at the next-token distributions of a few eval prompts, one cell run again and again:

    [3]  model = AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16).cuda()
    [4]  with torch.no_grad():
             out = model(**tok(eight_2048_token_documents, return_tensors="pt").to("cuda"))
         out.logits                        # <- last expression of the cell: the notebook shows it
    ...  (cell [4] run eight times, with another batch each time)
    [12] del out; gc.collect(); torch.cuda.empty_cache()      # "free the memory"
    [13] cell [4] once more  ->  CUDA out of memory

"Each run makes one logits tensor (8 x 2048 x 128256 bf16, 3.9 GiB) and I delete `out` each time, so
why does memory keep going up, and why does empty_cache not give anything back?"  IPython keeps the
value of every cell's last expression in its output history: Out[4], Out[5], ... and the globals
_4, _5, ..., _ / __ / ___.  Eight logits tensors, 31 GiB, stay alive through those references,
though no name of the user's own holds them.

An expert: the memory is held by Python objects this long-lived kernel keeps (the output cache), it
grew run after run; release them (`Out.clear()` / `%reset -f out`, end the cell with `;`, or set
InteractiveShell.cache_size=0 / print a summary instead of the tensor).  empty_cache cannot help (the
tensors are alive), and a smaller batch, quantization, a bigger card or inference_mode (already
no_grad) are wrong first answers.
"""
import gc
import sys

import torch
from torch import nn
import scen_truth

MiB = 1 << 20
batch_size = 8
max_length = 2048
vocab = 128256


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        # q, o: 4096 x 4096; k, v: 4096 x 1024 (GQA); gate, up, down: 4096 x 14336; bf16
        self.q_proj = nn.Parameter(torch.empty(4096 * 4096, dtype=torch.bfloat16), requires_grad=False)
        self.k_proj = nn.Parameter(torch.empty(4096 * 1024, dtype=torch.bfloat16), requires_grad=False)
        self.v_proj = nn.Parameter(torch.empty(4096 * 1024, dtype=torch.bfloat16), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(4096 * 4096, dtype=torch.bfloat16), requires_grad=False)
        self.gate_proj = nn.Parameter(torch.empty(4096 * 14336, dtype=torch.bfloat16), requires_grad=False)
        self.up_proj = nn.Parameter(torch.empty(4096 * 14336, dtype=torch.bfloat16), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(14336 * 4096, dtype=torch.bfloat16), requires_grad=False)

    def forward(self, hidden):
        # the MLP's 14336-wide intermediate, bf16, freed when the layer returns (no_grad)
        tmp = torch.empty(batch_size * max_length * 14336, dtype=torch.bfloat16)
        del tmp
        return hidden


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(vocab * 4096, dtype=torch.bfloat16), requires_grad=False)
        self.layers = [LlamaDecoderLayer() for _ in range(32)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(vocab * 4096, dtype=torch.bfloat16), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def forward(self, input_ids=None, attention_mask=None):
        hidden = torch.empty(batch_size * max_length * 4096, dtype=torch.bfloat16)
        for layer in self.layers:
            hidden = layer(hidden)
        logits = torch.empty(batch_size * max_length * vocab, dtype=torch.bfloat16)
        return CausalLMOutput(logits)


# IPython's output history: the user namespace of the kernel (__main__) holds Out and the _N names
Out = {}
_ = __ = ___ = ""


def display_hook(n, value):
    """What IPython's displayhook does with a cell's last expression: the value goes into Out[n] and the
    globals _n, _, __, ___ (the notebook shows its repr)."""
    global _, __, ___
    Out[n] = value
    globals()["_%d" % n] = value
    ___, __, _ = __, _, value


def cell_4(n):
    global out
    with torch.no_grad():
        out = model(input_ids=None, attention_mask=None)
    display_hook(n, out.logits)


scen_truth.note_every_empty(torch)
try:
    model = LlamaForCausalLM.from_pretrained("meta-llama/Meta-Llama-3-8B-Instruct", torch_dtype=torch.bfloat16)
    for n in range(4, 12):           # cells [4]..[11]: the same cell, another batch each time
        cell_4(n)
        del out
    gc.collect()                     # cell [12]
    torch.cuda.empty_cache()
    cell_4(13)                       # cell [13]
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
