"""pets_train.py -- model-based RL (PETS) for a 7-DoF arm reaching task, on one 24 GB RTX A5000.  A
probabilistic ensemble of 5 dynamics models (1 GiB fp32 with AdamW) is trained on the replay data;
then the robot acts with a CEM planner that rolls 500 candidate action sequences x 20 particles
through the ensemble for a 30-step horizon:

    def plan(obs):                                   # called every control step
        mean, std = init_mean, init_std
        for it in range(5):                          # CEM iterations
            actions = mean + std * torch.randn(500, 30, act_dim, device="cuda")
            states, cost = obs.expand(...), 0
            for t in range(30):
                states = ensemble(states, actions[:, t])     # no torch.no_grad() around the planner
                cost = cost + reward_fn(states)
            elites = actions[cost.topk(50).indices]; mean, std = elites.mean(0), elites.std(0)
        return mean[0]

Training the ensemble fits.  The planner runs with autograd on: every step of the horizon keeps the
ensemble's hidden activations (1 GiB per step) for a backward that never comes, and the first plan of
the first episode fails about two thirds into the horizon.  Inside plan() nothing needs gradients.

An expert: what the job was doing decides it: acting, not training; run the planner under
torch.no_grad() (or inference_mode): each step's activations are then dropped and the plan needs a
few hundred MiB.  Not a smaller batch, gradient checkpointing or a bigger card; not a cache or
fragmentation problem.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Member(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))


class Ensemble(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.m0, self.m1, self.m2, self.m3, self.m4 = Member(), Member(), Member(), Member(), Member()
        self.m5, self.m6, self.m7, self.m8, self.m9 = Member(), Member(), Member(), Member(), Member()
        self.m10, self.m11, self.m12, self.m13, self.m14 = Member(), Member(), Member(), Member(), Member()
        self.m15 = Member()

    def forward(self, states, actions, hidden_bytes):
        h = states
        for _ in range(4):                               # 4 hidden layers of 5 members, 10k rollouts
            out = torch.empty(hidden_bytes, device="cuda")
            if torch.is_grad_enabled():
                out._saved = h                           # kept for backward
            h = out
        nxt = torch.empty(8 * MiB, device="cuda")        # next states (mean, var)
        if torch.is_grad_enabled():
            nxt._saved = h
        return nxt


def train_ensemble(model, optimizer, batches):
    for _ in range(batches):
        x = torch.empty(16 * MiB, device="cuda")
        out = model(x, None, 128 * MiB)
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del x, out, loss


def plan(model, obs):
    mean = torch.empty(2 * MiB, device="cuda")
    for it in range(5):
        actions = torch.empty(32 * MiB, device="cuda")
        states, cost = obs, None
        for t in range(30):
            states = model(states, actions, 256 * MiB)
            c = torch.empty(2 * MiB, device="cuda")
            c._saved = (states, cost)
            cost = c
        mean = torch.empty(2 * MiB, device="cuda")
        del states, cost, actions
    return mean


def main():
    model = Ensemble()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    replay = torch.empty(1024 * MiB, device="cuda")          # 1M transitions on the GPU
    train_ensemble(model, optimizer, 20)
    obs = torch.empty(2 * MiB, device="cuda")
    for step in range(200):
        action = plan(model, obs)
        obs = torch.empty(2 * MiB, device="cuda")            # env.step(action)
        del action


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
