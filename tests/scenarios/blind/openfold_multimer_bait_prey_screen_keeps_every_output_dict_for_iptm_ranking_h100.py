"""screen_ppi.py -- a structural-biology lab screens one bait (a 412-residue E3 ligase substrate receptor) against
96 candidate interactors with OpenFold in AlphaFold-Multimer mode (model_1_multimer_v3 weights, 93M parameters,
float32; MSAs precomputed on the CPU nodes) on one H100 80GB.  Complex sizes: 412 + 118..986 residues.  The
script ranks the pairs by ipTM at the end and writes the top ten models as PDB files:

    results = []
    for prey in preys:
        batch = {k: torch.as_tensor(v, device="cuda") for k, v in featurize(bait, prey).items()}
        with torch.no_grad():
            out = model(batch)
        results.append({"name": prey.name, "batch": batch, "out": out})
        print(prey.name, n_res, out["iptm_score"].item())
    for r in sorted(results, key=lambda r: -r["out"]["iptm_score"].item())[:10]:
        write_pdb(protein.from_prediction(r["batch"], r["out"]), ...)

`out` is OpenFold's whole output dict, left on the GPU: the pair representation (N^2 x 128 float32), the MSA
representation (508 x N x 256), distogram, TM and aligned-confidence logits (3 x N^2 x 64), masked-MSA logits, the
structure module's trajectory...: ~1.9 GB for a 1,000-residue complex, plus 0.6 GB of feature batch, kept for
every pair screened.  One prediction needs only 1-4 GiB of transient memory at these sizes (inference, chunked
attention), so the first pairs run at a steady pace -- but `results` grows by 0.7-3.9 GB per pair, and at pair 35
(a 1,280-residue complex) the Evoformer's recycling has no room left: the forward fails with 76 GiB of the card
held by `results` (the ~1 GiB the cache still holds is in pieces between kept tensors).

An expert: the memory is the list of full output dicts the script keeps for its final ranking, not the model and
not the complex being predicted (it alone would fit ten times over).  Keep only what the ranking and the PDBs
need (ipTM / pTM as floats, final_atom_positions, atom mask, aatype, residue_index, plddt moved to the CPU) or
write each PDB right away and drop the dict; the big N^2 tensors were never needed.  Wrong advice: a smaller
batch (one complex per call already), cropping or chunking the complex (the one failing now would fit alone;
the list keeps growing), inference_mode (already no_grad: saves nothing here), bf16 / quantized weights (the
weights are 0.4 GB), empty_cache / expandable_segments (the tensors are live), a bigger GPU (the list outgrows
any card: 96 pairs are ~215 GB).
"""
import os
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code): Tensor.item, which the stand-in torch lacks (a float from a
# one-element tensor; the stand-in computes nothing, so the value is made up).
_ITEM_SRC = '''
def item(self):
    return 0.25 + (self.data_ptr() % 6151) / 10000.0


Tensor.item = item
'''
exec(compile(_ITEM_SRC, os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), "exec"),
     {"Tensor": torch.Tensor})
# ---- end of the supplement

# ------------------------------------------------------------------------------------------------------------
# the user's program
# ------------------------------------------------------------------------------------------------------------
C_M, C_Z, C_E, C_S = 256, 128, 64, 384
N_SEQ, N_EXTRA, N_RECYCLE = 508, 2048, 3
BLOCKS, EXTRA_BLOCKS = 48, 4
f32, i64 = 4, 8


def p(n_params):
    return torch.nn.Parameter(torch.empty(n_params * f32, device="cuda"), requires_grad=False)


class EvoformerBlock(torch.nn.Module):
    """MSA row/column attention, MSA transition, outer-product mean, triangle multiplications and attentions,
    pair transition.  Inference, chunked: each op makes a few temporaries the size of m or z and drops them."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = p(1_810_000)

    def forward(self, m, z, n):
        for _ in range(2):                                         # row attention, transition (chunked)
            tmp = torch.empty(N_SEQ * n * C_M * f32, device="cuda")
            del tmp
        opm = torch.empty(n * n * C_Z * f32, device="cuda")        # outer-product mean update
        tri_out = torch.empty(n * n * C_Z * f32, device="cuda")    # triangle multiplication: a, b, gate
        tri_in = torch.empty(n * n * C_Z * f32, device="cuda")
        gate = torch.empty(n * n * C_Z * f32, device="cuda")
        del tri_out, tri_in, gate, opm
        m_new = torch.empty(N_SEQ * n * C_M * f32, device="cuda")
        z_new = torch.empty(n * n * C_Z * f32, device="cuda")
        return m_new, z_new


class ExtraMSABlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = p(330_000)

    def forward(self, a, z, n):
        tmp = torch.empty(N_EXTRA * n * C_E * f32, device="cuda")
        del tmp
        return torch.empty(N_EXTRA * n * C_E * f32, device="cuda"), torch.empty(n * n * C_Z * f32, device="cuda")


class StructureModule(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = p(2_900_000)

    def forward(self, s, z, n):
        return {
            "frames": torch.empty(8 * n * 7 * f32, device="cuda"),
            "sidechain_frames": torch.empty(8 * n * 8 * 16 * f32, device="cuda"),
            "unnormalized_angles": torch.empty(8 * n * 7 * 2 * f32, device="cuda"),
            "angles": torch.empty(8 * n * 7 * 2 * f32, device="cuda"),
            "positions": torch.empty(8 * n * 14 * 3 * f32, device="cuda"),
            "states": torch.empty(8 * n * C_S * f32, device="cuda"),
            "single": torch.empty(n * C_S * f32, device="cuda"),
        }


class AlphaFold(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.input_embedder = torch.nn.Module()
        self.input_embedder.weight = p(1_200_000)
        self.recycling_embedder = torch.nn.Module()
        self.recycling_embedder.weight = p(60_000)
        for i in range(EXTRA_BLOCKS):
            setattr(self, "extra_msa_stack_%d" % i, ExtraMSABlock())
        for i in range(BLOCKS):
            setattr(self, "evoformer_%d" % i, EvoformerBlock())
        self.structure_module = StructureModule()
        self.aux_heads = torch.nn.Module()
        self.aux_heads.weight = p(1_400_000)

    def iteration(self, batch, n, prevs):
        m = torch.empty(N_SEQ * n * C_M * f32, device="cuda")
        z = torch.empty(n * n * C_Z * f32, device="cuda")
        a = torch.empty(N_EXTRA * n * C_E * f32, device="cuda")
        for i in range(EXTRA_BLOCKS):
            a, z = getattr(self, "extra_msa_stack_%d" % i)(a, z, n)
        del a
        for i in range(BLOCKS):
            m, z = getattr(self, "evoformer_%d" % i)(m, z, n)
        s = torch.empty(n * C_S * f32, device="cuda")
        sm = self.structure_module(s, z, n)
        return m, z, s, sm

    def forward(self, batch):
        n = batch["aatype"].nbytes // (i64 * (N_RECYCLE + 1))
        prevs = None
        for cycle in range(N_RECYCLE + 1):
            m, z, s, sm = self.iteration(batch, n, prevs)
            prevs = (m, z, s)
        out = {
            "msa": m, "pair": z, "single": s, "sm": sm,
            "final_atom_positions": torch.empty(n * 37 * 3 * f32, device="cuda"),
            "final_atom_mask": torch.empty(n * 37 * f32, device="cuda"),
            "distogram_logits": torch.empty(n * n * 64 * f32, device="cuda"),
            "masked_msa_logits": torch.empty(N_SEQ * n * 22 * f32, device="cuda"),
            "lddt_logits": torch.empty(n * 50 * f32, device="cuda"),
            "plddt": torch.empty(n * f32, device="cuda"),
            "experimentally_resolved_logits": torch.empty(n * 37 * f32, device="cuda"),
            "tm_logits": torch.empty(n * n * 64 * f32, device="cuda"),
            "aligned_confidence_probs": torch.empty(n * n * 64 * f32, device="cuda"),
            "predicted_aligned_error": torch.empty(n * n * f32, device="cuda"),
            "ptm_score": torch.empty(f32, device="cuda"),
            "iptm_score": torch.empty(f32, device="cuda"),
        }
        return out


class Prey(object):
    def __init__(self, name, length):
        self.name, self.length = name, length


def featurize(bait_len, prey):
    """The multimer feature pipeline on the CPU (MSA pairing, cropping off): numpy arrays with a trailing
    recycling dimension, as OpenFold's data pipeline returns them -- here their sizes in bytes."""
    n, r = bait_len + prey.length, N_RECYCLE + 1
    return {
        "aatype": n * i64 * r, "residue_index": n * i64 * r, "asym_id": n * i64 * r, "entity_id": n * i64 * r,
        "sym_id": n * i64 * r, "seq_mask": n * f32 * r, "target_feat": n * 22 * f32 * r,
        "msa": N_SEQ * n * i64 * r, "msa_mask": N_SEQ * n * f32 * r, "deletion_matrix": N_SEQ * n * f32 * r,
        "extra_msa": N_EXTRA * n * i64 * r, "extra_msa_mask": N_EXTRA * n * f32 * r,
        "extra_deletion_matrix": N_EXTRA * n * f32 * r, "bert_mask": N_SEQ * n * f32 * r,
        "true_msa": N_SEQ * n * i64 * r, "msa_feat": N_SEQ * n * 49 * f32 * r,
    }


def as_tensor(nbytes):
    """torch.as_tensor(numpy_array, device="cuda")."""
    return torch.empty(nbytes, device="cuda")


def main():
    rng = random.Random(20261222)
    bait_len = 412
    preys = [Prey("prey_%03d" % i, rng.randint(118, 986)) for i in range(96)]
    model = AlphaFold()
    model.eval()
    results = []
    for prey in preys:
        batch = {k: as_tensor(v) for k, v in featurize(bait_len, prey).items()}
        with torch.no_grad():
            out = model(batch)
        results.append({"name": prey.name, "batch": batch, "out": out})
        print("%s\t%d res\tiptm %.3f" % (prey.name, bait_len + prey.length, out["iptm_score"].item()), flush=True)
    ranked = sorted(results, key=lambda r: -r["out"]["iptm_score"].item())
    for r in ranked[:10]:
        print("write", r["name"])


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
