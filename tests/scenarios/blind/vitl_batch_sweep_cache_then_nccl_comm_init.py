"""pretrain_vitl.py -- supervised ViT-L/16 training (304M parameters, bf16 autocast) on two cloud VMs with one
A100 40GB each, launched with `torchrun --nnodes 2 --nproc-per-node 1 --rdzv-endpoint node-a:29500`; this
is rank 0.  Before wrapping the model in DDP, the script picks its per-GPU batch with a small throughput
sweep on the local card:

    model = vit_large_patch16_224().cuda()
    for bs in (96, 128, 160, 192):                  # keep the fastest that fits
        torch.cuda.empty_cache()                    # each trial starts from a clean cache
        imgs_per_s[bs] = benchmark(model, bs)       # 3 x (forward + backward), grads set to None
    batch_size = max(imgs_per_s, key=imgs_per_s.get)
    dist.init_process_group("nccl")                 # lazy: no communicator yet
    model = DDP(model, device_ids=[local_rank])     # its first collective creates NCCL's communicator

All four trials fit (192 peaks at 39.3 GiB reserved of the 40).  Then DDP's constructor fails:
`ncclUnhandledCudaError: Call to CUDA function failed ... Cuda failure 'out of memory'` while NCCL
allocates its channel buffers (16 channels of 18 MiB towards the other node).  PyTorch still reserves
the 192 trial's memory: 38 GiB of it cached and unused, since the gradients were set to None and the
activations freed; NCCL allocates with cudaMalloc itself, and PyTorch's cache gives nothing back to
another library's allocation.  About 190 MiB were free on the card when NCCL started: ten
buffers fit, the eleventh does not.

An expert: PyTorch's cache holds what NCCL needs -- call torch.cuda.empty_cache() after the sweep (and
gc.collect() first), or create the communicator before the sweep (init_process_group(device_id=...)
initialises NCCL eagerly), or run the sweep in a separate process.  Not a smaller batch (the trials fit
and are over), not smaller NCCL buffers (their size is NCCL's default; the cache is the problem),
not another process, not fragmentation inside PyTorch.
"""
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# what torch.distributed's ProcessGroupNCCL calls into: libnccl.so.2 (here the scenario kit's stand-in,
# which cudaMallocs one buffer per channel when a communicator is created)
nccl = ctypes.CDLL(os.environ["KIT_NCCL"])
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]

LAYERS = 24
LAYER_PARAMS = 48 * MiB                 # fp32 bytes of one ViT-L block (12.6M parameters)
ACT_PER_IMAGE = 8 * MiB + 224 * 1024    # bf16 activations one block saves per 224 px image


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(LAYER_PARAMS, device="cuda"))

    def forward(self, x, batch_size):
        h = torch.empty(batch_size * ACT_PER_IMAGE, device="cuda")
        h._saved = x
        return h


class VisionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        self.head = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.blocks = []
        for i in range(LAYERS):
            b = Block()
            setattr(self, "block%d" % i, b)
            self.blocks.append(b)

    def forward(self, images):
        batch_size = images.nbytes // (3 * 224 * 224 * 2)
        h = images
        for b in self.blocks:
            h = b(h, batch_size)
        loss = torch.empty(512, device="cuda")
        loss._saved = h
        return loss


def benchmark(model, batch_size, steps=3):
    for _ in range(steps):
        images = torch.empty(batch_size * 3 * 224 * 224 * 2, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(images)
        scen_truth.backward(loss)
        model.zero_grad(set_to_none=True)
        del loss, images
    return 1000.0 * batch_size / (180.0 + batch_size)


class DistBackendError(RuntimeError):
    """torch.distributed.DistBackendError"""


def ddp(model, local_rank):
    """DistributedDataParallel(model, device_ids=[local_rank]): the constructor's first collective
    (verifying the parameters' shapes across ranks) makes ProcessGroupNCCL create its communicator."""
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    if nccl.nccl_comm_init_rank(world, rank, 18 * MiB, 16) != 0:
        raise DistBackendError(
            "NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled cuda error (run with NCCL_DEBUG=INFO for "
            "details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA function failed.\n"
            "Last error:\nCuda failure 'out of memory'")
    return torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = VisionTransformer().cuda()
    model.train()
    imgs_per_s = {}
    for bs in (96, 128, 160, 192):
        torch.cuda.empty_cache()
        imgs_per_s[bs] = benchmark(model, bs)
        print("batch %d: %.0f img/s, reserved %.1f GiB" % (bs, imgs_per_s[bs], torch.cuda.memory_reserved() / 2**30))
    batch_size = max(imgs_per_s, key=imgs_per_s.get)
    model = ddp(model, local_rank)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    print("training with batch %d per GPU" % batch_size)


main()
sys.exit(0)
