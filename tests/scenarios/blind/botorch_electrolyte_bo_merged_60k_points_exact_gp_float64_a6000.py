"""refit_surrogate.py -- a battery-materials group runs Bayesian optimisation of liquid-electrolyte
formulations (12 inputs: solvent fractions, salt molarity, additives, temperature) with BoTorch.  Every night
a job refits the surrogate on all measurements and proposes the next plate for the robot, on the group's
workstation GPU, an RTX A6000 (48 GB).  As BoTorch's documentation recommends, the script works in double
precision:

    torch.set_default_dtype(torch.float64)
    model = SingleTaskGP(train_X, train_Y)              # Matern/RBF ARD kernel, exact GP
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fit_gpytorch_mll(mll)

For two years the campaign grew to 9,000 points and the refit took minutes.  This week the data of a partner
lab's high-throughput screen (51,000 conductivity measurements on the same 12 inputs) was merged into the
table: 60,000 training points.  The first evaluation of the marginal likelihood fails: an exact GP builds
the 60,000 x 60,000 kernel matrix, 26.8 GiB in float64; RBFKernel makes it (in place: squared distances,
then div_ and exp_), ScaleKernel multiplies it by the outputscale -- a second n x n matrix -- and there is
no room for it on a 47.5 GiB card.  The backward pass would need one or two more of them.

An expert: the exact kernel matrix is the problem, O(n^2) memory.  Do not materialise it: KeOps kernels
(gpytorch.kernels.keops.RBFKernel, computed in tiles), or an approximate GP (SVGP / inducing points with a
few thousand inducing points, or a local trust-region GP on the points near the incumbent as TuRBO does),
or subsample the merged data.  float32 halves each matrix (13.4 GiB) but forward plus backward still need
three or four of them, over the card.  Wrong first advice: mixed precision (fp16/bf16 kernels break the
Cholesky/CG solves), a smaller batch, gradient checkpointing or flash attention (there is no batch and no
attention), inference_mode (the hyperparameters are being fitted, with gradients), expandable_segments /
empty_cache (the first matrix is live), a bigger GPU (an 80 GB card does not hold the forward and backward
either).
"""
import sys

import torch

import scen_truth

# torch.float64, which the simulator's torch lacks (as in PyTorch: torch.float64 is torch.double, 8 bytes)
torch.float64 = torch.double = "float64"
torch._ITEMSIZE["float64"] = 8

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---- the parts of GPyTorch / BoTorch the refit goes through (the simulator has neither), sizes only
class Kernel(torch.nn.Module):
    pass


class RBFKernel(Kernel):
    def __init__(self, ard_num_dims):
        torch.nn.Module.__init__(self)
        self.raw_lengthscale = torch.nn.Parameter(torch.empty(ard_num_dims, dtype=torch.get_default_dtype(),
                                                              device="cuda"))

    def covar_dist(self, x1_, x2_, square_dist=True):
        n1, n2 = x1_.rows, x2_.rows
        # x1_.matmul(x2_.transpose(-2, -1)) over the padded inputs: the n1 x n2 squared distances
        res = torch.empty(n1 * n2, dtype=torch.get_default_dtype(), device="cuda")
        res._saved = x1_
        return res

    def forward(self, x1, x2):
        lengthscale = self.raw_lengthscale
        x1_ = Inputs(x1.rows, x1.cols, lengthscale)          # x1.div(lengthscale)
        x2_ = Inputs(x2.rows, x2.cols, lengthscale)
        dist = self.covar_dist(x1_, x2_, square_dist=True)
        return dist                                          # postprocess_rbf: dist.div_(-2).exp_(), in place


class ScaleKernel(Kernel):
    def __init__(self, base_kernel):
        torch.nn.Module.__init__(self)
        self.base_kernel = base_kernel
        self.raw_outputscale = torch.nn.Parameter(torch.empty(1, dtype=torch.get_default_dtype(), device="cuda"))

    def forward(self, x1, x2):
        orig_output = self.base_kernel(x1, x2)
        outputscales = self.raw_outputscale
        scaled = torch.empty(orig_output.nbytes, device="cuda")   # orig_output.mul(outputscales): a new n x n
        scaled._dtype = orig_output.dtype
        scaled._saved = orig_output
        return torch.autograd._graph.derive(scaled, orig_output, outputscales)


class Inputs(object):
    """A (rows x cols) float64 tensor on the GPU, sized for the kernel code above."""

    def __init__(self, rows, cols, depends_on=None):
        self.rows, self.cols = rows, cols
        self.t = torch.empty(rows * cols, dtype=torch.get_default_dtype(), device="cuda")
        if depends_on is not None:
            torch.autograd._graph.derive(self.t, depends_on)


class GaussianLikelihood(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.raw_noise = torch.nn.Parameter(torch.empty(1, dtype=torch.get_default_dtype(), device="cuda"))


class MultivariateNormal(object):
    """The prior at the training inputs; its covariance is lazy (a LazyEvaluatedKernelTensor) until the
    marginal likelihood needs it."""

    def __init__(self, mean, kernel, x):
        self.mean, self.kernel, self.x = mean, kernel, x

    def evaluate_kernel(self):
        return self.kernel(self.x, self.x)

    def log_prob(self, y, noise):
        covar = self.evaluate_kernel()          # K_XX, then (K_XX + noise I) by CG / Lanczos
        out = torch.empty(8, device="cuda")
        out._saved = covar
        return torch.autograd._graph.derive(out, covar, noise)


class SingleTaskGP(torch.nn.Module):
    def __init__(self, train_X, train_Y):
        torch.nn.Module.__init__(self)
        self.train_inputs = (train_X,)
        self.train_targets = train_Y
        self.likelihood = GaussianLikelihood()
        self.mean_module = torch.nn.Parameter(torch.empty(1, dtype=torch.get_default_dtype(), device="cuda"))
        self.covar_module = ScaleKernel(RBFKernel(ard_num_dims=train_X.cols))

    def forward(self, x):
        return MultivariateNormal(self.mean_module, self.covar_module, x)

    def __call__(self, x):
        return self.forward(x)


class ExactMarginalLogLikelihood(torch.nn.Module):
    def __init__(self, likelihood, model):
        torch.nn.Module.__init__(self)
        self.likelihood, self.model = likelihood, model

    def forward(self, function_dist, target):
        return function_dist.log_prob(target, self.likelihood.raw_noise)


def fit_gpytorch_mll_scipy(mll, maxiter=200):
    """BoTorch's L-BFGS-B fit: scipy.optimize.minimize calls this closure for the loss and its gradient."""
    def closure():
        model = mll.model
        output = model(*model.train_inputs)
        loss = mll(output, model.train_targets)
        loss.backward()
        return loss
    for it in range(maxiter):
        closure()
    return mll


def fit_gpytorch_mll(mll):
    mll.train()
    return fit_gpytorch_mll_scipy(mll)


# ---- refit_surrogate.py
torch.set_default_dtype(torch.float64)
n_own, n_partner, d = 9_000, 51_000, 12
train_X = Inputs(n_own + n_partner, d)
train_Y = Inputs(n_own + n_partner, 1)
print("training points: %d (ours %d + partner screen %d), %d inputs, dtype %s"
      % (train_X.rows, n_own, n_partner, d, torch.get_default_dtype()))
try:
    model = SingleTaskGP(train_X, train_Y)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    fit_gpytorch_mll(mll)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
print("refit done")
sys.exit(0)
