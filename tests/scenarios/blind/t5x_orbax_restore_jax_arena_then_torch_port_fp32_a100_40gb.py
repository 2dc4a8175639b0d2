"""finetune_torch_port.py -- the team is moving a T5-XL (3B) fine-tune from T5X/JAX to PyTorch, on one
A100 40GB (cc 8.0).  The port restores the last T5X checkpoint with Orbax in the same process and
copies every array into the PyTorch model through DLPack, then trains with AdamW in bf16 autocast:

    import jax, orbax.checkpoint as ocp, torch
    params = ocp.PyTreeCheckpointer().restore("gs://.../checkpoint_420000")   # bf16 arrays, on the GPU
    model = T5ForConditionalGeneration(T5Config.from_pretrained("t5-v1_1-xl")).cuda()   # fp32
    for name, arr in flatten(params).items():
        get_param(model, name).data.copy_(torch.from_dlpack(arr).float())

The first JAX array on the GPU makes XLA's client preallocate its arena: 75% of the card (30 GiB,
XLA_PYTHON_CLIENT_PREALLOCATE defaults to true), of which the bf16 checkpoint uses 5.6 GiB.  The arena
stays mapped after the arrays are copied, even when they are deleted.  PyTorch has the rest of the
card, 9.5 GiB; the fp32 model alone needs 11 GiB, and building it fails in the decoder's blocks.

User: "CUDA OOM building a 3B model on a 40 GB card? It trained fine in JAX."
An expert, first: JAX (not PyTorch) holds three quarters of the card -- restore the checkpoint on the
host (JAX_PLATFORMS=cpu for the conversion, or Orbax's restore_args with a CPU sharding), or at least
XLA_PYTHON_CLIENT_PREALLOCATE=false / a small XLA_PYTHON_CLIENT_MEM_FRACTION and delete the arrays
after the copy; better, convert once offline and torch.load(map_location="cpu").  Wrong advice:
torch.cuda.empty_cache (PyTorch caches nothing), expandable_segments, a smaller batch (no batch has
run), quantization or FSDP, killing other processes (there are none), a bigger card.
"""
import sys

import jax
import jax.numpy as jnp
import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N_BLOCKS = 24            # encoder and decoder each
ENC_MIB = 192            # per encoder block, fp32 (d_model 2048, d_ff 5120, gated)
DEC_MIB = 256            # per decoder block, fp32 (plus cross-attention)


def orbax_restore():
    """PyTreeCheckpointer().restore(path): every array restored onto the default device (the GPU)."""
    params = {"shared": jnp.empty(64 * MiB, dtype=jnp.bfloat16)}         # 32128 x 2048
    for i in range(N_BLOCKS):
        params["encoder/layers_%d" % i] = jnp.empty(ENC_MIB // 4 * MiB, dtype=jnp.bfloat16)
        params["decoder/layers_%d" % i] = jnp.empty(DEC_MIB // 4 * MiB, dtype=jnp.bfloat16)
    params["decoder/logits_dense"] = jnp.empty(64 * MiB, dtype=jnp.bfloat16)
    return params


class T5Block(torch.nn.Module):
    def __init__(self, mib):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, device="cuda"))      # fp32 default


class T5ForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
        for i in range(N_BLOCKS):
            setattr(self, "encoder_block%d" % i, T5Block(ENC_MIB))
        for i in range(N_BLOCKS):
            setattr(self, "decoder_block%d" % i, T5Block(DEC_MIB))
        self.lm_head = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))


def main():
    params = orbax_restore()
    print("restored %d arrays" % len(params))
    model = T5ForConditionalGeneration()
    for name, arr in list(params.items()):
        pass                                      # get_param(model, name).data.copy_(from_dlpack(arr).float())
    del params
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return opt


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
