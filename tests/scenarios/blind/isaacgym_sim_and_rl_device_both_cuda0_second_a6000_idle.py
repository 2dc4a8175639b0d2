"""train_ppo.py -- IsaacGymEnvs-style PPO for a humanoid with a depth camera, 16384 environments, on a
workstation with two 48 GB RTX A6000s.  The config leaves every device at its default:

    sim_device: cuda:0        # PhysX GPU pipeline
    rl_device: cuda:0         # observations, rollout storage, policy, PPO update
    graphics_device_id: 0

    gym.create_sim(0, 0, gymapi.SIM_PHYSX, sim_params)  # PhysX GPU buffers: 12 GiB (contact pairs,
                                                        # found/lost pairs capacity for 16384 envs)
    obs_buf = gymtorch.wrap_tensor(...)                 # 2 GiB of state tensors (PyTorch)
    storage = RolloutStorage(16384, horizon=32, ...)    # 20 GiB (depth observations)
    for it in range(max_iterations):
        collect(storage); ppo.update(storage)           # minibatch activations: 10 GiB

PhysX's buffers (outside PyTorch), the rollout storage and the update all sit on cuda:0; the process
never touches cuda:1.  The first PPO update's forward fails.  The job as a whole fits the machine
easily: half of it is on a card that does nothing.

An expert: put the learner on the idle GPU (rl_device=cuda:1: rollout storage, policy and update there,
the simulator alone on cuda:0); or fewer environments/shorter horizon if one card must do.  Not other
processes, not a cache or fragmentation problem, not a stale context.
"""
import ctypes
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def create_sim(device):
    """gym.create_sim: the PhysX GPU pipeline allocates its own buffers with the CUDA runtime."""
    rt = ctypes.CDLL("libcudart.so.13")
    rt.cudaSetDevice(device)
    bufs = []
    for _ in range(6):
        p = ctypes.c_void_p()
        if rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(2 * GiB)) != 0:
            raise RuntimeError("PhysX: failed to allocate GPU buffers")
        bufs.append(p)
    return bufs


class ActorCritic(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.cnn = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda:0"))
        self.mlp = torch.nn.Parameter(torch.empty(768 * MiB, device="cuda:0"))

    def forward(self, obs):
        h = obs
        for _ in range(10):                            # depth CNN + MLP over a 65536-sample minibatch
            out = torch.empty(1024 * MiB, device="cuda:0")
            if torch.is_grad_enabled():
                out._saved = h
            h = out
        return h


def main():
    sim = create_sim(0)
    state = [torch.empty(512 * MiB, device="cuda:0") for _ in range(4)]       # wrapped root/dof/contact tensors
    policy = ActorCritic()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    storage = [torch.empty(640 * MiB, device="cuda:0") for _ in range(32)]   # horizon 32
    for it in range(1000):
        with torch.no_grad():
            for t in range(32):
                policy(state[0])                                             # acting: small
        for mb in range(4):
            out = policy(storage[mb])
            loss = torch.empty(512, device="cuda:0")
            loss._saved = out
            loss._params = tuple(policy.parameters())
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del out, loss
    del sim


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
