"""train_drqv2.py -- DrQ-v2 (pixel-based actor-critic) on DeepMind Control humanoid_run, 84x84 frames,
frame_stack 3, action_repeat 2 (500 transitions per episode), replay_buffer_size 1,000,000, batch 256, on
a 24 GB RTX 3090.  The original keeps episodes as .npz files read back by DataLoader workers; that was
the bottleneck, so I rewrote the buffer to keep every episode on the GPU and sample with indexing:

    class GPUReplayBuffer:
        def add_episode(self, ep):                    # ep: dict of numpy arrays, 501 steps
            self._episodes.append({k: torch.as_tensor(v, device="cuda") for k, v in ep.items()})
            self._size += len(ep["action"]) - 1
            while self._size > self.capacity:         # 1M transitions
                self._size -= len(self._episodes.pop(0)["action"]) - 1

    for episode in itertools.count():
        replay_buffer.add_episode(run_episode(env, agent))
        for _ in range(update_every):
            agent.update(replay_buffer.sample(256))

Ten times faster -- for the first hour and a half.  Then "CUDA out of memory" in the encoder's forward of
an update, at episode 433 (217k transitions), reproducibly: "Tried to allocate 52.53 MiB ... 38 MiB
free ... 13.5 GiB allocated by PyTorch, 10 GiB reserved but unallocated".  GPU memory climbed the
whole time.

What an expert sees: each episode stores 501 stacked observations (9 x 84 x 84 uint8, 31.8 MB) on the
GPU and nothing is evicted before 1M transitions -- 63 GB of observations at capacity, on a 24 GB card.
The update that fails is a victim (its few hundred MiB of batch and encoder activations is the same
every step).  The 10 GiB of split cache is the long-lived episode tensors pinning segments that the
update's temporaries were cut from: it makes the failure come at 217k transitions instead of ~350k;
expandable_segments would postpone it by a few hundred episodes, not fix it.  Keep the buffer in host
memory (pinned, or the original .npz workers) and move one sampled batch at a time; or bound the GPU
part to what fits (store single frames, not stacks, and a capacity of ~100k).  A smaller batch buys
a few episodes; no other process is involved.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
FRAME = 3 * 84 * 84
STACK = 3
EP_LEN = 500
ACTION_DIM = 21                      # humanoid


class Encoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.convnet = nn.Parameter(torch.empty(240_000 * 4, device="cuda"))

    def forward(self, obs):
        b = obs.nbytes // (STACK * FRAME * 4)
        h = obs
        for _ in range(4):                                    # 4 conv layers, 32 x 41 x 41 (then 35 x 35)
            out = torch.empty(b * 32 * 41 * 41 * 4, device="cuda")
            out._saved = h
            h = out
        return h


class Actor(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.trunk = nn.Parameter(torch.empty(32 * 35 * 35 * 50 * 4, device="cuda"))
        self.policy = nn.Parameter(torch.empty((50 * 1024 + 1024 * 1024 + 1024 * 2 * ACTION_DIM) * 4, device="cuda"))

    def forward(self, h):
        b = h.nbytes // (32 * 41 * 41 * 4)
        out = torch.empty(b * 1024 * 4 * 4, device="cuda")
        out._saved = h
        return out


class Critic(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.trunk = nn.Parameter(torch.empty(32 * 35 * 35 * 50 * 4, device="cuda"))
        self.q1 = nn.Parameter(torch.empty((71 * 1024 + 1024 * 1024 + 1024) * 4, device="cuda"))
        self.q2 = nn.Parameter(torch.empty((71 * 1024 + 1024 * 1024 + 1024) * 4, device="cuda"))

    def forward(self, h, action):
        b = h.nbytes // (32 * 41 * 41 * 4)
        q = torch.empty(b * 1024 * 4 * 6, device="cuda")
        q._saved = h
        return q


class DrQV2Agent(object):
    def __init__(self):
        self.encoder = Encoder()
        self.actor = Actor()
        self.critic = Critic()
        self.critic_target = Critic()
        self.encoder_opt = torch.optim.AdamW(self.encoder.parameters(), lr=8e-5, weight_decay=0.0)
        self.actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=8e-5, weight_decay=0.0)
        self.critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=8e-5, weight_decay=0.0)

    def aug(self, obs):
        """Random shift: pad 4 and crop back (a new float tensor of the batch)."""
        out = torch.empty(obs.nbytes, device="cuda")
        return out

    def update(self, batch):
        obs, action, reward, discount, next_obs = batch
        obs = self.aug(torch.empty(obs.nbytes * 4, device="cuda"))             # .float() then shift
        next_obs = self.aug(torch.empty(next_obs.nbytes * 4, device="cuda"))
        h = self.encoder(obs)
        with torch.no_grad():
            next_h = self.encoder(next_obs)
            target_q = self.critic_target(next_h, action)
        q = self.critic(h, action)
        critic_loss = torch.empty(512, device="cuda")
        critic_loss._saved = q
        critic_loss._params = tuple(self.critic.parameters()) + tuple(self.encoder.parameters())
        scen_truth.backward(critic_loss)
        self.critic_opt.step()
        self.encoder_opt.step()
        self.critic_opt.zero_grad(set_to_none=True)
        self.encoder_opt.zero_grad(set_to_none=True)
        del critic_loss, q, h, next_h, target_q
        pi = self.actor(torch.empty(obs.nbytes // (STACK * FRAME * 4) * 32 * 41 * 41 * 4, device="cuda"))
        actor_loss = torch.empty(512, device="cuda")
        actor_loss._saved = pi
        actor_loss._params = tuple(self.actor.parameters())
        scen_truth.backward(actor_loss)
        self.actor_opt.step()
        self.actor_opt.zero_grad(set_to_none=True)


class GPUReplayBuffer(object):
    def __init__(self, capacity):
        self.capacity = capacity
        self._episodes = []
        self._size = 0

    def add_episode(self, ep):
        self._episodes.append(dict((k, torch.empty(n, device="cuda")) for k, n in ep.items()))
        self._size += EP_LEN
        while self._size > self.capacity:
            self._episodes.pop(0)
            self._size -= EP_LEN

    def sample(self, batch_size):
        """Indexing the episodes: a gathered batch (uint8 stacks, actions, rewards, next stacks)."""
        return (torch.empty(batch_size * STACK * FRAME, device="cuda"),
                torch.empty(batch_size * ACTION_DIM * 4, device="cuda"),
                torch.empty(batch_size * 4, device="cuda"),
                torch.empty(batch_size * 4, device="cuda"),
                torch.empty(batch_size * STACK * FRAME, device="cuda"))


def run_episode():
    """The environment's episode as numpy arrays (host memory), sizes in bytes."""
    return {"observation": (EP_LEN + 1) * STACK * FRAME, "action": (EP_LEN + 1) * ACTION_DIM * 4,
            "reward": (EP_LEN + 1) * 4, "discount": (EP_LEN + 1) * 4}


def main():
    agent = DrQV2Agent()
    replay_buffer = GPUReplayBuffer(capacity=1_000_000)
    batch_size = 256
    update_every = 2                    # (the real run: one update per 2 env steps; memory is the same)
    for episode in range(5000):
        replay_buffer.add_episode(run_episode())
        if episode < 4:
            continue                    # num_seed_frames
        for _ in range(update_every):
            agent.update(replay_buffer.sample(batch_size))
    return batch_size


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
