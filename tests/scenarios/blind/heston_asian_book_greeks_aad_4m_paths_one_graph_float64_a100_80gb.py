"""greeks_nightly.py -- a bank's equity-derivatives risk job prices a book of arithmetic-average
(Asian) options under the Heston model by Monte Carlo in PyTorch and takes the Greeks by adjoint
differentiation (pathwise AAD): the model's inputs are parameters, one simulation of all paths runs
with autograd on, price.backward() gives delta, vega and the Heston sensitivities at once.  float64
throughout, as the desk's validation requires.  One A100-SXM4-80GB of the risk cluster.

    class HestonMC(nn.Module):                     # the same module is calibrated to market quotes elsewhere
        def __init__(self, s0, v0, kappa, theta, xi, rho, r): ...nn.Parameter(torch.tensor(x, dtype=torch.float64))
        def forward(self, n_paths, n_steps, dt):
            S = self.s0.expand(n_paths); v = self.v0.expand(n_paths); avg = torch.zeros_like(S)
            for _ in range(n_steps):               # full-truncation Euler, daily steps
                z1 = torch.randn(n_paths, dtype=torch.float64, device="cuda")
                z2 = self.rho * z1 + torch.sqrt(1 - self.rho ** 2) * torch.randn_like(z1)
                vp = torch.clamp(v, min=0.0); sv = torch.sqrt(vp * dt)
                S = S * torch.exp((self.r - 0.5 * vp) * dt + sv * z1)
                v = v + self.kappa * (self.theta - vp) * dt + self.xi * sv * z2
                avg = avg + S / n_steps
            return avg
    model = HestonMC(**calibrated).cuda()
    avg = model(N_PATHS, 365, 1 / 365)
    price = sum(w * torch.exp(-r * T) * torch.relu(avg - k).mean() for k, w in book)
    price.backward()                                # model.s0.grad is delta, model.v0.grad vega, ...

With 1M paths the job peaked at 29 GiB.  For the new model-risk standard the desk asked for 4M paths
(the standard error of the book's gamma proxy halves).  Each daily step keeps ~10 path-sized float64
tensors for backward (the normals, the truncated variance, its square root, the exponent and its
exponential, S, v, the running average): 4M x 8 bytes x 10 = 305 MiB a step, ~109 GiB for a year.  The
forward pass fails at day ~253 with 75.8 GiB held by the graph (and 3.7 GiB cached in the 1.5 MiB tails
the allocator's 2 MiB rounding leaves behind each 30.5 MiB tensor); the backward never starts.

An expert: a Monte Carlo estimate is an average over independent paths, and so are its pathwise Greeks:
simulate the 4M paths in chunks (e.g. 8 x 500k), call backward on each chunk's share of the price and
let the gradients accumulate in the parameters' .grad (the estimate is identical, memory is that of one
chunk).  Checkpointing the time loop in blocks of steps is the other lever.  Not fragmentation: the
cached tails would buy a dozen more days of a year that needs 30 GiB more than the card.  Wrong: no_grad or
inference_mode (the gradients are the product: this is not inference though no optimizer runs),
bf16/fp16 autocast (useless for pricing, and float64 is required), empty_cache or expandable_segments
(every byte is referenced by the graph), quantization.
"""
import sys

import torch
from torch import nn

import scen_truth
from torch.autograd._graph import derive      # the stand-in's record of what an operation's output depends on

if not hasattr(torch, "float64"):            # the stand-in torch has no float64: 8 bytes, as PyTorch's
    torch.float64 = "float64"
    torch._ITEMSIZE["float64"] = 8

scen_truth.note_every_empty(torch)

N_PATHS = 4_000_000
N_STEPS = 365
DT = 1.0 / 365


def paths_op(n, *inputs, keep=True):
    """An elementwise float64 op over the paths: its output, in the graph of its inputs; autograd keeps
    what the op saved for backward (its inputs, or its output for exp/sqrt)."""
    t = torch.empty(n, dtype=torch.float64, device="cuda")
    if torch.is_grad_enabled() and keep:
        t._saved = tuple(inputs)
        derive(t, *inputs)
    return t


def backward(loss):
    """loss.backward() as PyTorch runs it: gradients made, then every tensor the graph saved is freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        s = t.__dict__.pop("_saved", None)
        if isinstance(s, (tuple, list)):
            todo.extend(x for x in s if isinstance(x, torch.Tensor))


def scalar(x):
    return nn.Parameter(torch.empty(1, dtype=torch.float64, device="cuda"))


class HestonMC(nn.Module):
    def __init__(self, s0, v0, kappa, theta, xi, rho, r):
        nn.Module.__init__(self)
        self.s0, self.v0, self.kappa, self.theta = scalar(s0), scalar(v0), scalar(kappa), scalar(theta)
        self.xi, self.rho, self.r = scalar(xi), scalar(rho), scalar(r)

    def forward(self, n_paths, n_steps, dt):
        S = paths_op(n_paths, self.s0)                                   # self.s0.expand(n_paths)
        v = paths_op(n_paths, self.v0)
        avg = paths_op(n_paths, keep=False)                              # torch.zeros_like(S)
        for day in range(n_steps):
            z1 = torch.empty(n_paths, dtype=torch.float64, device="cuda")   # torch.randn
            zi = torch.empty(n_paths, dtype=torch.float64, device="cuda")   # torch.randn_like(z1)
            z2 = paths_op(n_paths, z1, zi, self.rho)                     # rho * z1 + sqrt(1 - rho**2) * zi
            vp = paths_op(n_paths, v)                                    # torch.clamp(v, min=0.0)
            sv = paths_op(n_paths, vp)                                   # torch.sqrt(vp * dt)
            e = paths_op(n_paths, vp, sv, z1, self.r)                    # (r - 0.5 * vp) * dt + sv * z1
            e = paths_op(n_paths, e)                                     # torch.exp(...)
            S = paths_op(n_paths, S, e)                                  # S * exp(...)
            v = paths_op(n_paths, v, vp, sv, z2, self.kappa, self.theta, self.xi)
            avg = paths_op(n_paths, avg, S)                              # avg + S / n_steps
            del z1, zi, z2, vp, sv, e
            if day % 50 == 0:
                print("  day %3d  allocated %.1f GiB" % (day, torch.cuda.memory_allocated() / 2 ** 30))
                sys.stdout.flush()
        return avg


def book_price(avg, strikes):
    """sum(w * exp(-rT) * relu(avg - k).mean() for k, w in book): one scalar in the graph of avg."""
    payoff = paths_op(avg.nbytes // 8, avg)
    price = paths_op(1, payoff)
    del payoff
    return price


def main():
    calibrated = dict(s0=100.0, v0=0.04, kappa=1.8, theta=0.045, xi=0.55, rho=-0.7, r=0.035)
    model = HestonMC(**calibrated).cuda()
    strikes = [80 + 2.5 * i for i in range(17)]
    print("book: %d Asian options, %d paths x %d daily steps, float64" % (len(strikes), N_PATHS, N_STEPS))
    avg = model(N_PATHS, N_STEPS, DT)
    price = book_price(avg, strikes)
    backward(price)                                                      # price.backward()
    greeks = {name: p.grad for name, p in model.named_parameters()}
    print("greeks:", sorted(greeks))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
