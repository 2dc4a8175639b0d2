"""train_biggan.py -- BigGAN-deep at 256 px (BigGAN-PyTorch style: G 50M and D 40M parameters, an EMA copy
of G, AdamW for both, batch 64) on a V100 32GB, resumed from its snapshot at iteration 49,990.  Every
2,000 iterations it scores FID with the original TensorFlow Inception code (TTUR's fid.py, run in the same
process), as the paper's numbers were computed:

    os.environ["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"     # so that TF does not grab the whole card
    import tensorflow as tf, fid                        # (the run's launch script exports it as well)
    ...
    if it % 2000 == 0:
        torch.cuda.empty_cache()                        # "give TF room for the Inception net"
        samples = sample_50k(G_ema)                     # generated in batches, moved to the CPU
        fid_score = fid.calculate_fid_given_arrays(samples, stats, batch_size=500)

Training alone holds about 22 GiB (1.3 GiB of weights and AdamW state, 20 GiB of activations at the
peak).  The FID at iteration 50,000 finishes (11.80), and the first training iteration after it dies in
the forward pass, 14.7 GiB into its 20 GiB of activations.  TensorFlow, with memory growth on, grew its allocator to 15 GiB
(regions of 1, 2, 4 and 8 GiB) while running Inception on 50,000 images at batch 500; TensorFlow
never gives its regions back, so after the FID it holds 15 GiB it no longer uses.  The
torch.cuda.empty_cache() before the FID handed PyTorch's 20 GiB cache back to the driver, where
TensorFlow took the part it needed; PyTorch cannot get it back.

An expert: another framework in this process holds the memory -- cap TensorFlow's allocator
(tf.config.set_logical_device_configuration(gpu, [LogicalDeviceConfiguration(memory_limit=2048)])),
run the TF Inception on the CPU (tf.config.set_visible_devices([], "GPU")) or in a subprocess that exits,
or score FID with a PyTorch Inception.  Not PyTorch's cache (already emptied), not fragmentation,
not another process; a smaller batch or checkpointing changes a training step that fitted.
"""
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

# `import tensorflow`: its GPU allocator lives in libtensorflow_framework.so.2 (here the scenario kit's
# stand-in: with TF_FORCE_GPU_ALLOW_GROWTH=true it grows region by region and never gives one back)
tf = ctypes.CDLL(os.environ["KIT_TENSORFLOW"])
tf.tf_alloc.restype = ctypes.c_void_p
tf.tf_alloc.argtypes = [ctypes.c_size_t]

ACT = 560 * MiB                     # one saved activation of G or D at batch 64, 256 px
ACTS_PER_ITER = 36


class Net(torch.nn.Module):
    def __init__(self, nbytes, blocks):
        torch.nn.Module.__init__(self)
        self.blocks = []
        for i in range(blocks):
            p = torch.nn.Parameter(torch.empty(nbytes // blocks, device="cuda"))
            setattr(self, "block%d" % i, p)
            self.blocks.append(p)

    def forward(self, x, n_acts):
        h = x
        for i in range(n_acts):
            a = torch.empty(ACT, device="cuda")
            a._saved = h
            h = a
        return h


def sample_50k(G_ema):
    """50,000 images from the EMA generator in batches of 100, each batch moved to the CPU."""
    with torch.no_grad():
        for _ in range(500):
            z = torch.empty(100 * 128 * 4, device="cuda")
            img = torch.empty(100 * 3 * 256 * 256 * 4, device="cuda")
            img._saved = z
            del img, z           # img.cpu().numpy() appended to a host array


def calculate_fid_given_arrays(batch_size=500):
    """TTUR's fid.py: Inception pool3 features of the 50k samples, in TensorFlow.  With memory growth on,
    TF's BFC allocator extends itself by regions that double in size as Inception's batches need them."""
    if tf.tf_gpu_init(0) != 0:
        raise RuntimeError("tensorflow: could not create the GPU device")
    for region in (1 * GiB, 2 * GiB, 4 * GiB, 8 * GiB):
        if not tf.tf_alloc(region):
            raise RuntimeError("tensorflow ResourceExhaustedError: OOM when allocating tensor")
    return 11.8


def main():
    G = Net(200 * MiB, 20).cuda()
    D = Net(160 * MiB, 16).cuda()
    G_ema = Net(200 * MiB, 20).cuda()
    for p in G_ema.parameters():
        p.requires_grad_(False)
    opt_G = torch.optim.AdamW(G.parameters(), lr=1e-4, betas=(0.0, 0.999))
    opt_D = torch.optim.AdamW(D.parameters(), lr=4e-4, betas=(0.0, 0.999))
    batch_size = 64
    start_iter = 49990                  # resumed from the last snapshot (loading not shown)
    for it in range(start_iter + 1, 500001):
        z = torch.empty(batch_size * 128 * 4, device="cuda")
        real = torch.empty(batch_size * 3 * 256 * 256 * 4, device="cuda")
        fake = G(z, ACTS_PER_ITER // 2)
        out = D(fake, ACTS_PER_ITER // 2)
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = tuple(G.parameters()) + tuple(D.parameters())
        scen_truth.backward(loss)
        opt_D.step()
        opt_G.step()
        opt_G.zero_grad(set_to_none=True)
        opt_D.zero_grad(set_to_none=True)
        del loss, out, fake, real, z
        if it % 2000 == 0:
            torch.cuda.empty_cache()    # give TF room for the Inception net
            sample_50k(G_ema)
            fid_score = calculate_fid_given_arrays(batch_size=500)
            print("iteration %d: FID %.2f" % (it, fid_score))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
