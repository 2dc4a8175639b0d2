"""ppo_trainer.py -- the trainer process of an RLHF job (PPO on a 1.5B policy, bf16 weights with
fp32 master copies and AdamW, on a 24 GiB card) that pushes the new weights to a separate rollout
engine after every update.  The sync helper builds a fresh NCCL communicator each time and never
destroys it:

    def sync_weights(model, engine):
        pg = StatelessProcessGroup.create(host, port, rank=0, world_size=engine.tp + 1)
        comm = PyNcclCommunicator(pg, device=torch.cuda.current_device())   # new NCCL buffers
        for name, p in model.named_parameters():
            comm.broadcast(p, src=0)
        engine.reload_weights.remote()
        # comm is never destroyed; NCCL keeps its channel buffers until the process exits

    for it in range(n_iters):
        batch = engine.generate(prompts)          # rollouts happen in the engine's processes
        loss = ppo_loss(policy(batch), ...); loss.backward(); optimizer.step(); optimizer.zero_grad()
        sync_weights(policy, engine)

The training state is 15.75 GiB and a PPO step's activations 3 GiB (from the cache).  Each sync adds
a communicator's 16 channel buffers (256 MiB) held by libnccl; after ~19 iterations
ncclCommInitRank cannot allocate its buffers.  An expert: create the communicator once and reuse
it for every sync (or destroy it after each); the framework's tensors are flat.
"""
import ctypes
import os
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

nccl = ctypes.CDLL(os.environ["SCEN_NCCL"])
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]


class DistBackendError(RuntimeError):
    """torch.distributed.DistBackendError"""


class PyNcclCommunicator(object):
    def __init__(self, world_size, rank):
        rc = nccl.nccl_comm_init_rank(world_size, rank, 16 * MiB, 16)
        if rc != 0:
            raise DistBackendError("NCCL error in: pynccl.py:99, unhandled cuda error (run with NCCL_DEBUG=INFO "
                                   "for details), NCCL version 2.21.5\nncclUnhandledCudaError: Call to CUDA "
                                   "function failed.\nLast error:\nCuda failure 'out of memory'")

    def broadcast(self, tensor, src=0):
        pass


class Policy(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(28):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, batch):
        h = batch
        for _ in range(12):
            a = torch.empty(256 * MiB, device="cuda")
            a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def sync_weights(model, engine_tp=4):
    comm = PyNcclCommunicator(engine_tp + 1, 0)
    for _, p in model.named_parameters():
        comm.broadcast(p, src=0)
    # the engine reloads; comm is dropped but NCCL's buffers stay (no destroy)
    _communicators.append(comm)


_communicators = []


def main():
    policy = Policy().cuda()
    bf16_copy = [torch.empty(64 * MiB, device="cuda") for _ in range(28)]      # the bf16 weights
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    for it in range(500):
        batch = torch.empty(16 * MiB, device="cuda")
        loss = policy(batch)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch
        sync_weights(policy)
        time.sleep(0.01)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
