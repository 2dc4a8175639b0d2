"""sft_lora.py -- LoRA supervised fine-tuning of a 3B decoder (Llama-3.2-3B class, bf16 base weights
frozen, 6 GiB) on a 24 GiB card, gradient checkpointing on, micro-batches of 2 x 2048 tokens and 8
accumulation steps.  The user wrote the accumulation loop by hand, summing the micro-batch losses
and calling backward once per optimizer step:

    for step in range(num_steps):
        accum_loss = 0.0
        for micro in range(grad_accum_steps):
            out = model(**next(batches))
            accum_loss += out.loss / grad_accum_steps      # the sum keeps every micro-batch's graph
        accum_loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

Each micro-batch's graph (its layer checkpoints, 2048 x 2 x 128k-vocab logits and their log-softmax,
~2.7 GiB) stays alive until the single backward, so memory climbs micro-batch after micro-batch; the
7th micro-batch of the very first optimizer step fails in the model's lm_head.  One micro-batch alone
fits easily (~9 GiB with the base weights).

An expert: the summed loss holds all eight graphs; call backward on each micro-batch's loss
((out.loss / grad_accum_steps).backward() inside the loop, the gradients accumulate in .grad), and log
with .item().  Not a smaller micro-batch or more checkpointing as the fix (one micro-batch is fine),
not the allocator settings, not quantization or a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
# the truth mark's request in bytes: scen_truth.note_every_empty notes torch.empty's first argument, which the stand-in
# counts in elements of the dtype given (bf16: 2 bytes); note the bytes (compiled as part of torch's
# file, as scen_truth's wrapper is, so that the failing Python line stays the program's)
_NOTED_BYTES = """
def noted_bytes(n, *args, **kw):
    dtype = kw.get("dtype", args[0] if args else None)
    _last.update(n=int(n) * _ITEMSIZE[dtype or "uint8"], reserved=torch.cuda.memory_reserved())
    return plain(n, *args, **kw)
"""
_ns = {"_last": scen_truth._last, "torch": torch, "plain": torch.empty, "_ITEMSIZE": torch._ITEMSIZE}
exec(compile(_NOTED_BYTES, torch.__file__, "exec"), _ns)
torch.empty = _ns["noted_bytes"]

# -- the stand-in has no arithmetic: a sum or a quotient of losses is a new scalar whose graph keeps
#    what it was made from, as autograd's AddBackward/DivBackward nodes do
def _scalar_from(parts, params):
    out = torch.empty(512, device="cuda")
    out._saved = parts[-1]
    out._inputs = parts
    out._params = params
    return out


def _add(a, b):
    if not isinstance(a, torch.Tensor):
        return b
    if not isinstance(b, torch.Tensor):
        return a
    return _scalar_from((a, b), tuple(a._params) + tuple(p for p in b._params if all(p is not q for q in a._params)))


def _div(a, k):
    return _scalar_from((a,), a._params)


torch.Tensor.__add__ = _add
torch.Tensor.__radd__ = lambda a, b: _add(b, a)
torch.Tensor.__truediv__ = _div


# -- the model: bf16 base weights frozen, LoRA A/B on q and v trainable
HIDDEN, LAYERS, VOCAB = 3072, 28, 128256


class LoraLinear(torch.nn.Module):
    def __init__(self, n_in, n_out, r=16):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.lora_A = torch.nn.Parameter(torch.empty(n_in * r, dtype=torch.float32, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(r * n_out, dtype=torch.float32, device="cuda"))


class FrozenLinear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = LoraLinear(HIDDEN, HIDDEN)
        self.k_proj = FrozenLinear(HIDDEN, 1024)
        self.v_proj = LoraLinear(HIDDEN, 1024)
        self.o_proj = FrozenLinear(HIDDEN, HIDDEN)
        self.gate_proj = FrozenLinear(HIDDEN, 8192)
        self.up_proj = FrozenLinear(HIDDEN, 8192)
        self.down_proj = FrozenLinear(8192, HIDDEN)

    def forward(self, hidden):
        # gradient checkpointing: only the layer's input is kept for backward (2 x 2048 x 3072 bf16)
        out = torch.empty(2 * 2048 * HIDDEN, dtype=torch.bfloat16, device="cuda")
        out._saved = hidden
        return out


class LlamaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = FrozenLinear(VOCAB, HIDDEN)
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        h = torch.empty(2 * 2048 * HIDDEN, dtype=torch.bfloat16, device="cuda")
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self.layers, str(i))(h)
        return h


class Output(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = FrozenLinear(HIDDEN, VOCAB // 2)     # tied with the embedding in the real model

    def forward(self, input_ids, labels):
        h = self.model(input_ids)
        logits = torch.empty(2 * 2048 * VOCAB, dtype=torch.bfloat16, device="cuda")   # 1 GiB
        logits._saved = h
        loss = F.cross_entropy(logits, labels)                                        # log-softmax, 1 GiB
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        return Output(loss, logits)


def batches():
    while True:
        ids = torch.empty(2 * 2048 * 8, device="cuda")
        yield {"input_ids": ids, "labels": ids}


micro_batch_size = 2
grad_accum_steps = 8
num_steps = 500


def train(model, optimizer, data):
    for step in range(num_steps):
        accum_loss = 0.0
        for micro in range(grad_accum_steps):
            out = model(**next(data))
            accum_loss += out.loss / grad_accum_steps
        accum_loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        print("step %d loss %.4f" % (step, 0.0))


try:
    model = LlamaForCausalLM()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4)
    train(model, optimizer, batches())
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
