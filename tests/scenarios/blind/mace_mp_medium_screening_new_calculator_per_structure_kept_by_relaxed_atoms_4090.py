"""screen_li_conductors.py -- a materials group screens 2,143 Li-containing candidates from the Materials Project
for solid electrolytes: relax each one (positions and cell) with the MACE-MP-0 foundation potential, then
compute its energy above the hull.  The workstation has an RTX 4090 (24 GB).  mace-torch 0.3.x, ASE 3.23:

    from ase.io import read, write
    from ase.optimize import FIRE
    from ase.filters import FrechetCellFilter
    from mace.calculators import mace_mp

    candidates = read("li_candidates.extxyz", index=":")        # 8 to 448 atoms per cell
    relaxed = []
    for i, atoms in enumerate(candidates):
        atoms.calc = mace_mp(model="medium", dispersion=False, default_dtype="float64", device="cuda")
        opt = FIRE(FrechetCellFilter(atoms), logfile=None)
        opt.run(fmax=0.02, steps=300)
        relaxed.append(atoms)                                     # written to relaxed.extxyz at the end
        print(i, atoms.info["mp_id"], atoms.get_potential_energy() / len(atoms))
    write("relaxed.extxyz", relaxed)

float64 because the MACE docs recommend it for geometry optimisation.  The structures relax at a few seconds
each; at structure 630, a 448-atom disordered rock-salt supercell, the first force call fails with
torch.OutOfMemoryError: "Tried to allocate 105.47 MiB ... 22.00 MiB is free", on a 24 GB card.  78 cells of
448 atoms earlier in the list had relaxed fine.  The user's first thought: "the big supercells are too big for
the GPU: skip cells over 400 atoms or use a smaller cutoff".

What holds the card: mace_mp() is not a handle on a shared model: every call builds a new MACECalculator, which
torch.load()s the checkpoint onto the GPU and converts it to float64 (MACE-MP-0 medium, about 4.7M parameters:
37.5 MB in float64).  `atoms.calc = ...` hangs that calculator on the Atoms object, and `relaxed.append(atoms)`
keeps every Atoms object, so every calculator and its model copy stays alive: 629 frozen copies of the same
network, 23.6 GB, growing by 37.5 MB per structure until the card is full.  The largest relaxation needs about
0.5 GB.

An expert: build the calculator once, before the loop, and reuse it for every structure (`calc = mace_mp(...)`
outside; `atoms.calc = calc` inside); or, at the least, do not keep the calculator with the result
(`atoms.calc = None` or keep `atoms.copy()` / the energies only) so each one is freed.  Memory is then flat at
one model plus one relaxation.
Wrong first advice: skipping or cutting large cells, a smaller batch or a smaller cutoff (the structure is not
the problem: 448-atom cells relaxed earlier), float32 (halves the leak, still dies, and float64 is wanted for
the relaxations), torch.inference_mode / no_grad around the calculator (MACE's forces are the autograd
gradient of the energy with respect to the positions: it breaks the force call), empty_cache or
expandable_segments (the models are referenced, nothing is cached or fragmented), gradient checkpointing, a
bigger GPU (a 48 GB card dies at structure ~1,270 of 2,143), restarting the script from where it stopped (the
leak comes back).
"""
import json
import os
import sys
import sysconfig
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: ASE (Atoms, read, FIRE, FrechetCellFilter) and mace-torch (mace_mp, MACECalculator,
# ScaleShiftMACE), the parts the script reaches, compiled under their packages' paths in site-packages so that
# tracebacks read as the real ones do.  Sizes: MACE-MP-0 "medium" (128 channels, L=1, 2 interactions, 89
# elements), about 4.69M parameters.  The stand-in's tensors are sized in bytes; MACE's forward is reduced to the
# tensors that dominate its memory (node features and per-edge messages, float64, and their gradients for the
# forces), which are freed when the force call returns, as in MACE.
SITE = sysconfig.get_paths()["purelib"]

_ASE = '''
import itertools


class Atoms(object):
    """ase.Atoms: positions, cell, numbers on the host; `calc` is whatever calculator was attached."""

    def __init__(self, n_atoms, n_edges, mp_id):
        self.n_atoms, self.n_edges = n_atoms, n_edges
        self.info = {"mp_id": mp_id}
        self.calc = None

    def __len__(self):
        return self.n_atoms

    def get_potential_energy(self):
        return self.calc.get_property("energy", self)

    def get_forces(self):
        return self.calc.get_property("forces", self)


def read(filename, index=":"):
    return list(_CANDIDATES)


class FrechetCellFilter(object):
    def __init__(self, atoms, hydrostatic_strain=False, scalar_pressure=0.0):
        self.atoms = atoms

    def get_forces(self):
        self.atoms.get_forces()
        return self.atoms.calc.get_property("stress", self.atoms)


class FIRE(object):
    def __init__(self, atoms, logfile="-", trajectory=None, maxstep=None, dt=0.1):
        self.optimizable = atoms
        self.nsteps = 0

    def run(self, fmax=0.05, steps=100000000):
        # the stand-in stops after two force calls: every later call reuses the blocks the first ones cached
        for self.nsteps in range(min(steps, 2)):
            self.optimizable.get_forces()
        return True
'''

_MACE = '''
import os

import torch
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

_MODEL_URLS = {"medium": "https://github.com/ACEsuit/mace-mp/releases/download/mace_mp_0/2023-12-03-mace-128-L1_epoch-199.model"}


class ScaleShiftMACE(Module):
    """The network torch.load() unpickles: its parameters as loaded (float32, on map_location)."""

    def __init__(self, state):
        Module.__init__(self)
        for name, t in state.items():
            if name.startswith("buffer:"):
                self.register_buffer(name[7:].replace(".", "_"), t)
            else:
                setattr(self, name.replace(".", "_"), Parameter(t))

    def double(self):
        """Module.double(): every floating-point parameter and buffer re-made in float64 (new tensors; the
        float32 ones are freed)."""
        for name, p in list(self._parameters.items()):
            self._parameters[name] = Parameter(torch.empty(p.nbytes // 4, dtype=torch.float64, device="cuda"),
                                               p.requires_grad)
        for name, b in list(self._buffers.items()):
            self._buffers[name] = torch.empty(b.nbytes // 4, dtype=torch.float64, device="cuda")
        return self

    def forward(self, data, compute_force=True, compute_stress=False, training=False):
        n, e = data["n_atoms"], data["n_edges"]
        node_feats = torch.empty(n * 128 * 4, dtype=torch.float64, device="cuda")        # 128x0e+128x1o
        saved = [node_feats]
        for interaction in range(2):
            edge_attrs = torch.empty(e * 4, dtype=torch.float64, device="cuda")           # spherical harmonics
            tp_weights = torch.empty(e * 128 * 3, dtype=torch.float64, device="cuda")     # radial MLP out
            messages = torch.empty(e * 128 * 4, dtype=torch.float64, device="cuda")       # conv_tp per edge
            saved += [edge_attrs, tp_weights, messages]
            saved.append(torch.empty(n * 128 * 4, dtype=torch.float64, device="cuda"))    # product basis
        energy = torch.empty(1, dtype=torch.float64, device="cuda")
        if compute_force:
            # forces = -dE/dpositions: autograd.grad through the same graph, one cotangent per saved tensor
            for t in reversed(saved):
                g = torch.empty(t.nbytes // 8, dtype=torch.float64, device="cuda")
                del g
        return {"energy": energy}


class MACECalculator(object):
    implemented_properties = ["energy", "free_energy", "forces", "stress"]

    def __init__(self, model_paths, device, energy_units_to_eV=1.0, length_units_to_A=1.0,
                 default_dtype="", model_type="MACE", **kwargs):
        self.results = {}
        self.device = device
        self.models = [_load(model_path, device) for model_path in model_paths]
        for model in self.models:
            model.to(device)
        if default_dtype == "float64":
            self.models = [model.double() for model in self.models]
        for model in self.models:
            for param in model.parameters():
                param.requires_grad = False

    def get_property(self, name, atoms):
        if name not in self.results:
            self.calculate(atoms)
        return self.results.get(name, 0.0)

    def calculate(self, atoms=None, properties=None, system_changes=None):
        batch = {"n_atoms": atoms.n_atoms, "n_edges": atoms.n_edges}
        for model in self.models:
            out = model(batch, compute_force=True, compute_stress=True, training=False)
        self.results = {"energy": -4.2 * atoms.n_atoms, "forces": 0.0, "stress": 0.0}


def _load(path, map_location):
    # torch.load(f=model_path, map_location=device) of a pickled ScaleShiftMACE
    state = torch.load(path, map_location=map_location)
    return ScaleShiftMACE(state)


def mace_mp(model=None, device="", default_dtype="float32", dispersion=False, **kwargs):
    cached_model_path = os.path.join(_CACHE_DIR, os.path.basename(_MODEL_URLS[model or "medium"]))
    print("Using Materials Project MACE for MACECalculator with %s" % cached_model_path)
    print("Using float64 for MACECalculator, which is slower but more accurate. Recommended for geometry optimization."
          if default_dtype == "float64" else "Using float32 for MACECalculator")
    return MACECalculator(model_paths=[cached_model_path], device=device, default_dtype=default_dtype, **kwargs)
'''


def _cached_checkpoint():
    """The downloaded checkpoint (~/.cache/mace/...), as the stand-in torch.load reads it: {name: bytes} of the
    float32 tensors.  About 4.69M parameters (18.8 MB in float32) plus the small buffers."""
    d = os.path.join(tempfile.gettempdir(), "mace-cache-%d" % os.getpid())
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "2023-12-03-mace-128-L1_epoch-199.model")
    params = {
        "products.symmetric_contractions.weights": 3_160_064,
        "interactions.conv_tp_weights_and_linear": 1_409_024,
        "node_embedding_and_readouts.weight": 118_784,
        "buffer:atomic_energies_fn.atomic_energies": 89,
    }
    with open(path, "w") as f:
        json.dump(dict((k, n * 4) for k, n in params.items()), f)
    return d


def _install_gaps():
    import types
    cache_dir = _cached_checkpoint()
    ase = types.ModuleType("ase")
    ns = {"_CANDIDATES": CANDIDATES}
    exec(compile(_ASE, os.path.join(SITE, "ase", "optimize", "fire.py"), "exec"), ns)
    for mod, names in (("ase", ["Atoms"]), ("ase.io", ["read"]), ("ase.optimize", ["FIRE"]),
                       ("ase.filters", ["FrechetCellFilter"])):
        m = ase if mod == "ase" else types.ModuleType(mod)
        for n in names:
            setattr(m, n, ns[n])
        m.write = lambda *a, **k: None
        sys.modules[mod] = m
    ns = {"_CACHE_DIR": cache_dir}
    exec(compile(_MACE, os.path.join(SITE, "mace", "calculators", "mace.py"), "exec"), ns)
    for mod in ("mace", "mace.calculators"):
        m = types.ModuleType(mod)
        m.mace_mp = ns["mace_mp"]
        m.MACECalculator = ns["MACECalculator"]
        sys.modules[mod] = m


def _candidate_list():
    """The 2,143 candidates in Materials Project id order: (atoms, edges within the 6 A cutoff, id).  Cell sizes
    cycle through the list's mix: mostly 8-96 atoms, one in eight a 448-atom supercell."""
    sizes = [(8, 420), (24, 1_300), (48, 2_700), (96, 5_600), (16, 880), (64, 3_600), (448, 27_000), (32, 1_800)]
    out = []
    for i in range(2143):
        n, e = sizes[i % len(sizes)]
        out.append((n, e, "mp-%d" % (1_000 + 37 * i)))
    return out


CANDIDATES = []
# ----


def main():
    global CANDIDATES
    from_list = _candidate_list()
    _install_gaps()
    from ase import Atoms
    for n, e, mp_id in from_list:
        CANDIDATES.append(Atoms(n, e, mp_id))
    sys.modules["ase.io"].read.__globals__["_CANDIDATES"] = CANDIDATES

    from ase.io import read, write
    from ase.optimize import FIRE
    from ase.filters import FrechetCellFilter
    from mace.calculators import mace_mp

    candidates = read("li_candidates.extxyz", index=":")        # 8 to 448 atoms per cell
    relaxed = []
    for i, atoms in enumerate(candidates):
        atoms.calc = mace_mp(model="medium", dispersion=False, default_dtype="float64", device="cuda")
        opt = FIRE(FrechetCellFilter(atoms), logfile=None)
        opt.run(fmax=0.02, steps=300)
        relaxed.append(atoms)                                     # written to relaxed.extxyz at the end
        print(i, atoms.info["mp_id"], atoms.get_potential_energy() / len(atoms))
    write("relaxed.extxyz", relaxed)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
