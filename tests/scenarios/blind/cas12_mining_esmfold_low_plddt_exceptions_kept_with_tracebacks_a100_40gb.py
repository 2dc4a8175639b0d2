"""fold_candidates.py -- a CRISPR-discovery postdoc folds the Cas12-like candidates mined from metagenome
assemblies (HMM hits, 950-1,400 residues) with ESMFold (facebookresearch/esm, `esm.pretrained.esmfold_v1()`)
on one A100-SXM4-40GB, to keep the confident structures for a Foldseek search against known effectors:

    model = esm.pretrained.esmfold_v1().eval().cuda()
    model.esm = model.esm.half()                # the ESM-2 3B stem in fp16 (the README's advice): ~8 GB resident
    model.set_chunk_size(64)                    # for the long candidates

    class LowConfidenceFold(Exception):         # carries what the summary table needs
        def __init__(self, rid, length, plddt, ptm): ...

    def fold(rec):
        output = model.infer(rec.seq, num_recycles=4)          # @torch.no_grad() inside
        plddt = output["mean_plddt"].item()
        if plddt < 70:
            raise LowConfidenceFold(rec.id, len(rec.seq), plddt, output["ptm"].item())
        ... write model.output_to_pdb(output)[0] ...

    for rec in records:
        try:
            kept.append((rec.id, fold(rec)))
        except LowConfidenceFold as err:
            failed.append(err)          # for the end-of-run table: err.rid, err.length, err.plddt, err.ptm

Each kept exception keeps its __traceback__, the traceback keeps fold()'s frame, and the frame keeps its
locals: `output`, the whole ESMFold output dict on the GPU -- the pair representation s_z [L, L, 128] fp32,
distogram, pTM and aligned-confidence logits [L, L, 64] each, the PAE -- about 1.3 KB x L^2, 1.2-2.5 GB
for these lengths.  Roughly half the candidates fold below pLDDT 70, so every other record leaves ~1.7 GB
behind.  A previous attempt died the same way; the postdoc saw nvidia-smi creep and turned on
`torch.cuda.memory._record_memory_history()` with a snapshot dump on OOM (host memory only, it costs the
GPU nothing).  This run dies at the 27th candidate (1,230 residues), in a folding-trunk block's chunked
triangular attention (a 1.44 GiB request): 13 low-confidence outputs hold 23.9 GiB beside the 8 GiB of
weights.  The candidate itself folds in a fresh process (~4.3 GiB over the weights).  At the failure
PyTorch also has ~4 GiB cached in holes between the kept outputs (lengths vary, so the freed pair
temporaries of one record rarely fit the next): a side effect of the growth -- expandable_segments would
let one more candidate through, not the run.

An expert: memory grows a step per low-confidence record and is held by Python objects -- the exceptions
kept in `failed`, through their tracebacks and fold()'s frame.  Keep only what the table needs (rid,
length, plddt, ptm as floats, or `str(err)`), or drop the traceback (`err.with_traceback(None)` /
`traceback.clear_frames(err.__traceback__)`), and `del output` before raising.  Wrong first advice:
a smaller chunk size / splitting the trunk (it would let this candidate through and die a few records
later), shorter sequences, a smaller batch (it is 1), inference_mode (infer() already runs under
no_grad), quantization or a bigger GPU, empty_cache / expandable_segments (the held memory is live).
"""
import os
import pickle
import random
import shutil
import sys
import tempfile

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks, as PyTorch has it -------------------------------------------------
# Tensor.item(): the stand-in computes nothing, so a scalar output carries the value the model gives it.
if not hasattr(torch.Tensor, "item"):
    torch.Tensor.item = lambda self: float(getattr(self, "_value", 0.0))
# torch.cuda.memory._dump_snapshot (PyTorch >= 2.1): pickles _snapshot() to a file.
if not hasattr(torch.cuda.memory, "_dump_snapshot"):
    def _dump_snapshot(filename="dump_snapshot.pickle"):
        with open(filename, "wb") as f:
            pickle.dump(torch.cuda.memory._snapshot(), f)
    torch.cuda.memory._dump_snapshot = _dump_snapshot
# torch.no_grad() as a decorator (PyTorch's is a _DecoratorContextManager).
if "__call__" not in vars(torch.no_grad):
    def _no_grad_call(self, func):
        def decorate_context(*args, **kwargs):
            with torch.no_grad():
                return func(*args, **kwargs)
        return decorate_context
    torch.no_grad.__call__ = _no_grad_call

# --- esm (facebookresearch/esm 2.0.0), as far as this job touches it: esm.pretrained.esmfold_v1 ---------
f16, f32 = torch.float16, torch.float32


class ESM2Layer(torch.nn.Module):
    """One of the 36 layers of ESM-2 3B (d 2560, 40 heads, ffn 10240), fp16 after model.esm.half()."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(78_740_000, dtype=f16, device="cuda"))

    def forward(self, x, L):
        attn = torch.empty(40 * L * L, dtype=f16, device="cuda")
        ffn = torch.empty(L * 10240, dtype=f16, device="cuda")
        out = torch.empty(L * 2560, dtype=f16, device="cuda")
        del attn, ffn
        return out


class ESM2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(33 * 2560, dtype=f16, device="cuda"))
        for i in range(36):
            setattr(self, "layer_%d" % i, ESM2Layer())

    def forward(self, L):
        x = torch.empty(L * 2560, dtype=f16, device="cuda")
        states = [x]                          # ESMFold keeps every layer's representation (esm_s)
        for i in range(36):
            x = getattr(self, "layer_%d" % i)(x, L)
            states.append(x)
        esm_s = torch.empty(37 * L * 2560, dtype=f16, device="cuda")   # torch.stack(states, dim=2)
        del states, x
        return esm_s


class TriangularSelfAttentionBlock(torch.nn.Module):
    """A folding-trunk block: sequence track (1024) and pair track (128).  With set_chunk_size(64) the
    triangular attention runs in chunks; the triangular multiplicative updates and the pair transition
    still make whole [L, L, 128] fp32 temporaries."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(14_350_000, dtype=f32, device="cuda"))
        self.chunk_size = None

    def forward(self, s_s, s_z, L):
        tri_out = torch.empty(L * L * 128, dtype=f32, device="cuda")      # tri_mul_out
        tri_in = torch.empty(L * L * 128, dtype=f32, device="cuda")       # tri_mul_in
        attn = torch.empty(self.chunk_size * L * L * 4 if self.chunk_size else L * L * L * 4,
                           dtype=f32, device="cuda")                       # tri_att_start/end, one chunk
        del attn
        trans = torch.empty(L * L * 128, dtype=f32, device="cuda")        # pair transition
        new_z = torch.empty(L * L * 128, dtype=f32, device="cuda")
        new_s = torch.empty(L * 1024, dtype=f32, device="cuda")
        del tri_out, tri_in, trans
        return new_s, new_z


class FoldingTrunk(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(48):
            setattr(self, "block_%d" % i, TriangularSelfAttentionBlock())
        self.structure_module = torch.nn.Parameter(torch.empty(22_000_000, dtype=f32, device="cuda"))

    def set_chunk_size(self, chunk_size):
        for i in range(48):
            getattr(self, "block_%d" % i).chunk_size = chunk_size

    def forward(self, s_s_0, s_z_0, L, no_recycles):
        s_s, s_z = s_s_0, s_z_0
        for _ in range(no_recycles + 1):
            for i in range(48):
                s_s, s_z = getattr(self, "block_%d" % i)(s_s, s_z, L)
        states = torch.empty(8 * L * 384, dtype=f32, device="cuda")
        positions = torch.empty(8 * L * 14 * 3, dtype=f32, device="cuda")
        frames = torch.empty(8 * L * 7, dtype=f32, device="cuda")
        return {"s_s": s_s, "s_z": s_z, "states": states, "positions": positions, "frames": frames}


def _scalar(value):
    t = torch.empty(4, dtype=f32, device="cuda")
    t._value = value
    return t


class ESMFold(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.esm = ESM2()
        self.esm_s_combine = torch.nn.Parameter(torch.empty(37, dtype=f32, device="cuda"))
        self.esm_s_mlp = torch.nn.Parameter(torch.empty(2560 * 1024 + 1024 * 1024, dtype=f32, device="cuda"))
        self.trunk = FoldingTrunk()
        self.distogram_head = torch.nn.Parameter(torch.empty(128 * 64, dtype=f32, device="cuda"))
        self.ptm_head = torch.nn.Parameter(torch.empty(128 * 64, dtype=f32, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(1024 * 23, dtype=f32, device="cuda"))
        self.lddt_head = torch.nn.Parameter(torch.empty(8_600_000, dtype=f32, device="cuda"))

    def set_chunk_size(self, chunk_size):
        self.trunk.set_chunk_size(chunk_size)

    def forward(self, aa, num_recycles=None):
        L = aa["length"]
        esm_s = self.esm(L)
        s_s_0 = torch.empty(L * 1024, dtype=f32, device="cuda")
        s_z_0 = torch.empty(L * L * 128, dtype=f32, device="cuda")
        del esm_s
        structure = self.trunk(s_s_0, s_z_0, L, num_recycles if num_recycles is not None else 4)
        del s_s_0, s_z_0
        s_z = structure["s_z"]
        structure["distogram_logits"] = torch.empty(L * L * 64, dtype=f32, device="cuda")
        structure["lm_logits"] = torch.empty(L * 23, dtype=f32, device="cuda")
        structure["lddt_head"] = torch.empty(8 * L * 37 * 50, dtype=f32, device="cuda")
        structure["plddt"] = torch.empty(L * 37, dtype=f32, device="cuda")
        structure["ptm_logits"] = torch.empty(L * L * 64, dtype=f32, device="cuda")
        structure["aligned_confidence_probs"] = torch.empty(L * L * 64, dtype=f32, device="cuda")
        structure["predicted_aligned_error"] = torch.empty(L * L, dtype=f32, device="cuda")
        structure["ptm"] = _scalar(aa["ptm"])
        structure["s_z"] = s_z
        return structure

    @torch.no_grad()
    def infer(self, sequences, num_recycles=None):
        seq = sequences if isinstance(sequences, str) else sequences[0]
        aa = {"length": len(seq), "plddt": _FOLDS[seq][0], "ptm": _FOLDS[seq][1]}
        output = self.forward(aa, num_recycles=num_recycles)
        output["atom37_atom_exists"] = torch.empty(len(seq) * 37, dtype=f32, device="cuda")
        output["mean_plddt"] = _scalar(aa["plddt"])
        return output

    def output_to_pdb(self, output):
        n = output["positions"].nbytes // (8 * 14 * 3 * 4)
        return ["HEADER    ESMFOLD PREDICTION\n" + "ATOM\n" * n + "END\n"]


def esmfold_v1():
    return ESMFold()


# what the fold "computes" for each sequence: (mean pLDDT, pTM) -- the stand-in cannot fold anything
_FOLDS = {}


def read_candidates():
    """candidates_cas12_hmm_hits.faa: 64 HMM hits, 950-1,400 aa, from soil and hot-spring assemblies."""
    rng = random.Random(20261222)
    recs = []
    for i in range(64):
        length = rng.randrange(950, 1400)
        seq = "M" + "".join(rng.choice("ACDEFGHIKLMNPQRSTVWY") for _ in range(length - 1))
        plddt = rng.gauss(68.0, 9.0)
        _FOLDS[seq] = (plddt, max(0.2, min(0.95, plddt / 100 + rng.gauss(0.0, 0.05))))
        recs.append(type("SeqRecord", (), {"id": "HSc_%04d_k141_%d" % (i + 1, rng.randrange(10 ** 5, 10 ** 6)),
                                           "seq": seq})())
    return recs


# --- the postdoc's script ----------------------------------------------------------------------------
PLDDT_MIN = 70.0
out_dir = tempfile.mkdtemp(prefix="esmfold_cas12_")


class LowConfidenceFold(Exception):
    def __init__(self, rid, length, plddt, ptm):
        Exception.__init__(self, "%s (%d aa): mean pLDDT %.1f, pTM %.2f" % (rid, length, plddt, ptm))
        self.rid, self.length, self.plddt, self.ptm = rid, length, plddt, ptm


def fold(rec):
    output = model.infer(rec.seq, num_recycles=4)
    plddt = output["mean_plddt"].item()
    if plddt < PLDDT_MIN:
        raise LowConfidenceFold(rec.id, len(rec.seq), plddt, output["ptm"].item())
    pdb = model.output_to_pdb(output)[0]
    with open(os.path.join(out_dir, rec.id + ".pdb"), "w") as fh:
        fh.write(pdb)
    return plddt


torch.cuda.memory._record_memory_history(max_entries=100_000)   # added after the last run died
records = read_candidates()
kept, failed = [], []
try:
    model = esmfold_v1().eval().cuda()
    model.set_chunk_size(64)
    print("ESMFold loaded: %.1f GiB" % (torch.cuda.memory_allocated() / 2 ** 30))
    for n, rec in enumerate(records, 1):
        try:
            kept.append((rec.id, len(rec.seq), fold(rec)))
        except LowConfidenceFold as err:
            failed.append(err)
        print("[%d/%d] %s %d aa  kept %d  low-confidence %d  allocated %.1f GiB"
              % (n, len(records), rec.id, len(rec.seq), len(kept), len(failed),
                 torch.cuda.memory_allocated() / 2 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    torch.cuda.memory._dump_snapshot(os.path.join(out_dir, "oom_snapshot.pickle"))
    shutil.rmtree(out_dir, ignore_errors=True)
    raise
shutil.rmtree(out_dir, ignore_errors=True)
print("low-confidence:")
for err in failed:
    print("  ", err)
sys.exit(0)
