"""score_pairs.py -- offline scoring of preference pairs with a 13B reward model (a Llama-2-13B
backbone and a scalar value head) on a 40 GiB A100.  The team's loader builds the architecture from
its config and then copies the bf16 safetensors checkpoint into it:

    config = AutoConfig.from_pretrained(ckpt_dir)
    model = RewardModel(config)                          # built on the CPU in the default dtype: fp32
    model.load_state_dict(load_file(ckpt_dir + "/model.safetensors"))   # bf16 tensors, upcast on copy
    model.cuda().eval()                                  # 4 bytes per parameter to the GPU
    with torch.no_grad():
        for batch in pairs: scores.append(model(**batch).float().cpu())

The checkpoint holds 24.2 GiB of bf16 weights, which fit the card with 15 GiB to spare for the
scoring batches.  Built in float32, the model is 48.4 GiB: model.cuda() moves it layer by layer and
fails in layer 33 of 40, before a single pair is scored.  An expert: build the model in bf16
(RewardModel(config).to(torch.bfloat16), torch.set_default_dtype(torch.bfloat16) around the
constructor, or from_pretrained(..., torch_dtype=torch.bfloat16)) before moving it.  The state dict
is already on the CPU; nothing else is on the card; no batch has run, so batch size is beside the
point; quantization is not needed.
"""
import sys
import torch
import scen_truth

scen_truth.note_every_empty(torch)
HIDDEN, FFN, VOCAB, LAYERS = 5120, 13824, 32000, 40
DEFAULT_DTYPE = torch.float32        # torch.get_default_dtype(): nobody changed it
ITEMSIZE = {torch.float32: 4, torch.bfloat16: 2}     # the stand-in's torch.empty counts bytes


class CPUTensor(object):
    """A parameter while the model is on the CPU: numel elements of dtype (no device memory)."""

    def __init__(self, numel, dtype):
        self.numel, self.dtype = numel, dtype



class Module(torch.nn.Module):
    """nn.Module with its parameters on the CPU until .cuda() (the stand-in's Module has no CPU side)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        object.__setattr__(self, "_cpu", {})

    def param(self, name, numel):
        self._cpu[name] = CPUTensor(numel, DEFAULT_DTYPE)

    def load_state_dict(self, state_dict, strict=True):
        # copy_ into the existing fp32 parameters: the bf16 values are upcast, the dtype stays fp32
        return None


# Tensor.cuda() and nn.Module.cuda()/_apply as PyTorch runs them: their frames are the framework's,
# so these stand-ins are compiled as part of torch's own file (as scen_truth does): the failing
# Python line stays the program's `model.cuda().eval()`.
_MOVE = """
def tensor_cuda(self):
    return torch.nn.Parameter(torch.empty(self.numel * ITEMSIZE[self.dtype], device="cuda"))


def _apply(self, fn):
    for m in self.modules():
        for name, t in list(m.__dict__.get("_cpu", {}).items()):
            setattr(m, name, fn(t))            # param_applied = fn(param), as nn.Module._apply
            del m._cpu[name]
    return self


def module_cuda(self, device=None):
    return self._apply(lambda t: t.cuda())
"""
_ns = {"torch": torch, "ITEMSIZE": ITEMSIZE}
exec(compile(_MOVE, torch.__file__, "exec"), _ns)
CPUTensor.cuda, Module._apply, Module.cuda = _ns["tensor_cuda"], _ns["_apply"], _ns["module_cuda"]


class DecoderLayer(Module):
    def __init__(self):
        Module.__init__(self)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            self.param(n, HIDDEN * HIDDEN)
        for n in ("gate_proj", "up_proj", "down_proj"):
            self.param(n, HIDDEN * FFN)


class RewardModel(Module):
    def __init__(self, config):
        Module.__init__(self)
        self.param("embed_tokens", VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, DecoderLayer())
        self.param("score", HIDDEN * 2)


def load_file(path):
    return {"model.embed_tokens.weight": "bf16"}      # the checkpoint, on the CPU


def main():
    config = {"hidden_size": HIDDEN, "intermediate_size": FFN, "num_hidden_layers": LAYERS}
    model = RewardModel(config)
    model.load_state_dict(load_file("rm-13b/model.safetensors"))
    model.cuda().eval()
    with torch.no_grad():
        for batch in range(1000):
            x = torch.empty(16 * 2048 * HIDDEN * 2, device="cuda")
            del x


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
