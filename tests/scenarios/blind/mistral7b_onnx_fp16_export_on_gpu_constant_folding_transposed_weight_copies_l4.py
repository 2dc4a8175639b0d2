"""export_onnx.py -- the export step of a serving pipeline: a CI job on a GPU runner (one NVIDIA L4, 24 GB) turns
the fine-tuned Mistral-7B checkpoint into an fp16 ONNX model for ONNX Runtime / TensorRT.  fp16 export is only
supported on the GPU (optimum refuses `--fp16` with `--device cpu`), so the job does what `optimum-cli export onnx
--device cuda --fp16` does:

    model = AutoModelForCausalLM.from_pretrained(ckpt, torch_dtype=torch.float16).to("cuda")    # 13.5 GiB
    model.eval()
    with torch.no_grad():
        torch.onnx.export(model, (input_ids, attention_mask), "model.onnx", opset_version=17,
                          do_constant_folding=True, input_names=[...], dynamic_axes={...})

Tracing needs little (a dummy batch of 2 x 16 tokens).  Then the exporter's constant folding
(`_C._jit_pass_onnx_constant_fold`, C++) evaluates every subgraph whose inputs are all initializers: each
nn.Linear applied to a 3-D input is exported as MatMul(x, Transpose(W)), and folding Transpose(W) makes a new,
transposed fp16 tensor on W's device for every q/k/v/o/gate/up/down projection and the LM head -- 7.1B
parameters, 13.2 GiB -- while the model still holds the originals (they are dropped only after the pass
returns).  Weights 13.5 GiB + context + copies need ~27 GiB; the L4 is full after ~20 of the 32 layers' copies.
The copies are held by the C++ pass, not by any Python name.

What an expert says first: the export, not the model, doubles the weights on the GPU; export where there is room
for two copies -- on the CPU (export fp32 on the host and convert the ONNX model to fp16 afterwards with
onnxconverter-common / ORT's transformer optimizer), or with do_constant_folding=False and let ORT/TensorRT fold
later.  (A one-off export on a 48-80 GB card also works.)  Wrong advice: a smaller batch or shorter sequences
(the dummy input is tiny), gradient checkpointing, inference_mode (no_grad is on), mixed precision (it is fp16),
flash-attention, empty_cache / expandable segments (nothing is cached), quantizing the model (changes the
artifact being exported).
"""
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- scaffolding: torch.onnx as far as this job reaches it, compiled under torch's own path so that the
# failing stack shows the exporter's frames (torch/onnx/utils.py) as PyTorch's does; the folded tensors live in
# an object of torch's own (the C++ pass holds them in PyTorch), not under a Python name of the program.
_ONNX_SRC = '''
import torch


class _FoldState(object):
    """What _C._jit_pass_onnx_constant_fold holds while it runs (C++ in PyTorch)."""
    __module__ = "torch._C"

    def __init__(self):
        self._values = []


def _jit_pass_onnx_constant_fold(graph, params_dict, opset_version):
    state = _FoldState()
    for name, w in params_dict.items():
        if name.endswith("_proj") or name == "lm_head":
            # onnx::Transpose(W) evaluated on W's device: a new, transposed copy
            state._values.append(torch.empty(w.nbytes // 2, dtype=torch.float16, device=w.device))
    folded = dict(params_dict)
    return folded


def _named_parameters(module, prefix=""):
    for k, p in module._parameters.items():
        yield prefix + k, p
    for k, m in module._modules.items():
        for item in _named_parameters(m, prefix + k + "."):
            yield item


def _create_jit_graph(model, args):
    """torch.jit trace of the model on the example inputs: a forward pass (small here)."""
    out = model(*args)
    return "graph", dict(_named_parameters(model))


def _model_to_graph(model, args, do_constant_folding, opset_version):
    graph, params_dict = _create_jit_graph(model, args)
    if do_constant_folding:
        params_dict = _jit_pass_onnx_constant_fold(graph, params_dict, opset_version)
    return graph, params_dict


def export(model, args, f, opset_version=17, do_constant_folding=True, input_names=None, output_names=None,
           dynamic_axes=None):
    graph, params = _model_to_graph(model, args, do_constant_folding, opset_version)
    return None
'''
_onnx = types.ModuleType("torch.onnx")
_onnx.__file__ = os.path.join(os.path.dirname(torch.__file__), "onnx", "utils.py")
exec(compile(_ONNX_SRC, _onnx.__file__, "exec"), _onnx.__dict__)
torch.onnx = _onnx
sys.modules["torch.onnx"] = _onnx
# ---- end of scaffolding

HIDDEN, INTER, KV, LAYERS, VOCAB = 4096, 14336, 1024, 32, 32000
FP16 = torch.float16


def linear(cout, cin):
    return torch.nn.Parameter(torch.empty(cout * cin, dtype=FP16, device="cuda"), requires_grad=False)


class MistralAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj = linear(HIDDEN, HIDDEN), linear(KV, HIDDEN)
        self.v_proj, self.o_proj = linear(KV, HIDDEN), linear(HIDDEN, HIDDEN)

    def forward(self, h, tokens):
        return torch.empty(tokens * HIDDEN, dtype=FP16, device="cuda")


class MistralMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj, self.up_proj = linear(INTER, HIDDEN), linear(INTER, HIDDEN)
        self.down_proj = linear(HIDDEN, INTER)

    def forward(self, h, tokens):
        return torch.empty(tokens * HIDDEN, dtype=FP16, device="cuda")


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = MistralAttention()
        self.mlp = MistralMLP()
        self.input_layernorm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=FP16, device="cuda"), requires_grad=False)
        self.post_attention_layernorm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=FP16, device="cuda"),
                                                           requires_grad=False)

    def forward(self, h, tokens):
        return self.mlp(self.self_attn(h, tokens), tokens)


class MistralModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=FP16, device="cuda"),
                                               requires_grad=False)
        self.layers = torch.nn.Module()                   # nn.ModuleList
        for i in range(LAYERS):
            setattr(self.layers, str(i), MistralDecoderLayer())
        self.norm = torch.nn.Parameter(torch.empty(HIDDEN, dtype=FP16, device="cuda"), requires_grad=False)

    def forward(self, input_ids, attention_mask):
        tokens = 2 * 16
        h = torch.empty(tokens * HIDDEN, dtype=FP16, device="cuda")
        for i in range(LAYERS):
            h = getattr(self.layers, str(i))(h, tokens)
        return h


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = MistralModel()
        self.lm_head = linear(VOCAB, HIDDEN)

    def forward(self, input_ids, attention_mask):
        h = self.model(input_ids, attention_mask)
        return torch.empty(2 * 16 * VOCAB, dtype=FP16, device="cuda")       # logits of the dummy batch


def main():
    model = MistralForCausalLM().to("cuda")              # from_pretrained(ckpt, torch_dtype=torch.float16)
    model.eval()
    input_ids = torch.empty(2 * 16 * 8, device="cuda")                  # int64 dummy inputs, 2 x 16
    attention_mask = torch.empty(2 * 16 * 8, device="cuda")
    with torch.no_grad():
        torch.onnx.export(model, (input_ids, attention_mask), "onnx/model.onnx", opset_version=17,
                          do_constant_folding=True, input_names=["input_ids", "attention_mask"],
                          output_names=["logits"],
                          dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"}})


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
