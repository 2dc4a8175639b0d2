"""The stand-in torch's autograd as far as memory goes (tests/adapter/run_tests.sh): a nested model's
backward gives a gradient to every parameter that requires grad and took part in the forward (its own, its
submodules', one read as an attribute, through torch.nn.functional), none to a frozen or an unused one;
each gradient has its parameter's size, dtype and device, is accumulated into at the next backward and
dropped by zero_grad() (kept with set_to_none=False); no graph under no_grad or after detach.  Exits
non-zero on a difference."""
import weakref

import torch
import torch.nn.functional as F

MiB = 1 << 20


def param(n, dtype=None, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=dtype), requires_grad)


class Linear(torch.nn.Module):
    def __init__(self, n, dtype=None, requires_grad=True):
        torch.nn.Module.__init__(self)
        self.weight = param(n, dtype, requires_grad)

    def forward(self, x):
        return torch.empty(x.nbytes)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = Linear(2 * MiB)
        self.mlp = Linear(3 * MiB, dtype=torch.bfloat16)

    def forward(self, x):
        return self.mlp(self.attn(x))


class Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed = Linear(4 * MiB)
        self.blocks = Block()
        self.frozen = Linear(5 * MiB, requires_grad=False)
        self.unused = Linear(6 * MiB)
        self.scale = param(1 * MiB)

    def forward(self, x):
        h = self.frozen(self.blocks(self.embed(x)))
        out = torch.empty(h.nbytes)                 # a new tensor of this module's forward
        w = self.embed.weight                       # a tied head: the embedding read as an attribute
        return {"logits": out, "w": w.nbytes}


m = Model()
x = torch.empty(1 * MiB)
logits = m(x)["logits"]
loss = F.cross_entropy(logits, None)
loss.backward()
want = [m.embed.weight, m.blocks.attn.weight, m.blocks.mlp.weight, m.scale]
got = [n for n, p in m.named_parameters() if p.grad is not None]
assert sorted(got) == ["scale", "weight", "weight", "weight"] and all(p.grad is not None for p in want), got
assert m.frozen.weight.grad is None and m.unused.weight.grad is None
for p in want:
    assert (p.grad.nbytes, p.grad.dtype, p.grad.device) == (p.nbytes, p.dtype, p.device), (p.grad.nbytes, p.grad.dtype)
assert m.blocks.mlp.weight.grad.dtype == "bfloat16"
before = torch.cuda.memory_allocated()
grads = [p.grad for p in want]
m(x)["logits"].backward()                          # accumulated into the same .grad: nothing new
assert [p.grad for p in want] == grads and torch.cuda.memory_allocated() == before
refs = [weakref.ref(g) for g in grads]
del grads
opt = torch.optim.SGD(m.parameters())
opt.zero_grad(set_to_none=False)                   # zeroed in place: kept
assert all(p.grad is not None for p in want)
opt.zero_grad()                                    # set_to_none: the memory goes back to the cache
assert all(p.grad is None for p in want)
assert all(r() is None for r in refs)              # the gradients are gone...
assert torch.cuda.memory_allocated() <= before - sum(p.nbytes for p in want)   # ...and their blocks free
with torch.no_grad():
    assert m(x)["logits"].grad_fn is None          # no graph under no_grad
assert m(x)["logits"].detach().grad_fn is None and m(x)["logits"].view().grad_fn is not None
print("ok")
