"""train_node.py -- a battery-analytics team fits a latent neural ODE to cell-ageing data (capacity,
resistance and voltage-curve features per cycle, 2048 windows of cells from their cycling lab) to
forecast the knee point of capacity fade.  Dynamics: an MLP f(t, z) on a 32-d latent state (two
hidden layers of 512, tanh), solved with torchdiffeq on the analyst's RTX 3060 (12 GB, 11.8 GiB),
full batch (one iteration per epoch):

    from torchdiffeq import odeint
    z_t = odeint(func, z0, t_obs, rtol=1e-7, atol=1e-9, method="dopri5")
    loss = F.mse_loss(decoder(z_t), y)
    loss.backward()

odeint (not odeint_adjoint) backpropagates through the solver's own operations: every function
evaluation of every accepted step -- six per dopri5 step -- keeps its MLP activations for backward,
16.5 MiB each at 2048 windows.  Memory per iteration is proportional to
the number of function evaluations (NFE), and NFE is not fixed: as the model learns the sharp knee
of the fade curve its dynamics stiffen, the adaptive solver takes smaller steps, and NFE climbs from
~140 in the first epochs to several hundred.  No tensor outlives its iteration; backward frees
everything each time.  In epoch 48 one forward solve needs ~680 evaluations and fails near its
end, on one more 16.5 MiB activation, with 10.5 GiB of the card in that solve's saved activations
(PyTorch also caches 0.75 GiB in the 1.5 MiB tails of its 18 MiB segments: of no use to this
request, and worth two epochs of NFE growth at most).

An expert: the activation memory of backprop-through-the-solver grows with NFE, without bound;
the standard fix is the adjoint method (torchdiffeq.odeint_adjoint: memory constant in NFE,
gradients by solving the adjoint ODE backwards; or checkpointing the solve in segments of the time
grid), plus keeping NFE in check (looser rtol/atol -- 1e-7 is far tighter than the data's noise --
or kinetic-energy/Jacobian regularisation of the dynamics).  Wrong first advice: release_references
(nothing leaks: the memory is one iteration's graph), empty_cache or expandable_segments, a smaller
batch (buys time until NFE doubles again), mixed precision (fp16 with rtol=1e-7 breaks the step-size
control), inference_mode (this is training).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
WINDOWS, LATENT, HIDDEN, T_OBS = 2048, 32, 512, 200


# --- a stand-in for torchdiffeq.odeint (dopri5, adaptive step size), mirroring its call ------------------
def odeint(func, y0, t, rtol=1e-7, atol=1e-9, method="dopri5"):
    """torchdiffeq.odeint: integrates func from t[0] to t[-1] with Dormand-Prince 5(4), the step size
    adapted to the local error estimate; each step (accepted or not) evaluates func 6 times (FSAL).
    Autograd records every operation: the graph of the whole solve lives until backward."""
    t0, t1 = t[0], t[-1]
    h = (t1 - t0) / 20.0
    y = y0
    tt = t0
    stiff = func.stiffness()
    while tt < t1:
        h = min(h, t1 - tt)
        ks = []
        for stage in range(6):
            z = torch.empty(WINDOWS * LATENT, dtype=torch.float32, device="cuda")   # y + h * sum(a_ij k_j)
            z._saved = ks[-1] if ks else y
            k = func(tt, z)
            ks.append(k)
        err = (h * stiff) ** 5 * 1e-12 / rtol                                        # local error / tolerance
        if err <= 1.0:
            y_new = torch.empty(WINDOWS * LATENT, dtype=torch.float32, device="cuda")  # y + h * sum(b_i k_i)
            y_new._saved = ks[-1]
            y, tt = y_new, tt + h
        del ks
        h = h * min(5.0, max(0.2, 0.9 * max(err, 1e-12) ** -0.2))
    out = torch.empty(len(t) * WINDOWS * LATENT, dtype=torch.float32, device="cuda")
    out._saved = y
    return out
# ---------------------------------------------------------------------------------------------------------


class ODEFunc(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.l1 = torch.nn.Parameter(torch.empty((LATENT + 1) * HIDDEN, dtype=torch.float32, device="cuda"))
        self.l2 = torch.nn.Parameter(torch.empty((HIDDEN + 1) * HIDDEN, dtype=torch.float32, device="cuda"))
        self.l3 = torch.nn.Parameter(torch.empty((HIDDEN + 1) * LATENT, dtype=torch.float32, device="cuda"))
        self.nfe = 0
        self._solves = 0

    def stiffness(self):
        # (simulation) how stiff the learned dynamics are, as the solver's error estimate sees them: they
        # sharpen as training fits the knee of the fade curve
        self._solves += 1
        return 1.0 * 1.035 ** (self._solves - 1)

    def forward(self, t, z):
        self.nfe += 1
        # linear -> tanh -> linear -> tanh -> linear: what autograd keeps for backward
        acts = torch.empty(WINDOWS * (4 * HIDDEN + 2 * LATENT) * 4, dtype=torch.uint8, device="cuda")
        acts._saved = z
        dz = torch.empty(WINDOWS * LATENT, dtype=torch.float32, device="cuda")
        dz._saved = acts
        return dz


class Decoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w = torch.nn.Parameter(torch.empty(LATENT * 8, dtype=torch.float32, device="cuda"))

    def forward(self, zt):
        out = torch.empty(T_OBS * WINDOWS * 8, dtype=torch.float32, device="cuda")
        out._saved = zt
        return out


func = ODEFunc().cuda()
decoder = Decoder().cuda()
opt = torch.optim.AdamW(func.parameters() + decoder.parameters(), lr=3e-4)
t_obs = [float(i) for i in range(T_OBS)]
y = torch.empty(T_OBS * WINDOWS * 8, dtype=torch.float32, device="cuda")        # cycling features, on GPU
z0 = torch.empty(WINDOWS * LATENT, dtype=torch.float32, device="cuda")          # encoder output
try:
    for epoch in range(1, 101):
        func.nfe = 0
        z_t = odeint(func, z0, t_obs, rtol=1e-7, atol=1e-9, method="dopri5")
        pred = decoder(z_t)
        loss = torch.nn.functional.nll_loss(pred, y)                              # F.mse_loss
        peak = torch.cuda.memory_allocated()
        scen_truth.backward(loss)
        del loss, pred, z_t
        opt.step()
        opt.zero_grad(set_to_none=True)
        if epoch % 5 == 0 or epoch < 3:
            print("epoch %3d  nfe %4d  peak %.1f GiB" % (epoch, func.nfe, peak / GiB))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
