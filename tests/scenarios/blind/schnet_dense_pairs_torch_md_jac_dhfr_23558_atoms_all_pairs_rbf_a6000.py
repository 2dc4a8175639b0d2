"""md_dhfr.py -- a PhD student's torch-native molecular dynamics driver (velocity Verlet in the style of
TorchMD) with a SchNet potential they wrote themselves for their group's MD17 / small-water-box work.

The real code (PyTorch 2.x, one RTX A6000 48 GB in a workstation):

    class SchNet(nn.Module):                       # 6 interactions, 128 features, 50 Gaussians, 5 A cutoff
        def forward(self, numbers, pos, cell):
            x = self.embedding(numbers)                                        # (N, 128)
            diff = pos[:, None, :] - pos[None, :, :]                           # (N, N, 3)  all pairs
            diff = diff - cell * torch.round(diff / cell)                      # minimum image (periodic box)
            dist = diff.norm(dim=-1)                                           # (N, N)
            f = self.rbf(dist)       # torch.exp(coeff * (dist[..., None] - offsets) ** 2)   (N, N, 50)
            for block in self.interactions:
                x = x + block(x, f, dist)     # filter net on (N, N, 128), cosine cutoff, x[None] * W, sum(1)
            return self.head(x).sum()

    def energy_and_forces(model, pos, system):
        pos = pos.detach().requires_grad_(True)
        energy = model(system.numbers, pos, system.cell)
        (grad,) = torch.autograd.grad(energy, pos)                            # forces = -dE/dx
        return energy.detach(), grad

    model = SchNet().cuda().eval(); model.load_state_dict(torch.load("schnet_water_md17.pt"))
    check_single_point(model, load_system("water_216"))                       # 648 atoms: OK
    run_nve(model, load_system("water_216"), n_steps=3)                       # OK
    run_nve(model, load_system("jac_dhfr"), n_steps=50_000)                   # 23,558 atoms: OOM at step 0

The model was written for MD17 molecules (9-21 atoms) and a 216-water box (648 atoms), where building
every atom pair densely is harmless: 648^2 = 419,904 pairs, the 50 Gaussians are 80 MiB and each
interaction keeps four (pairs x 128) float32 tensors for the force backward (205 MiB each, ~4.8 GiB for
six interactions).  The student then points the same script at the solvated DHFR benchmark box (JAC,
23,558 atoms, 62.2 A cubic box).  Pairs: 23,558^2 = 554,979,364.  The minimum-image difference vectors
are 6.2 GiB (their round/shift temporaries another 2 x 6.2 GiB transiently), the distance matrix 2.07 GiB;
the next line, the Gaussian expansion of all pairs, asks for 554,979,364 x 50 x 4 B = 110,995,872,800 B
= 103.4 GiB at once.  The card has 48 GiB; PyTorch holds 8.3 GiB (differences + distances) and about
36 GiB are free.  torch.cuda.OutOfMemoryError
("Tried to allocate 103.37 GiB") at the first force evaluation, step 0, in GaussianSmearing.forward.
Had that one tensor fitted, each of the six interactions would want four (N^2 x 128) float32 tensors of
264 GiB each: the memory is quadratic in the atom count and no card exists for it.

What an expert says first: the model has a 5 A cutoff, so almost every one of the 555M pairs is
multiplied by zero.  Build a neighbour list (torch_cluster.radius_graph / a cell list, or
matscipy/vesin/ASE neighbour lists with PBC) and run the filter network on the edges within the cutoff
only: water density ~0.1 atoms/A^3 gives ~52 neighbours per atom, ~1.2M edges, 240 MB for the Gaussians
and ~0.6 GB per edge-feature tensor -- the whole force call fits in a few GB.  (Processing the pairs in
atom blocks that keep only within-cutoff pairs is the same fix by hand.)

What would be wrong: torch.no_grad() / inference_mode() -- the forces are the autograd gradient of the
energy with respect to the positions, so the MD cannot run without autograd (and the failing tensor is
made before anything is saved for backward).  A bigger card (even 141 GB: the next tensors are 264 GiB
each), fp16/bf16 (halves 103 GiB, still does not fit, and ruins energy conservation), "smaller batch"
(this is one structure), gradient checkpointing, empty_cache / expandable_segments (nothing is cached,
the request is twice the card), and shrinking the simulated system (the 23,558-atom box is the study).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
CUTOFF = 5.0            # Angstrom, cosine cutoff of the filters
N_GAUSSIANS = 50
N_FEATURES = 128
N_INTERACTIONS = 6
DT_FS = 0.5
F32 = torch.float32


class System(object):
    """What load_system() returns: atomic numbers, positions (A), masses and the periodic cubic box."""

    def __init__(self, name, n_atoms, box):
        self.name, self.n_atoms, self.box = name, n_atoms, box
        # real script: openmm.app.PDBFile(f"{name}.pdb") -> tensors on the GPU
        self.numbers = torch.empty(n_atoms, dtype=torch.int8, device=DEVICE)      # int64 in the real one
        self.positions = torch.empty(n_atoms * 3, dtype=F32, device=DEVICE)
        self.velocities = torch.empty(n_atoms * 3, dtype=F32, device=DEVICE)
        self.inv_masses = torch.empty(n_atoms, dtype=F32, device=DEVICE)
        self.cell = torch.empty(3, dtype=F32, device=DEVICE)


SYSTEMS = {
    "water_216": (648, 18.64),          # 216 TIP3P waters, the box the potential was validated on
    "jac_dhfr": (23558, 62.23),         # JAC benchmark: DHFR in 7,023 waters
}


def load_system(name):
    n, box = SYSTEMS[name]
    return System(name, n, box)


class Dense(nn.Module):
    """schnetpack's Dense: nn.Linear, optionally followed by shifted softplus."""

    def __init__(self, n_in, n_out, activation=False, bias=True):
        super().__init__()
        self.n_in, self.n_out, self.activation = n_in, n_out, activation
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=F32, device=DEVICE))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=F32, device=DEVICE)) if bias else None

    def forward(self, x, rows):
        y = torch.empty(rows * self.n_out, dtype=F32, device=x.device)        # x @ W.T + b
        y._saved = x
        if self.activation:
            a = torch.empty(rows * self.n_out, dtype=F32, device=x.device)    # softplus(y) - log(2)
            a._saved = y
            y = a
        return y


class GaussianSmearing(nn.Module):
    def __init__(self, start=0.0, stop=CUTOFF, n_gaussians=N_GAUSSIANS):
        super().__init__()
        self.n_gaussians = n_gaussians
        self.register_buffer("offsets", torch.empty(n_gaussians, dtype=F32, device=DEVICE))

    def forward(self, dist, n_pairs):
        # torch.exp(self.coeff * (dist[..., None] - self.offsets) ** 2)        (N, N, n_gaussians)
        f = torch.empty(n_pairs * self.n_gaussians, dtype=F32, device=dist.device)
        f._saved = dist
        return f


class CFConv(nn.Module):
    """Continuous-filter convolution over every pair of atoms (dense, as written for MD17)."""

    def __init__(self):
        super().__init__()
        self.in2f = Dense(N_FEATURES, N_FEATURES, bias=False)
        self.filter_net1 = Dense(N_GAUSSIANS, N_FEATURES, activation=True)
        self.filter_net2 = Dense(N_FEATURES, N_FEATURES)
        self.f2out = Dense(N_FEATURES, N_FEATURES, activation=True)

    def forward(self, x, f_ij, cutoff_ij, n_atoms):
        n_pairs = n_atoms * n_atoms
        h = self.in2f(x, n_atoms)
        w = self.filter_net2(self.filter_net1(f_ij, n_pairs), n_pairs)          # (N, N, 128)
        w_cut = torch.empty(n_pairs * N_FEATURES, dtype=F32, device=x.device)   # w * cutoff_ij[..., None]
        w_cut._saved = (w, cutoff_ij)
        y = torch.empty(n_pairs * N_FEATURES, dtype=F32, device=x.device)       # h[None, :, :] * w_cut
        y._saved = (h, w_cut)
        agg = torch.empty(n_atoms * N_FEATURES, dtype=F32, device=x.device)     # y.sum(dim=1)
        agg._saved = y
        return self.f2out(agg, n_atoms)


class Interaction(nn.Module):
    def __init__(self):
        super().__init__()
        self.cfconv = CFConv()
        self.dense = Dense(N_FEATURES, N_FEATURES)

    def forward(self, x, f_ij, cutoff_ij, n_atoms):
        v = self.cfconv(x, f_ij, cutoff_ij, n_atoms)
        return self.dense(v, n_atoms)


class SchNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding_weight = nn.Parameter(torch.empty(100 * N_FEATURES, dtype=F32, device=DEVICE))
        self.rbf = GaussianSmearing()
        self.interactions = []
        for i in range(N_INTERACTIONS):
            block = Interaction()
            setattr(self, "interaction_%d" % i, block)       # nn.ModuleList in the real one
            self.interactions.append(block)
        self.head1 = Dense(N_FEATURES, N_FEATURES // 2, activation=True)
        self.head2 = Dense(N_FEATURES // 2, 1)

    def pair_distances(self, pos, cell, n_atoms):
        n_pairs = n_atoms * n_atoms
        diff = torch.empty(n_pairs * 3, dtype=F32, device=pos.device)          # pos[:, None] - pos[None, :]
        diff._saved = pos
        scaled = torch.empty(n_pairs * 3, dtype=F32, device=pos.device)        # diff / cell
        rounded = torch.empty(n_pairs * 3, dtype=F32, device=pos.device)       # torch.round(...)
        del scaled
        shift = torch.empty(n_pairs * 3, dtype=F32, device=pos.device)         # cell * rounded
        del rounded
        diff_mic = torch.empty(n_pairs * 3, dtype=F32, device=pos.device)      # diff - shift (saves nothing)
        del shift, diff
        dist = torch.empty(n_pairs, dtype=F32, device=pos.device)              # diff_mic.norm(dim=-1)
        dist._saved = diff_mic
        return dist

    def forward(self, numbers, pos, cell, n_atoms):
        n_pairs = n_atoms * n_atoms
        x = torch.empty(n_atoms * N_FEATURES, dtype=F32, device=pos.device)    # self.embedding(numbers)
        x._saved = self.embedding_weight
        dist = self.pair_distances(pos, cell, n_atoms)
        f_ij = self.rbf(dist, n_pairs)
        cutoff_ij = torch.empty(n_pairs, dtype=F32, device=pos.device)         # 0.5 * (cos(pi d / rc) + 1) * (d < rc)
        cutoff_ij._saved = dist
        for block in self.interactions:
            v = block(x, f_ij, cutoff_ij, n_atoms)
            x_new = torch.empty(n_atoms * N_FEATURES, dtype=F32, device=pos.device)   # x + v
            x_new._saved = (x, v)
            x = x_new
        e_i = self.head2(self.head1(x, n_atoms), n_atoms)
        energy = torch.empty(1, dtype=F32, device=pos.device)                 # e_i.sum()
        energy._saved = e_i
        return energy


def energy_and_forces(model, pos, system):
    pos = pos.detach().requires_grad_(True)
    energy = model(system.numbers, pos, system.cell, system.n_atoms)
    # (grad,) = torch.autograd.grad(energy, pos): the gradient of the positions only
    energy.backward(inputs=[pos])
    return energy.detach(), pos.grad


def check_single_point(model, system):
    energy, grad = energy_and_forces(model, system.positions, system)
    print("single point %s (%d atoms): energy and forces OK" % (system.name, system.n_atoms))


def run_nve(model, system, n_steps, log_every=100):
    pos, vel = system.positions, system.velocities
    energy, grad = energy_and_forces(model, pos, system)
    for step in range(n_steps):
        # vel.sub_(0.5 * DT_FS * grad * inv_masses[:, None]); pos.add_(DT_FS * vel); pos.remainder_(box)
        energy, grad = energy_and_forces(model, pos, system)
        # vel.sub_(0.5 * DT_FS * grad * inv_masses[:, None])
        if step % log_every == 0:
            print("%s step %d: E_pot %s" % (system.name, step, "(logged)"))
    return pos, vel


def main():
    model = SchNet()
    # model.load_state_dict(torch.load("schnet_water_md17.pt", map_location="cuda"))
    model.eval()

    water = load_system("water_216")
    check_single_point(model, water)
    run_nve(model, water, n_steps=3)
    del water

    dhfr = load_system("jac_dhfr")
    print("production: %s, %d atoms, box %.2f A" % (dhfr.name, dhfr.n_atoms, dhfr.box))
    run_nve(model, dhfr, n_steps=50000, log_every=1000)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
