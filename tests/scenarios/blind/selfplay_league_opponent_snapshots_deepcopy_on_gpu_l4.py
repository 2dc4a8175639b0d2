"""train_selfplay.py -- self-play PPO for two-robot sumo in a GPU-vectorised simulator (4096 arenas), a
256M-parameter transformer policy (fp32, 1 GiB), one 24 GB L4:

    policy = TransformerPolicy().cuda()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    league = [copy.deepcopy(policy)]              # past selves, sampled as opponents
    for it in range(num_iters):
        opponent = random.choice(league)
        rollout = collect(env, policy, opponent)  # 2 GiB of obs/actions/values on the GPU
        ppo_update(policy, optimizer, rollout)    # 3 GiB of activations per minibatch
        if it % 5 == 0:
            league.append(copy.deepcopy(policy))  # a frozen snapshot: 1 GiB more on the GPU each time

Every snapshot is a full copy of the weights on the card and the league list keeps all of them; the
job runs for a while and then a PPO update fails.  The failing request is ordinary (a gradient in
the update's backward); what filled the card is a dozen opponent copies kept by a Python list.

An expert: keep the league on the CPU (state_dict moved to host memory, or on disk) and move only the
sampled opponent to the GPU for its rollout; or bound the league (keep the last N).  Not a smaller
batch, checkpointing or mixed precision of the activations; not a cache or fragmentation problem.
"""
import copy
import random
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))


class TransformerPolicy(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.b0, self.b1, self.b2, self.b3 = Block(), Block(), Block(), Block()

    def forward(self, obs):
        h = obs
        acts = []
        for b in (self.b0, self.b1, self.b2, self.b3):
            out = torch.empty(768 * MiB, device="cuda") if torch.is_grad_enabled() else torch.empty(64 * MiB, device="cuda")
            out._saved = h
            h = out
            acts.append(out)
        return h


def collect(policy, opponent):
    """4096 arenas x 64 steps: observations, actions, log-probs, values of both robots."""
    rollout = [torch.empty(512 * MiB, device="cuda") for _ in range(4)]
    with torch.no_grad():
        policy(rollout[0])
        opponent(rollout[0])
    return rollout


def ppo_update(policy, optimizer, rollout):
    for mb in range(2):
        out = policy(rollout[mb])
        loss = torch.empty(512, device="cuda")
        loss._saved = out
        loss._params = tuple(policy.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, out


def main():
    random.seed(0)
    policy = TransformerPolicy()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(policy.parameters(), lr=3e-4)
    league = [copy.deepcopy(policy)]
    for it in range(1, 1000):
        opponent = random.choice(league)
        rollout = collect(policy, opponent)
        ppo_update(policy, optimizer, rollout)
        del rollout, opponent
        if it % 5 == 0:
            league.append(copy.deepcopy(policy))


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
