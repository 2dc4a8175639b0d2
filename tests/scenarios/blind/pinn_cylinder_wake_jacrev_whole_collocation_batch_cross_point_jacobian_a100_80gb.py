"""train_pinn_ns.py -- a CFD group's physics-informed network for the 2-D wake behind a cylinder at Re=100
(the Raissi et al. benchmark: inputs (x, y, t), outputs (u, v, p), incompressible Navier-Stokes residuals as the
loss).  The network is a plain tanh MLP, 8 hidden layers of 256 (0.46M parameters, 1.8 MB), trained with Adam on
random batches of collocation points drawn from the 5000-snapshot domain.

The postdoc rewrote the residual with torch.func because nested torch.autograd.grad calls were "slow and ugly",
prototyping it in a notebook on 256 points:

    from torch.func import jacrev

    def ns_residual(net, xyt, nu=0.01):
        uvp = net(xyt)                                  # [N, 3]
        J = jacrev(net)(xyt)                            # [N, 3, N, 3] -- only the diagonal blocks are non-zero
        J = torch.einsum("iaib->iab", J)                # per point: d(u,v,p)/d(x,y,t), [N, 3, 3]
        H = jacrev(jacrev(net))(xyt) ...                # second derivatives for the viscous term
        ...
    for it in range(40_000):
        xyt = sample_collocation(N_COLLOC)              # N_COLLOC = 16_384, the paper's batch
        loss = ns_residual(net, xyt).square().mean() + data_loss(...)
        loss.backward(); opt.step(); opt.zero_grad()

In the notebook (N=256) a step took 40 ms and the residuals matched the autograd version, so the script went to
the cluster with the paper's batch of 16,384 points on an A100-SXM4-80GB.  It dies at iteration 0, on the
jacrev line: torch.OutOfMemoryError, "Tried to allocate 768.00 GiB", with the network holding 2 MB.

What happens: jacrev(net) differentiates the batched function [N,3] -> [N,3] as one function of all N*3 inputs.
It builds the standard basis of its N*3 = 49,152 outputs (a 49,152 x 49,152 float32 identity, 9.0 GiB, which
fits) and vmaps the vector-Jacobian product over it: every basis vector is back-propagated through the whole
batch, so the first cotangent of the last hidden layer is [49,152, 16,384, 256] float32 = 768 GiB, computed on
the autograd engine's thread.  Memory and work grow with N^2 x width, and everything off the diagonal blocks is
zeros: the points of a PINN batch are independent, so d u(x_i)/d x_j = 0 for i != j.  At N=256 the same thing
was 2.4 MB and 200 MB, which is why the notebook never showed it.

An expert: differentiate per point, not per batch.  `vmap(jacrev(net_single))(xyt)` with net_single taking one
point [3] -> [3] (and `vmap(hessian(net_single))` for the viscous term), or the classic
`torch.autograd.grad(uvp[:, k].sum(), xyt, create_graph=True)` per output component: O(N x width) memory per
derivative order, a few hundred MB here, and the same numbers as the notebook.
Wrong first advice: a smaller collocation batch (still quadratic: fewer points is a worse PINN, and 2,048 points
would still materialise 12 GiB of zeros per step), bf16/mixed precision (halves 768 GiB; PINN residuals of
second derivatives are not usable in bf16 anyway), gradient checkpointing (no stored activation is the
problem: 0.3 GB of them), jacrev(chunk_size=...) / splitting the operation (bounded memory, but 49,152
sequential backward passes per step: hours per iteration), a bigger GPU or several GPUs (no card holds 768 GiB,
and it is still N^2 work), expandable_segments / empty_cache (one request is ten times the card), inference_mode
(this is training, and the derivatives need autograd).
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.nn.Linear, torch.tanh, torch.func (jacrev/vjp/vmap) and torch.autograd.grad, the
# real APIs the program uses, compiled as part of torch's own files so that the failing frames are torch's and
# the program's line stays the program's.  The stand-in's tensors are bytes; the gaps carry a .shape for sizing.
_LINEAR = '''
import torch
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(out_features * in_features, dtype=torch.float32, device=device))
        self.bias = Parameter(torch.empty(out_features, dtype=torch.float32, device=device)) if bias else None

    def forward(self, input):
        rows = input.shape[0]
        out = torch.empty(rows * self.out_features, dtype=torch.float32, device=input.device)
        out.shape = (rows, self.out_features)
        out._saved = input
        out._layer = (rows, self.in_features, self.out_features)
        return torch._derive(out, input)


def tanh(input):
    out = torch.empty(input.nbytes // 4, dtype=torch.float32, device=input.device)
    out.shape = input.shape
    out._saved = input
    return torch._derive(out, input)
'''
_FUNC = '''
import _thread

import torch


def _numel(t):
    n = 1
    for s in t.shape:
        n *= int(s)
    return n


def _construct_standard_basis_for(tensors, tensor_numels):
    # the identity over all outputs, one row per output element (torch/_functorch/eager_transforms.py)
    total_numel = sum(tensor_numels)
    chunks = []
    for tensor, numel in zip(tensors, tensor_numels):
        chunk = torch.empty(total_numel * numel, dtype=torch.float32, device=tensor.device)   # new_zeros
        chunk.shape = (total_numel, numel)
        chunks.append(chunk)
    return tuple(chunks)


def _autograd_grad(outputs, inputs, grad_outputs=None, retain_graph=False, create_graph=True):
    return torch.autograd.grad(outputs, inputs, grad_outputs, retain_graph=retain_graph, create_graph=create_graph)


def vjp(func, *primals):
    with torch.enable_grad():
        output = func(*primals)

    def wrapper(cotangents, retain_graph=True, create_graph=None):
        return _autograd_grad((output,), primals, (cotangents,), retain_graph=retain_graph, create_graph=True)
    return output, wrapper


def vmap(func, in_dims=0, out_dims=0, randomness="error", chunk_size=None):
    def wrapped(*args):
        batch = args[0].shape[0]
        torch.autograd._vmap_level.append(batch)
        try:
            return func(*args)
        finally:
            torch.autograd._vmap_level.pop()
    return wrapped


def jacrev(func, argnums=0, *, has_aux=False, chunk_size=None, _preallocate_and_copy=False):
    def wrapper_fn(*args):
        output, vjp_fn = vjp(func, *args)
        flat_output = [output]
        flat_output_numels = tuple(_numel(out) for out in flat_output)
        basis = _construct_standard_basis_for(flat_output, flat_output_numels)
        results = vmap(vjp_fn)(basis[0])
        return results
    return wrapper_fn
'''
_GRAD = '''
import _thread

import torch


def _backward_on_engine_thread(plan, device, box, done):
    """The autograd engine's device thread: one cotangent per layer of the graph, last layer first, each as many
    times over as the vmap level batches it (two alive at a time, as the engine frees what it consumed)."""
    from torch.autograd import _engine
    _engine._tls.engine = True
    try:
        live = []
        for nbytes in plan:
            g = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
            live.append(g)
            del live[:-2]
        box["result"] = live[-1] if live else None
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()


def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    out = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
    batch = 1
    for b in _vmap_level:
        batch *= b
    plan = []
    t = out
    while t is not None and getattr(t, "_saved", None) is not None:
        layer = getattr(t, "_layer", None)
        if layer is not None:
            rows, fan_in, fan_out = layer
            plan.append(batch * rows * fan_in * 4)      # d(loss)/d(layer input), batched by vmap
        t = t._saved
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_backward_on_engine_thread, (plan, out.device, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]
    return (box.get("result"),)
'''


def _install_gaps():
    import os
    base = os.path.dirname(torch.__file__)
    ns = {}
    exec(compile(_LINEAR, os.path.join(base, "nn", "modules", "linear.py"), "exec"), ns)
    torch.nn.Linear = ns["Linear"]
    torch.tanh = ns["tanh"]
    torch._derive = getattr(torch, "_derive")

    class enable_grad(object):
        def __enter__(self):
            self._prev = torch.is_grad_enabled()
            torch._grad.enabled = True

        def __exit__(self, *exc):
            torch._grad.enabled = self._prev
            return False
    if not hasattr(torch, "enable_grad"):
        torch.enable_grad = enable_grad
    ns = {}
    exec(compile(_GRAD, os.path.join(base, "autograd", "__init__.py"), "exec"), ns)
    torch.autograd._vmap_level = []
    ns["_vmap_level"] = torch.autograd._vmap_level
    torch.autograd.grad = ns["grad"]
    ns = {}
    exec(compile(_FUNC, os.path.join(base, "_functorch", "eager_transforms.py"), "exec"), ns)
    func = types.ModuleType("torch.func")
    for name in ("jacrev", "vjp", "vmap"):
        setattr(func, name, ns[name])
    torch.func = func
    sys.modules["torch.func"] = func


_install_gaps()
# ----

from torch.func import jacrev  # noqa: E402

N_COLLOC = 16_384          # collocation points per step (the paper's batch)
HIDDEN = [256] * 8
NU = 0.01                  # 1/Re
ITERS = 40_000


class PINN(torch.nn.Module):
    def __init__(self, layers):
        torch.nn.Module.__init__(self)
        self.n_layers = len(layers) - 1
        for i in range(self.n_layers):
            setattr(self, "fc%d" % i, torch.nn.Linear(layers[i], layers[i + 1], device="cuda"))

    def forward(self, xyt):
        h = xyt
        for i in range(self.n_layers):
            h = getattr(self, "fc%d" % i)(h)
            if i < self.n_layers - 1:
                h = torch.tanh(h)
        return h


def sample_collocation(n):
    """n random (x, y, t) points in [1, 8] x [-2, 2] x [0, 20], drawn on the GPU."""
    xyt = torch.empty(n * 3, dtype=torch.float32, device="cuda")
    xyt.shape = (n, 3)
    return xyt


def ns_residual(net, xyt, nu=NU):
    uvp = net(xyt)                                  # [N, 3]
    J = jacrev(net)(xyt)                            # [N, 3, N, 3] -- only the diagonal blocks are non-zero
    J = torch.einsum("iaib->iab", J)                # per point: d(u,v,p)/d(x,y,t), [N, 3, 3]
    H = jacrev(jacrev(net))(xyt)                    # second derivatives for the viscous term
    H = torch.einsum("iaibjc->iabc", H)
    u, v = uvp[:, 0], uvp[:, 1]
    u_t, v_t = J[:, 0, 2], J[:, 1, 2]
    f_u = u_t + u * J[:, 0, 0] + v * J[:, 0, 1] + J[:, 2, 0] - nu * (H[:, 0, 0, 0] + H[:, 0, 1, 1])
    f_v = v_t + u * J[:, 1, 0] + v * J[:, 1, 1] + J[:, 2, 1] - nu * (H[:, 1, 0, 0] + H[:, 1, 1, 1])
    return torch.stack([f_u, f_v], dim=1)


def main():
    net = PINN([3] + HIDDEN + [3])
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, weight_decay=0.0)
    n_params = sum(p.nbytes for p in net.parameters()) // 4
    print("PINN: %d hidden layers of %d, %.2fM parameters; %d collocation points per step"
          % (len(HIDDEN), HIDDEN[0], n_params / 1e6, N_COLLOC))
    for it in range(ITERS):
        xyt = sample_collocation(N_COLLOC)
        res = ns_residual(net, xyt)
        loss = res.square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
