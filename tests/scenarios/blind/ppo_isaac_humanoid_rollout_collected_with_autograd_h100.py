"""train_ppo.py -- PPO on a GPU-simulated humanoid task (Isaac-style: 4096 environments stepping on
the same H100 80 GB, observations already CUDA tensors), a hand-written actor-critic (two 3-layer
MLPs of 1024 units, 9M parameters) and a long horizon, num_steps 1024 per rollout.  The user
ported CleanRL's loop but dropped its `with torch.no_grad():` around the policy call while
collecting ("the values need gradients for the critic loss"), and keeps
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True from another project:

    for step in range(num_steps):                       # rollout collection
        action, logprob, entropy, value = agent.get_action_and_value(obs)
        actions.append(action); logprobs.append(logprob); values.append(value)
        obs, reward, done, info = envs.step(action)
    # ... then PPO epochs recompute logprob and value on minibatches

Each stored logprob and value keeps that step's autograd graph, i.e. every hidden activation of
both MLPs for 4096 environments (~200 MiB per step).  Memory climbs step after step through the
first rollout and runs out around step 400 of 1024, before any optimizer step.

An expert: collection is inference -- run the policy under torch.no_grad() (or inference_mode)
while collecting, or store detached logprobs/values (PPO recomputes both in the update); then the
rollout is a few hundred MiB.  Not fewer environments or a smaller batch, not mixed precision or
checkpointing, not expandable_segments/empty_cache, not a bigger GPU or sharding.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

NUM_ENVS = 4096


class MLP(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.l0 = torch.nn.Parameter(torch.empty(n_in * 1024 * 4, device="cuda"))
        self.l1 = torch.nn.Parameter(torch.empty(1024 * 1024 * 4, device="cuda"))
        self.l2 = torch.nn.Parameter(torch.empty(1024 * n_out * 4, device="cuda"))

    def forward(self, x):
        for _ in range(3):
            pre = torch.empty(NUM_ENVS * 1024 * 4, device="cuda")       # linear output
            pre._saved = x
            h = torch.empty(NUM_ENVS * 1024 * 4, device="cuda")         # ELU output
            h._saved = pre
            x = h
        return x


class Agent(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.actor = MLP(256, 21)
        self.critic = MLP(256, 1)
        self.log_std = torch.nn.Parameter(torch.empty(21 * 4, device="cuda"))

    def get_action_and_value(self, obs):
        mean = self.actor(obs)
        v = self.critic(obs)
        action = torch.empty(NUM_ENVS * 21 * 4, device="cuda").detach()
        logprob = torch.empty(NUM_ENVS * 4, device="cuda")
        logprob._saved = mean
        value = torch.empty(NUM_ENVS * 4, device="cuda")
        value._saved = v
        return action, logprob, logprob, value

    def forward(self, obs):
        return self.get_action_and_value(obs)


def main():
    agent = Agent()
    agent.train()
    optimizer = torch.optim.AdamW(agent.parameters(), lr=3e-4, weight_decay=0.0)
    num_steps = 1024
    obs = torch.empty(NUM_ENVS * 256 * 4, device="cuda")
    for update in range(1, 2000):
        actions, logprobs, values, rewards = [], [], [], []
        for step in range(num_steps):
            action, logprob, entropy, value = agent(obs)
            actions.append(action)
            logprobs.append(logprob)
            values.append(value)
            obs = torch.empty(NUM_ENVS * 256 * 4, device="cuda")        # envs.step(action)
            rewards.append(torch.empty(NUM_ENVS * 4, device="cuda"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
