"""train_dreamer.py -- my DreamerV3-style agent on Atari (64x64 RGB), single RTX 4090 (24 GB).  To avoid
host-to-device copies I keep the replay buffer on the GPU: every 1024 environment steps become a chunk,
observations already converted to float32 in [0, 1], appended to a deque sized like DreamerV3's default
replay (5M steps), and training batches are sampled straight from it:

    replay = collections.deque(maxlen=5_000_000 // 1024)              # chunks of 1024 steps
    while env_steps < 10_000_000:
        chunk = collect(env, agent, 1024)                               # dict of GPU tensors
        replay.append({"obs": chunk["obs"].float().div_(255).cuda(), "action": ..., "reward": ...})
        for _ in range(train_ratio):
            batch = sample(replay, batch_size=16, seq_len=64)
            wm_loss = world_model.loss(batch); wm_loss.backward(); wm_opt.step(); wm_opt.zero_grad()

It trains nicely for a few hours, then dies with CUDA out of memory in a world-model update (this time in
wm_loss.backward()), always somewhere after ~450k environment steps.  Same with batch_size 8 (just a little later).

What an expert sees: memory that grows with the replay buffer, chunk after chunk: each chunk is 1024 x
64 x 64 x 3 float32 = 48 MiB on the GPU, and a 5M-step buffer would need ~230 GiB in float32 (58 GiB even
as uint8) -- it can never fit, so the job fails when the buffer reaches what is left of the card after
the models (~21 GiB, ~450 chunks).  The fix: keep the replay buffer in host memory, as uint8 (4x
smaller), and move only each sampled batch to the GPU (pinned memory, non_blocking); DreamerV3 itself
does this.  Shrinking the buffer's capacity to what fits would also stop the crash but hurts the agent.
A smaller batch, mixed precision, checkpointing or a cleared cache only delay it; nothing here is
inference, nor fragmentation or another process.
"""
import collections
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Encoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv2d(3, 96, 4, stride=2, device="cuda")
        self.conv2 = nn.Conv2d(96, 192, 4, stride=2, device="cuda")
        self.conv3 = nn.Conv2d(192, 384, 4, stride=2, device="cuda")
        self.conv4 = nn.Conv2d(384, 768, 4, stride=2, device="cuda")

    def forward(self, obs):
        return self.conv4(self.conv3(self.conv2(self.conv1(obs))))


class RSSM(nn.Module):
    def __init__(self, deter=4096, hidden=1024):
        nn.Module.__init__(self)
        self.gru = nn.Parameter(torch.empty(3 * deter * (deter + hidden) * 4 // 8, device="cuda"))   # block GRU
        self.img_in = nn.Parameter(torch.empty(1024 * hidden * 4, device="cuda"))
        self.obs_out = nn.Parameter(torch.empty((deter + 3072) * hidden * 4, device="cuda"))
        self.deter = deter

    def forward(self, embed, rows):
        states = torch.empty(rows * (self.deter + 1024) * 4 * 3, device="cuda")     # deter, stoch, logits per step
        states._saved = embed
        return states


class Decoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linear = nn.Parameter(torch.empty(5120 * 4 * 4 * 768 * 4, device="cuda"))
        self.deconv = nn.Conv2d(768, 3, 4, device="cuda")

    def forward(self, feat, rows):
        out = torch.empty(rows * 64 * 64 * 3 * 4 * 4, device="cuda")                # upsampling stack, kept
        out._saved = feat
        return out


class WorldModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.encoder = Encoder()
        self.rssm = RSSM()
        self.decoder = Decoder()
        self.reward = nn.Parameter(torch.empty(5120 * 1024 * 4, device="cuda"))
        self.cont = nn.Parameter(torch.empty(5120 * 1024 * 4, device="cuda"))

    def loss(self, batch, batch_size, seq_len):
        rows = batch_size * seq_len
        obs = torch.empty(rows * 64 * 64 * 3 * 4, device="cuda")      # batch["obs"] gathered from the chunks
        embed = self.encoder(obs)
        feat = self.rssm(embed, rows)
        recon = self.decoder(feat, rows)
        loss = torch.empty(512, device="cuda")
        loss._saved = recon
        loss._params = tuple(self.parameters())
        return loss


def collect(steps):
    """env.step() with the current policy; observations from the emulator, uint8 on the host."""
    return {"obs_uint8_host": steps * 64 * 64 * 3}


def main():
    chunk_len, batch_size, seq_len, train_ratio = 1024, 16, 64, 2
    world_model = WorldModel()
    world_model.train()
    wm_opt = torch.optim.AdamW(world_model.parameters(), lr=1e-4, weight_decay=0.0)
    replay = collections.deque(maxlen=5_000_000 // chunk_len)
    env_steps = 0
    while env_steps < 10_000_000:
        chunk = collect(chunk_len)
        replay.append({
            "obs": torch.empty(chunk["obs_uint8_host"] * 4, device="cuda"),   # .float().div_(255).cuda()
            "action": torch.empty(chunk_len * 18 * 4, device="cuda"),
            "reward": torch.empty(chunk_len * 4, device="cuda"),
        })
        env_steps += chunk_len
        for _ in range(train_ratio):
            wm_loss = world_model.loss(replay, batch_size, seq_len)
            scen_truth.backward(wm_loss)
            wm_opt.step()
            wm_opt.zero_grad(set_to_none=True)
            del wm_loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
