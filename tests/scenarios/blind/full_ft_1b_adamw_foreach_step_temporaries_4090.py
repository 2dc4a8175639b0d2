"""finetune_1b.py -- full fine-tuning of a 1.3B decoder (24 layers, fp32 master weights, bf16 autocast)
with torch.optim.AdamW at its defaults on an RTX 4090 24 GB, batch 4 x 512 with gradient checkpointing:

    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)   # foreach by default on CUDA
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

The user did the arithmetic: 1.3B x (4 weights + 4 grads + 8 Adam) = 19.6 GiB, plus activations that
are gone before the step: it should fit in 24 GiB, and forward and backward do.  The first
optimizer.step() makes exp_avg and exp_avg_sq for every parameter (9.8 GiB) -- that still fits -- and
then the multi-tensor (foreach) kernel that PyTorch picks by default on CUDA computes the denominator
sqrt(exp_avg_sq) + eps for the whole parameter list at once: a temporary as large as all the weights
(4.9 GiB), and that is what fails, partway through.

An expert: the state is complete, the failure is the foreach step's own temporaries.  Pass fused=True
(or foreach=False) to AdamW: same math, the update runs per tensor in one kernel with no full-size
intermediate, and the job fits with room to spare.  An 8-bit AdamW would also fit but changes the
optimizer.  Not the batch, checkpointing, autocast (all irrelevant at the step), not the cache.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 24
scen_truth.note_every_empty(torch)

# --- stand-in scaffolding: PyTorch's default AdamW on CUDA is the multi-tensor (foreach) implementation
# (torch/optim/adamw.py: _multi_tensor_adamw).  The stand-in torch's AdamW makes only the state; this
# gives it the foreach step's intermediate, compiled as part of torch's own adamw.py so that the failing
# frames are torch's, as in PyTorch.
_FOREACH = '''
def _multi_tensor_adamw(params, grads, exp_avgs, exp_avg_sqs):
    # torch._foreach_sqrt(device_exp_avg_sqs), then _foreach_div_/_foreach_add_ in place
    exp_avg_sq_sqrt = [torch.empty(s.nbytes, device=s.device) for s in exp_avg_sqs]
    del exp_avg_sq_sqrt


def _update(self):
    for p in self.param_groups[0]["params"]:
        if p not in self.state:
            self.state[p] = {"step": 0,
                             "exp_avg": torch.empty(p.nbytes, device=p.device),
                             "exp_avg_sq": torch.empty(p.nbytes, device=p.device)}
        self.state[p]["step"] += 1
    ps = [p for p in self.param_groups[0]["params"] if p.grad is not None]
    _multi_tensor_adamw(ps, [p.grad for p in ps], [self.state[p]["exp_avg"] for p in ps],
                        [self.state[p]["exp_avg_sq"] for p in ps])
'''
_ns = {"torch": torch}
exec(compile(_FOREACH, sys.modules["torch.optim.adamw"].__file__, "exec"), _ns)
torch.optim.AdamW._update = _ns["_update"]
# --- end of scaffolding


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(16 * MiB, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(32 * MiB, dtype=torch.float32, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, hidden):
        out = torch.empty(4 * 512 * 2048 * 2, device="cuda")
        out._saved = hidden
        return out


class CausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(50272 * 2048, dtype=torch.float32, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids, labels):
        h = torch.empty(4 * 512 * 2048 * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(4 * 512 * 50272 * 4, device="cuda")
        logits._saved = h
        return torch.nn.functional.cross_entropy(logits, labels)


def main():
    model = CausalLM()
    model.train()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.1)
    for step in range(10000):
        input_ids = torch.empty(4 * 512 * 8, device="cuda")
        labels = torch.empty(4 * 512 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above (at the failure itself)
sys.exit(0)
