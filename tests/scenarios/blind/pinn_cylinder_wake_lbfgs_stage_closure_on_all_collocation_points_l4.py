"""pinn_wake.py -- a CFD postdoc's physics-informed network for the 2D wake behind a cylinder at Re=100
(inputs x, y, t -> outputs u, v, p; an 8 x 256 tanh MLP, 0.46M parameters, float32) on one NVIDIA L4 (24 GB)
of the group's cloud VM.  The loss is the Navier-Stokes residual at collocation points (first and second
derivatives of u, v, p by torch.autograd.grad with create_graph=True), plus inflow/wall/outflow boundary points
and 5,000 sparse velocity observations.  The recipe every PINN paper uses: Adam first, then L-BFGS to polish:

    adam = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for it in range(20000):                         # stage 1: 8,192 collocation points resampled per iteration
        loss = pinn_loss(model, sample_collocation(8192)); loss.backward(); adam.step()
    lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=50000, history_size=50,
                              tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")
    def closure():                                  # stage 2: L-BFGS wants a deterministic full-batch loss ...
        lbfgs.zero_grad(); loss = pinn_loss(model, X_f_all); loss.backward(); return loss
    lbfgs.step(closure)                             # ... so the closure uses all 140,000 collocation points

Stage 1 runs for hours at ~3 GiB: the derivative graphs cost ~330 KB per collocation point (the forward's 16 KB,
three first-derivative graphs, four second-derivative graphs over those, all kept for the final backward).
Stage 2's first closure, inside lbfgs.step(), builds the same graphs for 140,000 points at once: the forward, the
three first-derivative graphs and u_xx fit, the next second derivative does not -- it fails in torch.autograd.grad
for u_yy with 21.7 GiB of the card's 22.5 allocated, long before loss.backward().  L-BFGS's own state is tiny
(50 pairs of 1.8 MB flat vectors: 180 MB at most) and nothing is cached or leaking.

An expert: this is the L-BFGS stage's full batch, not the optimizer.  Keep the exact full-batch loss and gradient
but build them in pieces: inside the closure, loop over chunks of ~10k collocation points and call backward on
each chunk's (weighted) loss, accumulating the gradients, returning the summed loss detached -- L-BFGS sees the
same function; or use a fixed subset of ~20-30k collocation points for the L-BFGS stage (common PINN practice).
Wrong advice: an 8-bit / paged optimizer, ZeRO, CPU-offloading optimizer state, LoRA (the optimizers hold a few
MB now, 0.2 GiB at most); inference_mode (the closure must build graphs: the loss needs gradients of gradients);
mixed precision (bf16/fp16 second derivatives and a strong-Wolfe line search at tolerance 1e-9 do not mix);
empty_cache / expandable_segments (36 MiB is cached: the graphs are live).
"""
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code): torch.enable_grad, torch.tanh, Tensor slicing and arithmetic,
# torch.autograd.grad (with create_graph) and torch.optim.LBFGS, which the stand-in torch lacks, each making the
# tensors PyTorch's would (sizes in bytes; a gradient made with create_graph=True stays in the new graph with what
# its own backward saves, ~1.5x the activation it is the gradient of).  autograd.grad runs on an engine thread as
# PyTorch's does for CUDA tensors.  Compiled as torch's own files so the failing frames are the framework's.
_TORCH_DIR = os.path.dirname(torch.__file__)
_GRAD_MODE_SRC = '''
class enable_grad(object):
    def __enter__(self):
        self._prev = torch.is_grad_enabled()
        torch._grad.enabled = True

    def __exit__(self, *exc):
        torch._grad.enabled = self._prev
        return False

    def __call__(self, func):
        def decorate_enable_grad(*args, **kwargs):
            with self:
                return func(*args, **kwargs)
        return decorate_enable_grad


def tanh(input):
    out = torch.empty(input.nbytes, device=input.device)
    out._saved = input
    return torch._derive(out, input)
'''
_TENSOR_SRC = '''
def _binary(self, other):
    both = isinstance(other, Tensor)
    out = torch.empty(max(self.nbytes, other.nbytes if both else 0, 512), device=self.device)
    out._saved = (self, other) if both else self
    return torch._derive(out, self, *([other] if both else []))


def _getitem(self, idx):
    return self.view()


Tensor.__add__ = Tensor.__radd__ = Tensor.__sub__ = Tensor.__rsub__ = Tensor.__mul__ = Tensor.__rmul__ = _binary
Tensor.__truediv__ = Tensor.__pow__ = _binary
Tensor.__getitem__ = _getitem
_plain_backward = Tensor.backward


def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward, then what PyTorch does with the graph (retain_graph False): what it saved is freed."""
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    for t in _graph_of(self):
        t._saved = None


def _graph_of(root):
    """The tensors of root's graph that saved something (root first, then back towards the leaves)."""
    out, todo, seen = [], [root], set()
    while todo:
        t = todo.pop(0)
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if t._base is not None:
            todo.append(t._base)
        if s is None:
            continue
        out.append(t)
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))
    return out


Tensor.backward = backward
'''
_GRAD_SRC = '''
def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    """The gradient of outputs with respect to inputs: the engine walks outputs' graph back to inputs, making the
    gradient of each activation it passes; with create_graph=True those gradients form a new graph and stay."""
    outs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    ins = inputs if isinstance(inputs, (tuple, list)) else (inputs,)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_engine.run_grad, (outs, ins, create_graph, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]
    return box["result"]
'''
_ENGINE_SRC = '''
def run_grad(outs, ins, create_graph, box, done):
    _tls.engine = True
    try:
        made = []
        for root in outs:
            for t in torch.Tensor._graph_of(root):
                if t.nbytes <= 4096:
                    continue
                g = torch.empty(t.nbytes * 3 // 2 if create_graph else t.nbytes, device=t.device)
                if create_graph:
                    g._saved = t
                    made.append(g)
                else:
                    del g
        result = []
        for x in ins:
            g = torch.empty(x.nbytes, device=x.device)
            if create_graph:
                g._saved = tuple(made) + tuple(outs)
                g._params = tuple(p for o in outs for p in getattr(o, "_params", ()))
            result.append(g)
        box["result"] = tuple(result)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
'''
_LBFGS_SRC = '''
class LBFGS(Optimizer):
    """torch.optim.LBFGS: a flat copy of the gradient, the search direction and up to history_size (s, y) pairs of
    flat vectors; step() evaluates the closure (with autograd on) once, then once per iteration/line-search trial."""

    def __init__(self, params, lr=1, max_iter=20, max_eval=None, tolerance_grad=1e-7, tolerance_change=1e-9,
                 history_size=100, line_search_fn=None):
        Optimizer.__init__(self, params, dict(lr=lr, max_iter=max_iter, max_eval=max_eval or max_iter * 5 // 4,
                                              tolerance_grad=tolerance_grad, tolerance_change=tolerance_change,
                                              history_size=history_size, line_search_fn=line_search_fn))
        self._params = self.param_groups[0]["params"]

    def _gather_flat_grad(self):
        p = self._params[0]
        return torch.empty(sum(q.nbytes for q in self._params), device=p.device)

    def step(self, closure):
        with torch.no_grad():
            closure = torch.enable_grad()(closure)
            group = self.param_groups[0]
            state = self.state.setdefault(self._params[0], {"func_evals": 0, "n_iter": 0})
            loss = closure()
            state["func_evals"] += 1
            flat_grad = self._gather_flat_grad()
            old_dirs, old_stps = state.setdefault("old_dirs", []), state.setdefault("old_stps", [])
            for n_iter in range(group["max_iter"]):
                state["n_iter"] += 1
                d = self._gather_flat_grad()
                loss = closure()
                new_grad = self._gather_flat_grad()
                if len(old_dirs) == group["history_size"]:
                    old_dirs.pop(0)
                    old_stps.pop(0)
                old_dirs.append(new_grad)
                old_stps.append(d)
                flat_grad = new_grad
        for hook in list(_global_optimizer_post_hooks.values()):
            hook(self, (closure,), {})
        return loss
'''
exec(compile(_GRAD_MODE_SRC, os.path.join(_TORCH_DIR, "autograd", "grad_mode.py"), "exec"), torch.__dict__)
exec(compile(_TENSOR_SRC, os.path.join(_TORCH_DIR, "_tensor.py"), "exec"), {"torch": torch, "Tensor": torch.Tensor})
torch.Tensor._graph_of = staticmethod(torch.Tensor.backward.__globals__["_graph_of"])
import _thread  # noqa: E402
from torch.autograd import _engine  # noqa: E402
_engine.__dict__.update(torch=torch)
exec(compile(_ENGINE_SRC, _engine.__file__, "exec"), _engine.__dict__)
torch.autograd.__dict__.update(_thread=_thread, _engine=_engine)
exec(compile(_GRAD_SRC, torch.autograd.__file__, "exec"), torch.autograd.__dict__)
import torch.optim.optimizer as _optimizer_mod  # noqa: E402
_lbfgs_ns = {"torch": torch, "Optimizer": torch.optim.Optimizer,
             "_global_optimizer_post_hooks": _optimizer_mod._global_optimizer_post_hooks}
exec(compile(_LBFGS_SRC, os.path.join(_TORCH_DIR, "optim", "lbfgs.py"), "exec"), _lbfgs_ns)
torch.optim.LBFGS = _lbfgs_ns["LBFGS"]
# ---- end of the supplement


def as_tensor(n_points, dims, requires_grad=False):
    """torch.tensor(numpy_array, dtype=torch.float32, device=device, requires_grad=...): an n x dims array."""
    t = torch.empty(n_points * dims * 4, device="cuda")
    return t.requires_grad_(requires_grad)


# ------------------------------------------------------------------------------------------------------------
# the user's program
# ------------------------------------------------------------------------------------------------------------
LAYERS = [3] + [256] * 8 + [3]
N_F = 140_000                  # collocation points: 700 per snapshot x 200 snapshots, Latin hypercube
N_BATCH = 8192
RE = 100.0


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(n_out * 4, device="cuda"))
        self.n_in, self.n_out = n_in, n_out

    def forward(self, x):
        out = torch.empty(x.nbytes // self.n_in * self.n_out, device=x.device)
        out._saved = x
        return out


class PINN(torch.nn.Module):
    def __init__(self, layers):
        torch.nn.Module.__init__(self)
        self.depth = len(layers) - 1
        for i in range(self.depth):
            setattr(self, "fc%d" % i, Linear(layers[i], layers[i + 1]))

    def forward(self, xyt):
        h = xyt
        for i in range(self.depth - 1):
            h = torch.tanh(getattr(self, "fc%d" % i)(h))
        return getattr(self, "fc%d" % (self.depth - 1))(h)


def gradients(y, x):
    return torch.autograd.grad(y, x, grad_outputs=None, create_graph=True)[0]


def pinn_loss(model, xyt, bc, data):
    uvp = model(xyt)
    u, v, p = uvp[:, 0:1], uvp[:, 1:2], uvp[:, 2:3]
    du, dv, dp = gradients(u, xyt), gradients(v, xyt), gradients(p, xyt)
    u_x, u_y, u_t = du[:, 0:1], du[:, 1:2], du[:, 2:3]
    v_x, v_y, v_t = dv[:, 0:1], dv[:, 1:2], dv[:, 2:3]
    p_x, p_y = dp[:, 0:1], dp[:, 1:2]
    u_xx = gradients(u_x, xyt)[:, 0:1]
    u_yy = gradients(u_y, xyt)[:, 1:2]
    v_xx = gradients(v_x, xyt)[:, 0:1]
    v_yy = gradients(v_y, xyt)[:, 1:2]
    f_u = u_t + (u * u_x + v * u_y) + p_x - (u_xx + u_yy) / RE
    f_v = v_t + (u * v_x + v * v_y) + p_y - (v_xx + v_yy) / RE
    cont = u_x + v_y
    loss_pde = (f_u * f_u) + (f_v * f_v) + (cont * cont)
    uvp_b = model(bc)
    uvp_d = model(data)
    return loss_pde + (uvp_b * uvp_b) + 10.0 * (uvp_d * uvp_d)


def main():
    model = PINN(LAYERS)
    model.train()
    X_bc = as_tensor(12_000, 3)                           # inflow, walls, outflow, cylinder surface
    X_data = as_tensor(5_000, 3)                          # PIV-like velocity observations
    X_f_all = as_tensor(N_F, 3, requires_grad=True)

    adam = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    for it in range(3):                                   # 20,000 iterations in the real run
        X_f = as_tensor(N_BATCH, 3, requires_grad=True)   # resampled each iteration
        adam.zero_grad(set_to_none=True)
        loss = pinn_loss(model, X_f, X_bc, X_data)
        loss.backward()
        adam.step()
    print("adam stage done, peak %.2f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))

    lbfgs = torch.optim.LBFGS(model.parameters(), lr=1.0, max_iter=50000, history_size=50,
                              tolerance_grad=1e-9, tolerance_change=1e-12, line_search_fn="strong_wolfe")

    def closure():
        lbfgs.zero_grad()
        loss = pinn_loss(model, X_f_all, X_bc, X_data)
        loss.backward()
        return loss

    lbfgs.step(closure)
    torch.save(model.state_dict(), "pinn_wake_lbfgs.pt")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
