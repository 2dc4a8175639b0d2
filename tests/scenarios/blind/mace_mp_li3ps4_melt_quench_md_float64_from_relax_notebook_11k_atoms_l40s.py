"""melt_quench.py -- a battery-materials group runs a melt-quench of the solid electrolyte Li3PS4 with the
MACE-MP-0 "medium" foundation potential (2 interactions, 128x0e+128x1o, r_max 6 A, 4.7M parameters) through its
ASE calculator, on one NVIDIA L40S (48 GB).  The calculator line is the one from the group's relaxation /
phonon notebook, where float64 is what the MACE docs recommend:

    calc = mace_mp(model="medium", dispersion=False, default_dtype="float64", device="cuda")
    atoms = read("beta-Li3PS4.cif") * (7, 7, 7)            # 10,976 atoms, 32 per cell
    atoms.calc = calc
    MaxwellBoltzmannDistribution(atoms, temperature_K=1200)
    dyn = Langevin(atoms, 2 * units.fs, temperature_K=1200, friction=0.01)
    dyn.run(50_000)

A 5 x 5 x 5 pilot (4,000 atoms, ~180k edges within 6 A) ran fine (~17 GiB for the forward). The production box has
~494k edges, and MACE's memory is per edge: spherical harmonics to l=3, the radial MLPs and per-edge tensor-product
weights, and the messages of the second interaction (128 channels x 55 irrep components per edge, 56 KB in float64)
-- all kept, because the forces are -dE/dpositions: the calculator runs the model with autograd ON (positions
require grad; the parameters do not) and calls torch.autograd.grad after the forward. Langevin's first force call
fails in the forward, in interaction 2's conv_tp: it asks for 25.9 GiB with 21.3 GiB already held by the edge
features, interaction 1 and interaction 2's per-edge weights, and 23.1 GiB free.

An expert: one input -- one periodic box, no batch -- decides the memory, and it is doubled by float64. First:
float32 for MD (MACE's own guidance: float64 for geometry optimisation and phonons, float32 for MD; halves every
per-edge tensor: ~24 GiB for this box's forward, room left for the force pass). Beyond that: split the box across
GPUs with domain decomposition (MACE in LAMMPS, one MPI rank per GPU), or a smaller cell. Wrong advice:
inference_mode / no_grad (the forces ARE a gradient: the calculator would fail or return no forces), a smaller
batch (there is one structure), bf16/fp16 autocast (equivariant tensor products in half precision ruin energy
conservation), empty_cache / expandable_segments (nothing is cached: one 25.9 GiB request, 23.1 GiB free),
quantization.
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code): torch.float64 (8 bytes an element) and torch.autograd.grad,
# which the stand-in torch lacks; grad makes the gradient of each input (the forces), as PyTorch's does at the
# end of its walk back, and frees what the graph saved.  Compiled as torch's own files.
_DTYPE_SRC = '''
float64 = "float64"
_ITEMSIZE["float64"] = 8
'''
_GRAD_SRC = '''
def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, allow_unused=False):
    result = tuple(torch.empty_like(x) for x in inputs)
    if not retain_graph:                     # what the graph saved is freed after the walk
        todo, seen = list(outputs), set()
        while todo:
            t = todo.pop()
            s = t.__dict__.get("_saved") if id(t) not in seen else None
            seen.add(id(t))
            if s is not None:
                t._saved = None
                todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))
    return result
'''
exec(compile(_DTYPE_SRC, torch.__file__, "exec"), torch.__dict__)
torch.autograd.__dict__["torch"] = torch
exec(compile(_GRAD_SRC, torch.autograd.__file__, "exec"), torch.autograd.__dict__)
# ---- end of the supplement

# ------------------------------------------------------------------------------------------------------------
# mace and ase as far as this run goes (their code, shaped as theirs; the stand-in computes nothing)
# ------------------------------------------------------------------------------------------------------------
NUM_ELEMENTS, CHANNELS, MAX_ELL_SH, NUM_BESSEL = 89, 128, 3, 8


def _op(n_elements, *inputs, dtype=None):
    """A tensor op of the model: n_elements of the default dtype, in its inputs' graph."""
    out = torch.empty(n_elements, dtype=dtype or torch.get_default_dtype(), device="cuda")
    out._saved = inputs[0] if len(inputs) == 1 else tuple(inputs)
    return torch._derive(out, *inputs)


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.get_default_dtype(), device="cuda"))


class FullyConnectedNet(torch.nn.Module):
    """e3nn's radial MLP: [8, 64, 64, 64, num_weights] with SiLU, one row per edge."""

    def __init__(self, hs):
        torch.nn.Module.__init__(self)
        self.hs = hs
        self.weight = _param(sum(a * b for a, b in zip(hs[:-1], hs[1:])))

    def forward(self, x, n_edges):
        h = x
        for width in self.hs[1:-1]:
            h = _op(n_edges * width, h)                    # linear
            h = _op(n_edges * width, h)                    # SiLU
        return _op(n_edges * self.hs[-1], h)


class InteractionBlock(torch.nn.Module):
    """RealAgnosticResidualInteractionBlock: per-edge tensor-product weights from the radial MLP, the
    uvu tensor product of node features with the edge spherical harmonics (the messages), scatter-sum."""

    def __init__(self, node_dims, tp_paths, msg_dims):
        torch.nn.Module.__init__(self)
        self.node_dims, self.tp_paths, self.msg_dims = node_dims, tp_paths, msg_dims
        self.linear_up = _param(CHANNELS * CHANNELS * 2)
        self.conv_tp_weights = FullyConnectedNet([NUM_BESSEL, 64, 64, 64, tp_paths * CHANNELS])
        self.linear = _param(CHANNELS * CHANNELS * 4)
        self.skip_tp = _param(NUM_ELEMENTS * CHANNELS * CHANNELS)

    def forward(self, node_feats, edge_attrs, edge_feats, n_nodes, n_edges):
        up = _op(n_nodes * self.node_dims, node_feats)                               # linear_up
        tp_weights = self.conv_tp_weights(edge_feats, n_edges)
        sender_feats = _op(n_edges * self.node_dims, up)                             # node_feats[sender]
        mji = _op(n_edges * CHANNELS * self.msg_dims, sender_feats, edge_attrs, tp_weights)   # conv_tp
        message = _op(n_nodes * CHANNELS * self.msg_dims, mji)                      # scatter_sum
        return _op(n_nodes * CHANNELS * 16, message)


class EquivariantProductBasisBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.symmetric_contractions = _param(NUM_ELEMENTS * 1_200 * 8)

    def forward(self, node_feats, n_nodes):
        return _op(n_nodes * CHANNELS * 4, node_feats)


class ScaleShiftMACE(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.node_embedding = _param(NUM_ELEMENTS * CHANNELS)
        self.interactions_0 = InteractionBlock(128, tp_paths=4, msg_dims=16)      # 128x0e x Y(0..3)
        self.interactions_1 = InteractionBlock(512, tp_paths=13, msg_dims=55)     # 128x0e+128x1o x Y(0..3), l <= 3
        self.products_0 = EquivariantProductBasisBlock()
        self.products_1 = EquivariantProductBasisBlock()
        self.readouts = _param(CHANNELS * 16 + 16)

    def forward(self, data, training=False, compute_force=True, compute_stress=False):
        positions = data["positions"]
        positions.requires_grad_(True)
        n_nodes, n_edges = data["n_nodes"], data["n_edges"]
        vectors = _op(n_edges * 3, positions, data["shifts"])                  # get_edge_vectors_and_lengths
        lengths = _op(n_edges, vectors)
        edge_attrs = _op(n_edges * (MAX_ELL_SH + 1) ** 2, vectors)             # spherical harmonics, l <= 3
        edge_feats = _op(n_edges * NUM_BESSEL, lengths)                        # Bessel basis x cutoff
        node_feats = _op(n_nodes * CHANNELS, data["node_attrs"])
        energies = []
        for i in range(2):
            inter = getattr(self, "interactions_%d" % i)
            node_feats = inter(node_feats, edge_attrs, edge_feats, n_nodes, n_edges)
            node_feats = getattr(self, "products_%d" % i)(node_feats, n_nodes)
            energies.append(_op(n_nodes, node_feats))
        energy = _op(1, *energies)
        forces = None
        if compute_force:
            forces = torch.autograd.grad([energy], [positions], retain_graph=training, create_graph=training)[0]
        return {"energy": energy, "forces": forces}


class MACECalculator(object):
    """mace.calculators.MACECalculator: loads the model onto the device, freezes it, sets the default dtype."""

    def __init__(self, model, device="cuda", default_dtype="float64"):
        torch.set_default_dtype(torch.float64 if default_dtype == "float64" else torch.float32)
        self.model = model()
        for param in self.model.parameters():
            param.requires_grad = False
        self.results = {}

    def calculate(self, atoms):
        batch = atoms.to_batch()
        out = self.model(batch, training=False, compute_stress=False)
        self.results = {"energy": out["energy"], "forces": out["forces"]}


def mace_mp(model="medium", dispersion=False, default_dtype="float32", device="cuda"):
    return MACECalculator(ScaleShiftMACE, device=device, default_dtype=default_dtype)


class Atoms(object):
    """ase.Atoms, with the matscipy neighbour list the calculator builds (on the CPU) at each call."""

    def __init__(self, n_atoms, neighbours_per_atom):
        self.n, self.k = n_atoms, neighbours_per_atom
        self.calc = None

    def __mul__(self, reps):
        a, b, c = reps
        return Atoms(self.n * a * b * c, self.k)

    def __len__(self):
        return self.n

    def to_batch(self):
        n, e = self.n, self.n * self.k
        return {"positions": torch.empty(n * 3, dtype=torch.get_default_dtype(), device="cuda"),
                "node_attrs": torch.empty(n * NUM_ELEMENTS, dtype=torch.get_default_dtype(), device="cuda"),
                "edge_index": torch.empty(2 * e * 8, device="cuda"),
                "shifts": torch.empty(e * 3, dtype=torch.get_default_dtype(), device="cuda"),
                "n_nodes": n, "n_edges": e}

    def get_forces(self):
        self.calc.calculate(self)
        return self.calc.results["forces"]


def MaxwellBoltzmannDistribution(atoms, temperature_K):
    pass                          # velocities, on the CPU


class Langevin(object):
    def __init__(self, atoms, timestep, temperature_K, friction):
        self.atoms = atoms

    def run(self, steps):
        forces = self.atoms.get_forces()
        for _ in range(steps):
            forces = self.atoms.get_forces()


def read(path):
    return Atoms(32, 45)          # beta-Li3PS4 conventional cell; ~45 neighbours within 6 A at 1.87 g/cm3


# ------------------------------------------------------------------------------------------------------------
# the user's program
# ------------------------------------------------------------------------------------------------------------
def main():
    calc = mace_mp(model="medium", dispersion=False, default_dtype="float64", device="cuda")
    atoms = read("beta-Li3PS4.cif") * (7, 7, 7)
    atoms.calc = calc
    print("atoms:", len(atoms), flush=True)
    MaxwellBoltzmannDistribution(atoms, temperature_K=1200)
    dyn = Langevin(atoms, 2.0, temperature_K=1200, friction=0.01)
    dyn.run(50_000)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
