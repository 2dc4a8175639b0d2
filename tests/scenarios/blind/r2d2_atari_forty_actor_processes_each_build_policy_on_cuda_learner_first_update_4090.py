"""r2d2.py -- a home-grown R2D2 (recurrent replay distributed DQN) for Atari on a workstation: a
32-core/64-thread Threadripper and one RTX 4090 (24 GB).  It started as a single-process prototype
with one `DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")` in config.py that
every module imports; then the actors were moved into processes, one per two hardware threads:

    # actor.py (started with torch.multiprocessing, 'spawn', NUM_ACTORS = 40)
    def run_actor(actor_id, weights, transitions, ready):
        net = R2D2Net(num_actions).to(DEVICE)          # the policy, for acting
        env = make_atari(...)
        while True:
            q, state = net(obs, state)                  # one frame at a time
            ...
            transitions.put(sequence)                  # to the learner's replay (host memory)

    # learner (the main process)
    online = R2D2Net(num_actions).to(DEVICE); target = copy.deepcopy(online)
    optimizer = torch.optim.Adam(online.parameters(), lr=1e-4, eps=1e-3)
    spawn the actors; wait until the replay holds 50,000 sequences; then train:
        batch = replay.sample(64)                      # 64 sequences x (40 burn-in + 80) frames
        obs = batch.obs.to(DEVICE).float() / 255        # ...

Each actor process opens its own CUDA context on the 4090 (~0.5 GiB) and keeps its copy of the
policy (17 MiB), cuBLAS's workspace and a little cache beside it: ~0.54 GiB each, ~21.6 GiB for the
forty.  The learner's own first update needs ~3 GiB (the float observations and the unrolled CNN/LSTM
activations of 64 x 80 frames) and finds ~1.8 GiB free: it fails at its first training step, after
the replay warm-up (about 40 minutes in).

An expert: the learner is small; the GPU is full of the job's own actor processes, each paying a CUDA
context to run a 4M-parameter network on one frame at a time.  Keep CUDA out of the actors (act on
the CPU: torch.set_num_threads(1) per actor, weights copied from the learner), or run fewer actors
on the GPU, or batch the actors' inference in one GPU process (SEED-RL style).  Wrong first advice:
a smaller learner batch, gradient checkpointing, mixed precision, expandable_segments or
empty_cache (the learner's own cache is small), killing "other processes" as if they were strangers
(they are this job's actors), restarting.
"""
import multiprocessing as mp
import os
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30

# config.py
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
NUM_ACTORS = 40
NUM_ACTIONS = 18
BATCH, BURN_IN, UNROLL = 64, 40, 80
FRAME_BYTES = 4 * 84 * 84                      # a stack of four 84x84 uint8 frames


class R2D2Net(torch.nn.Module):
    """Nature-DQN torso (3 convs + fc 512), LSTM(512) fed the previous action and reward, dueling
    heads: 4.3M params, fp32."""

    def __init__(self, num_actions):
        torch.nn.Module.__init__(self)
        self.torso = torch.nn.Parameter(torch.empty((77_824 + 3136 * 512 + 512) * 4, dtype=torch.uint8,
                                                    device=DEVICE))
        self.lstm = torch.nn.Parameter(torch.empty(4 * 512 * (531 + 512 + 2) * 4, dtype=torch.uint8,
                                                   device=DEVICE))
        self.heads = torch.nn.Parameter(torch.empty((512 * 512 * 2 + 512 * (1 + num_actions)) * 4,
                                                    dtype=torch.uint8, device=DEVICE))
        self._workspace = None

    def forward(self, obs, frames):
        """obs: float observations of `frames` frames (time x batch flattened)."""
        if self._workspace is None:                     # cuBLAS's workspace, made at the first matmul
            self._workspace = torch.empty(8 * MiB + 128 * 1024, dtype=torch.uint8, device=DEVICE)
        t, l, hd = self.torso, self.lstm, self.heads
        h = obs
        for per_frame in (32 * 20 * 20 * 4 * 2,         # conv1 (+ relu)
                          64 * 9 * 9 * 4 * 2,           # conv2
                          64 * 7 * 7 * 4 * 2,           # conv3
                          512 * 4 * 2,                  # fc
                          512 * 4 * 6,                  # LSTM gates and states
                          (512 * 2 + NUM_ACTIONS + 1) * 4 * 2):  # dueling heads
            out = torch.empty(per_frame * frames, dtype=torch.uint8, device=DEVICE)
            if torch.is_grad_enabled():
                out._saved = h
            h = out
        del t, l, hd
        return h


# ---- actor.py ----
def run_actor(actor_id, ready, stop):
    net = R2D2Net(NUM_ACTIONS).to(DEVICE)
    net.eval()
    parent = os.getppid()
    state = torch.empty(2 * 512 * 4, dtype=torch.uint8, device=DEVICE)      # LSTM (h, c)
    with torch.no_grad():
        for step in range(50):                       # acting: one frame per step
            obs = torch.empty(FRAME_BYTES * 4, dtype=torch.uint8, device=DEVICE)
            q = net(obs, 1)
            del obs, q
    ready.put(actor_id)
    while not stop.is_set() and os.getppid() == parent:   # (acts until the learner stops)
        time.sleep(0.05)


# ---- learner.py ----
def learner():
    online = R2D2Net(NUM_ACTIONS).to(DEVICE)
    target = R2D2Net(NUM_ACTIONS).to(DEVICE)              # copy.deepcopy(online)
    optimizer = torch.optim.AdamW(online.parameters(), lr=1e-4, eps=1e-3, weight_decay=0.0)   # = Adam

    ctx = mp.get_context("spawn")
    ready, stop = ctx.Queue(), ctx.Event()
    actors = [ctx.Process(target=run_actor, args=(i, ready, stop), daemon=True) for i in range(NUM_ACTORS)]
    for p in actors:
        p.start()
    for _ in range(NUM_ACTORS):                            # ... replay warm-up: 50,000 sequences
        ready.get(timeout=240)
    print("replay warm: %d actors running; learner has %.2f GiB allocated, %.2f GiB free on the GPU"
          % (NUM_ACTORS, torch.cuda.memory_allocated() / GiB, torch.cuda.mem_get_info()[0] / GiB))
    sys.stdout.flush()

    for update in range(1, 1_000_000):
        frames = BATCH * (BURN_IN + UNROLL)
        raw = torch.empty(frames * FRAME_BYTES, dtype=torch.uint8, device=DEVICE)   # batch.obs.to(DEVICE)
        obs = torch.empty(frames * FRAME_BYTES * 4, dtype=torch.uint8, device=DEVICE)  # .float() / 255
        del raw
        with torch.no_grad():
            burn = online(obs, BATCH * BURN_IN)               # burn-in: recover the LSTM state
            del burn
            tq = target(obs, BATCH * (BURN_IN + UNROLL))      # double-Q targets
        q = online(obs, BATCH * UNROLL)
        loss = torch.empty(512, device=DEVICE)
        loss._saved = q
        loss._params = q._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del q, tq, loss, obs
        if update % 2500 == 0:
            target = online                                   # target.load_state_dict(online.state_dict())
    stop.set()


if __name__ == "__main__":
    scen_truth.note_every_empty(torch)
    try:
        learner()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
