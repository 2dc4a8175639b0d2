"""design_loop.py -- a protein-binder design loop in one process on an A100-SXM4-80GB: ProteinMPNN
(PyTorch) proposes sequences for each backbone, AlphaFold2 (JAX, through ColabFold's model runner)
refolds the complex to score it (pLDDT / iPAE).  The targets are queued smallest first.

Having read that JAX takes 75% of the card at start and starves PyTorch, the student launched it with

    XLA_PYTHON_CLIENT_PREALLOCATE=false python design_loop.py

and believed that JAX now "takes what it needs".  It does not take more than its fraction, though:
without preallocation XLA's allocator grows its regions on demand, but never beyond
XLA_PYTHON_CLIENT_MEM_FRACTION, still at its default 0.75 -- 60 GiB of this card.  The small targets
(300-900 residues of complex) fold fine; the 1,850-residue receptor + binder complex needs ~65 GiB of
pair representation, triangle-attention and structure-module buffers, and JAX refuses inside its own
allocator ("RESOURCE_EXHAUSTED: Out of memory while trying to allocate ...") while the card still has
~17 GiB free: ProteinMPNN holds only ~1 GiB in PyTorch, nothing else runs on the card.

An expert, first: raise JAX's own cap -- XLA_PYTHON_CLIENT_MEM_FRACTION=.95 (ColabFold's own launcher
sets it, with TF_FORCE_UNIFIED_MEMORY=1, for big complexes), or XLA_PYTHON_CLIENT_ALLOCATOR=platform.
Wrong advice: a bigger GPU (the card is not full), PyTorch's empty_cache or limiting PyTorch (1 GiB is
not what is missing), killing other processes (there are none), fewer sequences per backbone (the fold
runs one sequence at a time).
"""
import os
import sys

import jax
import jax.numpy as jnp
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
TARGETS = [("PD-L1 binder", 320), ("IL-7Ra binder", 540), ("TrkA binder", 880), ("insulin receptor + binder", 1850)]


class ProteinMPNN(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(7 * MiB, device="cuda"))

    def sample(self, n_res, num_seqs=8):
        with torch.no_grad():
            feats = [torch.empty(num_seqs * n_res * 48 * 128 * 4, device="cuda") for _ in range(3)]   # k-NN edges
            seqs = torch.empty(num_seqs * n_res * 8, device="cuda")
            del feats
        return seqs


def alphafold_predict(params, n_res):
    """model_runner.predict(feat): the compiled AF2 forward; buffers scale with n_res**2 (pair
    representation, 128 channels, fp32) and triangle attention (4 heads, n_res**2 x chunk)."""
    pair_bytes = n_res * n_res * 128 * 4
    buffers = []
    for _ in range(int(38 * pair_bytes / (512 * MiB)) + 1):          # Evoformer pair/MSA activations, 512 MiB pieces
        buffers.append(jnp.zeros((128 * MiB,), jnp.float32))
    tri = [jnp.zeros((n_res * n_res * 4 * 64 // 4,), jnp.float32) for _ in range(4)]    # triangle attention
    structure = jnp.zeros((n_res * 384 * 8,), jnp.float32)
    for b in buffers + tri:
        b.delete()
    return structure


def main():
    scen_truth.note_every_empty(torch)
    mpnn = ProteinMPNN()
    af2_params = [jnp.zeros((93 * MiB // 4,), jnp.float32) for _ in range(4)]    # model_1_multimer_v3, 372 MiB
    for name, n_res in TARGETS:
        seqs = mpnn.sample(n_res)
        for k in range(8):
            try:
                structure = alphafold_predict(af2_params, n_res)
            except jax.errors.JaxRuntimeError as e:
                n = int(str(e).rsplit(" ", 2)[-2])
                st = jax.devices()[0].memory_stats()        # truth at the refusal (test scaffolding)
                scen_truth.mark("fail", 0, n, allocated=st["bytes_in_use"], reserved=st["pool_bytes"], released=0, fw=1)
                raise
            structure.delete()
        print("%s (%d residues): 8 designs folded" % (name, n_res))
        del seqs


main()
sys.exit(0)
