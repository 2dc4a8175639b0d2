"""train_cql.py -- offline RL for a warehouse bin-picking arm: CQL (SAC backbone, twin critics, a
Polyak-averaged target critic) from pixels, on 1.2M logged transitions, three RGB cameras at
128x128 (wrist + two fixed), a ResNet-18 encoder (GroupNorm, fp32) in the actor and one shared by
the twin Q heads, batch 512, one RTX A6000 (48 GB).  The author ported it from a JAX/Flax codebase,
where the loss is a function of the critic's parameters alone and jax.grad never differentiates the
target computation; in the PyTorch port the update reads:

    critic_target = copy.deepcopy(critic)
    def update_critic(batch):
        next_actions, next_log_pi = actor(batch.next_obs)                 # (no torch.no_grad)
        tq1, tq2 = critic_target(batch.next_obs, next_actions)
        target_q = batch.rew + gamma * (1 - batch.done) * (torch.min(tq1, tq2) - alpha * next_log_pi)
        q1, q2 = critic(batch.obs, batch.actions)
        loss = F.mse_loss(q1, target_q) + F.mse_loss(q2, target_q) + cql_alpha * cql_penalty(...)
        critic_opt.zero_grad(); loss.backward(); critic_opt.step()

With autograd on, the actor's pass over next_obs and the target critic's pass over next_obs both save
their activations for a backward that should never reach them (target_q is a regression target):
~16.5 GiB each (512 x 3 images x ~11.5 MB of ResNet-18 activations in fp32), and the deep-copied
target keeps requires_grad=True.  The critic's own forward on obs needs another 16.5 GiB, and the
very first critic update runs out in it, before any backward.

An expert: compute the TD target under torch.no_grad() (or detach it), and freeze the target copy
(requires_grad_(False)); then the critic update holds one encoder's activations (~17 GiB) and fits
with room to spare.  It is also a correctness bug: the critic loss would push gradients into the
actor and the target network.  Wrong first advice: a smaller batch (changes the algorithm and still
wastes two thirds of the memory), gradient checkpointing or mixed precision (treat the symptom),
expandable_segments or empty_cache (nothing is cached or fragmented), a bigger GPU.
"""
import copy
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH, CAMERAS, RES = 512, 3, 128
ACTION_DIM = 7

# ResNet-18 (GroupNorm) at 128x128: what autograd keeps per image, stage by stage (fp32)
SAVED_PER_IMAGE = (("stem", 4_000_000), ("layer1", 4_000_000), ("layer2", 2_000_000),
                   ("layer3", 1_000_000), ("layer4", 500_000), ("pool", 2_048))


class ResNet18Encoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, _ in SAVED_PER_IMAGE:
            setattr(self, name, torch.nn.Parameter(torch.empty(11_200_000 // len(SAVED_PER_IMAGE) * 4,
                                                               dtype=torch.uint8, device="cuda")))

    def forward(self, images):
        h = images
        for name, per_image in SAVED_PER_IMAGE:
            w = getattr(self, name)
            for part in range(4 if per_image > 1_000_000 else 1):       # conv, norm, relu, ...
                out = torch.empty(per_image * BATCH * CAMERAS // (4 if per_image > 1_000_000 else 1),
                                  dtype=torch.uint8, device="cuda")
                if torch.is_grad_enabled():
                    out._saved = h
                h = out
            del w
        return h


class MLP(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty((n_in * 1024 + 1024 * 1024 + 1024 * n_out) * 4,
                                                     dtype=torch.uint8, device="cuda"))

    def forward(self, x, n_rows):
        w = self.weight
        out = torch.empty(n_rows * 1024 * 4 * 4, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            out._saved = x
        del w
        return out


class Critic(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = ResNet18Encoder()
        self.q1 = MLP(512 * CAMERAS + ACTION_DIM, 1)
        self.q2 = MLP(512 * CAMERAS + ACTION_DIM, 1)

    def forward(self, obs, actions):
        feat = self.encoder(obs)
        a = self.q1(feat, BATCH)
        b = self.q2(a, BATCH)          # (the stand-in chains the two heads' saved tensors)
        return b


class Actor(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = ResNet18Encoder()
        self.policy = MLP(512 * CAMERAS, 2 * ACTION_DIM)

    def forward(self, obs):
        return self.policy(self.encoder(obs), BATCH)       # tanh-Gaussian sample and its log-prob


def sample_batch():
    obs = torch.empty(BATCH * CAMERAS * 3 * RES * RES * 4, dtype=torch.uint8, device="cuda")  # .float()/255
    next_obs = torch.empty(BATCH * CAMERAS * 3 * RES * RES * 4, dtype=torch.uint8, device="cuda")
    return obs, next_obs


def critic_loss(q, target_q):
    """F.mse_loss(q1, y) + F.mse_loss(q2, y) + cql_alpha * cql_penalty: one graph that holds what both
    q and y saved (the stand-in links their chains of saved tensors; nothing is computed)."""
    loss = torch.empty(512, device="cuda")
    loss._saved = q
    tail = q
    while getattr(tail, "_saved", None) is not None:
        tail = tail._saved
    tail._saved = target_q
    loss._params = q._params + target_q._params
    return loss


def main():
    actor, critic = Actor(), Critic()
    critic_target = copy.deepcopy(critic)
    actor_opt = torch.optim.AdamW(actor.parameters(), lr=1e-4, weight_decay=0.0)
    critic_opt = torch.optim.AdamW(critic.parameters(), lr=3e-4, weight_decay=0.0)
    print("models: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))
    for step in range(1, 500_001):
        obs, next_obs = sample_batch()
        actions = torch.empty(BATCH * ACTION_DIM * 4, dtype=torch.uint8, device="cuda")
        # ---- critic update ----
        next_actions = actor(next_obs)
        target_q = critic_target(next_obs, next_actions)
        q = critic(obs, actions)
        loss = critic_loss(q, target_q)                       # mse(q1, y) + mse(q2, y) + cql penalty
        scen_truth.backward(loss)
        critic_opt.step()
        critic_opt.zero_grad(set_to_none=True)
        del loss, q, target_q, next_actions, actions
        # ---- actor and temperature updates (actor_opt), then Polyak-average critic_target (not modelled) ----
        print("step %d done" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
