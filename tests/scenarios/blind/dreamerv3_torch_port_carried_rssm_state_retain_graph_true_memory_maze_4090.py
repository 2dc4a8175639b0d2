"""DreamerV3, ported from JAX to PyTorch by hand, trains on Memory Maze 9x9 on one RTX 4090 (24 GB)
and dies at the 11th world-model update after prefill: the latent state carried from one replay chunk to
the next is never detached, and `retain_graph=True` (added to silence an autograd error) keeps the
graph of every chunk trained so far alive.

The real code (a port of danijar/dreamerv3 written in the style of NM512/dreamerv3-torch, the
user's own `agent.py`):

    class Agent(nn.Module):
        def train(self, data):
            data = self.preprocess(data)             # uint8 (32, 64, 64, 64, 3) -> cuda, float
            if self._carry is None:
                self._carry = self.wm.dynamics.initial(len(data["image"]))
            embed = self.wm.encoder(data["image"])
            # JAX: carry, (post, prior) = self.dyn.observe(carry, embed, action, reset)
            carry, post, prior = self.wm.dynamics.observe(
                self._carry, embed, data["action"], data["is_first"])
            ...                                      # decoder, reward, cont, KL losses
            self._wm_opt.zero_grad()
            wm_loss.backward(retain_graph=True)      # <- added after the 2nd update raised
            self._wm_opt.step()
            self._carry = carry                      # <- no .detach()
            self._train_behavior({k: v.detach() for k, v in post.items()})

The replay is DreamerV3's "online"/consecutive sampler: each of the 32 batch rows continues the
episode it read last time, so the port carries the RSSM state (deter, stoch) from the last step of
one chunk into the first step of the next, as the JAX code's `carry` does, and resets it per row
with `is_first` (`v * (1 - is_first)`).  In JAX the carry is a plain array between two jitted
train() calls: nothing differentiates through it.  In PyTorch the carried `deter`/`stoch` are the
last outputs of the chunk's RSSM loop and hold its whole autograd graph (every GRU step, the
posterior layers, and through `embed` the encoder's activations of all 2048 frames).  The 2nd
update therefore raised "Trying to backward through the graph a second time ... Specify
retain_graph=True"; the user did so.  From then on each update's graph hangs on the previous one
through the carry (the `is_first` mask is one more multiplication in the graph, so episode ends
cut nothing), nothing is ever freed, and each backward also runs through every older chunk
(updates get slower, the old encoder activations get gradients again).

Sizes (fp32, the port's default precision; B=32 rows x T=64 steps = 2048 frames of 64x64x3):
  * models: world model ~43M parameters (encoder 0.7M, RSSM deter 4096 / hidden 512 / 32x32
    stoch with an 8-block GRU 15M, decoder 22M, reward and continue heads 6M), actor, critic and
    slow critic ~3M each: weights + grads + AdamW state ~0.8 GB, plus 0.5 GiB of CUDA context;
  * one chunk's graph, what the carry keeps: the float frames (96 MiB), the encoder's saved
    activations (conv 32/64/128/256 channels, each saving conv output, LayerNorm output and SiLU
    output: 768 + 384 + 192 + 96 MiB) and 64 RSSM steps at 32 rows (~7.5 MiB each: the GRU's
    gates, the posterior's [deter, embed] input, masks and samples; ~0.47 GiB): ~1.97 GiB per update;
  * transient per update: decoder ~1.5 GiB plus the reconstruction loss, imagination of 2048
    starts over 15 steps (features 640 MiB, actor and critic activations) ~1.7 GiB.
A single update peaks near 4.9 GiB on the 24 GB card (2.7 GiB stay allocated after it); the leak
adds ~1.97 GiB per update, so after 10 updates the world-model forward of the 11th chunk fails: the
decoder's third transposed convolution (64 -> 32 channels at 32x32) asks for 256 MiB
(2048 x 32 x 32 x 32 floats) with 23.2 GiB allocated by PyTorch, ~19.7 GiB of it the graphs of
the ten chunks already trained, hanging on self._carry.

What an expert says first: this is a leak across iterations, not a model that does not fit.
Detach the carry (`self._carry = {k: v.detach() for k, v in carry.items()}`, which is what
NM512/dreamerv3-torch does with its `post`), and remove `retain_graph=True`; then memory is flat
at ~5 GB.  Wrong advice: a smaller batch_size / batch_length, gradient checkpointing or the port's
`precision: 16` (they only move the crash a few updates later), empty_cache or
expandable_segments (nothing is cached, the graphs are alive), a bigger card (an 80 GB one dies
at update ~38), moving the replay buffer off the GPU (it already lives on the CPU).
"""
import functools
import operator
import random

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda:0"
F32 = torch.float32


class Config(object):
    """configs.yaml: defaults + memorymaze + size50m, as the port reads it."""
    task = "memorymaze_9x9"
    envs = 8
    num_actions = 6
    image_size = 64
    batch_size = 32
    batch_length = 64
    train_ratio = 512
    prefill = 5000
    steps = 10_000_000
    log_every = 5
    cnn_depth = 32
    cnn_stages = 4
    dyn_deter = 4096
    dyn_hidden = 512
    dyn_stoch = 32
    dyn_discrete = 32
    gru_blocks = 8
    mlp_units = 512
    reward_bins = 255
    imag_horizon = 15
    model_lr = 1e-4
    actor_lr = 3e-5
    critic_lr = 3e-5


def numel(*shape):
    return functools.reduce(operator.mul, shape, 1)


# ---------------------------------------------------------------------------------------------
# torch ops and nn layers the port uses that the stand-in torch lacks (torch.cat, x * m, softmax,
# nn.Linear + LayerNorm + SiLU, the block GRU, nn.ConvTranspose2d): each makes the tensors PyTorch
# makes, keeps for backward what autograd keeps (only with autograd on), and is in its inputs' graph.

def _saves(out, *inputs):
    if torch.is_grad_enabled():
        out._saved = inputs if len(inputs) > 1 else inputs[0]
    return torch._derive(out, *inputs)


def cat(tensors):
    out = torch.empty(sum(t.nbytes for t in tensors) // 4, dtype=F32, device=DEVICE)
    return _saves(out, *tensors)


def mask(x, keep):
    """x * (1.0 - is_first): a new tensor of x's size."""
    return _saves(torch.empty(x.nbytes // 4, dtype=F32, device=DEVICE), x, keep)


def stack(tensors):
    out = torch.empty(sum(t.nbytes for t in tensors) // 4, dtype=F32, device=DEVICE)
    return _saves(out, *tensors)


def time_step(x, t, steps):
    """x[:, t]: a view of one time step of a (B, T, ...) tensor."""
    v = x.view()
    v.nbytes = x.nbytes // steps
    return v


class Linear(nn.Module):
    """DreamerV3's Linear: nn.Linear(fin, fout), then LayerNorm and SiLU when norm=True; with autograd
    on it keeps the linear and LayerNorm outputs for backward (one workspace here)."""

    def __init__(self, fin, fout, norm=True):
        super().__init__()
        self.fin, self.fout, self.norm = fin, fout, norm
        self.weight = nn.Parameter(torch.empty(fin * fout, dtype=F32, device=DEVICE))
        self.bias = nn.Parameter(torch.empty(fout, dtype=F32, device=DEVICE))
        if norm:
            self.scale = nn.Parameter(torch.empty(fout, dtype=F32, device=DEVICE))

    def forward(self, x):
        rows = x.nbytes // (4 * self.fin)
        out = torch.empty(rows * self.fout, dtype=F32, device=DEVICE)
        if self.norm and torch.is_grad_enabled():
            out._saved = (x, torch.empty(2 * rows * self.fout, dtype=F32, device=DEVICE))
        elif torch.is_grad_enabled():
            out._saved = x
        return out


class BlockGRU(nn.Module):
    """DreamerV3's GRU core: a block-diagonal linear on [x, deter] -> 3 * deter gates, LayerNorm,
    sigmoid/tanh gates; with autograd on it keeps the concatenated input, gates, normed gates and the
    gate activations (~9 x deter per row)."""

    def __init__(self, hidden, deter, blocks):
        super().__init__()
        self.hidden, self.deter = hidden, deter
        self.weight = nn.Parameter(torch.empty((hidden + deter) * 3 * deter // blocks, dtype=F32, device=DEVICE))
        self.bias = nn.Parameter(torch.empty(3 * deter, dtype=F32, device=DEVICE))
        self.scale = nn.Parameter(torch.empty(3 * deter, dtype=F32, device=DEVICE))

    def forward(self, x, deter):
        rows = deter.nbytes // (4 * self.deter)
        parts = torch.empty(rows * (self.hidden + 9 * self.deter), dtype=F32, device=DEVICE)
        new = torch.empty(rows * self.deter, dtype=F32, device=DEVICE)
        if torch.is_grad_enabled():
            new._saved = (x, deter, parts)
        return new


class ConvTranspose2d(nn.Module):
    """nn.ConvTranspose2d(cin, cout, 4, stride 2): the output is the input's bytes x cout/cin x 4."""

    def __init__(self, cin, cout, kernel=4, stride=2):
        super().__init__()
        self.cin, self.cout, self.stride = cin, cout, stride
        self.weight = nn.Parameter(torch.empty(cin * cout * kernel * kernel, dtype=F32, device=DEVICE))

    def forward(self, x):
        out = torch.empty(x.nbytes // 4 * self.cout // self.cin * self.stride ** 2, dtype=F32, device=DEVICE)
        if torch.is_grad_enabled():
            out._saved = x
        return out


class ChannelNormAct(nn.Module):
    """LayerNorm over channels, then SiLU: two new tensors of the input's size, both kept."""

    def __init__(self, channels):
        super().__init__()
        self.scale = nn.Parameter(torch.empty(channels, dtype=F32, device=DEVICE))
        self.shift = nn.Parameter(torch.empty(channels, dtype=F32, device=DEVICE))

    def forward(self, x):
        normed = torch.empty(x.nbytes // 4, dtype=F32, device=DEVICE)
        act = torch.empty(x.nbytes // 4, dtype=F32, device=DEVICE)
        if torch.is_grad_enabled():
            normed._saved = x
            act._saved = normed
        return act


def straight_through_sample(logits):
    """OneHotDist(logits=...).rsample(): sample + probs - probs.detach() (unimix 1%)."""
    probs = _saves(torch.empty(logits.nbytes // 4, dtype=F32, device=DEVICE), logits)
    return _saves(torch.empty(logits.nbytes // 4, dtype=F32, device=DEVICE), probs)


# ---------------------------------------------------------------------------------------------
# networks.py

class ConvEncoder(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        chans = [3] + [cfg.cnn_depth * 2 ** i for i in range(cfg.cnn_stages)]
        self.stages = cfg.cnn_stages
        for i in range(cfg.cnn_stages):
            setattr(self, "conv%d" % i, nn.Conv2d(chans[i], chans[i + 1], 4, stride=2, device=DEVICE))
            setattr(self, "norm%d" % i, ChannelNormAct(chans[i + 1]))
        self.outdim = chans[-1] * (cfg.image_size // 2 ** cfg.cnn_stages) ** 2

    def forward(self, obs):
        x = obs
        for i in range(self.stages):
            x = getattr(self, "conv%d" % i)(x)
            x = getattr(self, "norm%d" % i)(x)
        return x.view()                       # (B, T, 4096)


class ConvDecoder(nn.Module):
    def __init__(self, cfg, feat_size):
        super().__init__()
        top = cfg.cnn_depth * 2 ** (cfg.cnn_stages - 1)
        self.linear = Linear(feat_size, top * 4 * 4, norm=False)
        chans = [top // 2 ** i for i in range(cfg.cnn_stages)] + [3]
        self.stages = cfg.cnn_stages
        for i in range(cfg.cnn_stages):
            setattr(self, "deconv%d" % i, ConvTranspose2d(chans[i], chans[i + 1]))
            if i < cfg.cnn_stages - 1:
                setattr(self, "norm%d" % i, ChannelNormAct(chans[i + 1]))

    def forward(self, feat):
        x = self.linear(feat)
        for i in range(self.stages):
            x = getattr(self, "deconv%d" % i)(x)
            if i < self.stages - 1:
                x = getattr(self, "norm%d" % i)(x)
        return x                               # mean of the image distribution


class MLPHead(nn.Module):
    def __init__(self, fin, units, out, layers=2):
        super().__init__()
        self.layer0 = Linear(fin, units)
        self.layer1 = Linear(units, units)
        self.out = Linear(units, out, norm=False)

    def forward(self, x):
        return self.out(self.layer1(self.layer0(x)))


class RSSM(nn.Module):
    def __init__(self, cfg, embed_size):
        super().__init__()
        self.deter, self.hidden = cfg.dyn_deter, cfg.dyn_hidden
        self.stoch = cfg.dyn_stoch * cfg.dyn_discrete
        self.num_actions = cfg.num_actions
        self.batch_length = cfg.batch_length
        self.img_in = Linear(self.stoch + cfg.num_actions, self.hidden)
        self.gru = BlockGRU(self.hidden, self.deter, cfg.gru_blocks)
        self.img_out = Linear(self.deter, self.hidden)
        self.img_logits = Linear(self.hidden, self.stoch, norm=False)
        self.obs_out = Linear(self.deter + embed_size, self.hidden)
        self.obs_logits = Linear(self.hidden, self.stoch, norm=False)

    def initial(self, batch_size):
        return {"deter": torch.empty(batch_size * self.deter, dtype=F32, device=DEVICE),
                "stoch": torch.empty(batch_size * self.stoch, dtype=F32, device=DEVICE)}

    def img_step(self, prev, action):
        x = self.img_in(cat([prev["stoch"], action]))
        deter = self.gru(x, prev["deter"])
        logits = self.img_logits(self.img_out(deter))
        return {"deter": deter, "logits": logits}

    def obs_step(self, prev, action, embed, is_first):
        keep = is_first                                   # 1.0 - is_first, (B, 1)
        prev = {k: mask(v, keep) for k, v in prev.items()}
        prior = self.img_step(prev, action)
        x = self.obs_out(cat([prior["deter"], embed]))
        logits = self.obs_logits(x)
        post = {"deter": prior["deter"], "stoch": straight_through_sample(logits), "logits": logits}
        return post, prior

    def observe(self, carry, embed, action, is_first):
        """carry, (post, prior) = observe(carry, embed, action, is_first), as the JAX RSSM's scan."""
        steps = self.batch_length
        posts, priors = [], []
        for t in range(steps):
            carry, prior = self.obs_step(carry, time_step(action, t, steps), time_step(embed, t, steps),
                                         time_step(is_first, t, steps))
            posts.append(carry)
            priors.append(prior)
        post = {k: stack([p[k] for p in posts]) for k in ("deter", "stoch", "logits")}
        prior = {"logits": stack([p["logits"] for p in priors])}
        return {"deter": carry["deter"], "stoch": carry["stoch"]}, post, prior

    def imagine_step(self, state, action):
        prior = self.img_step(state, action)
        return {"deter": prior["deter"], "stoch": straight_through_sample(prior["logits"])}

    def get_feat(self, state):
        return cat([state["deter"], state["stoch"]])


class WorldModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.encoder = ConvEncoder(cfg)
        self.dynamics = RSSM(cfg, self.encoder.outdim)
        feat = cfg.dyn_deter + cfg.dyn_stoch * cfg.dyn_discrete
        self.decoder = ConvDecoder(cfg, feat)
        self.reward = MLPHead(feat, cfg.mlp_units, cfg.reward_bins)
        self.cont = MLPHead(feat, cfg.mlp_units, 1)
        self.feat_size = feat


def mse_loss(pred, target):
    diff = _saves(torch.empty(pred.nbytes // 4, dtype=F32, device=DEVICE), pred, target)
    sq = _saves(torch.empty(pred.nbytes // 4, dtype=F32, device=DEVICE), diff)
    return _saves(torch.empty(1, dtype=F32, device=DEVICE), sq)


def kl_loss(post_logits, prior_logits):
    lp = F.log_softmax(post_logits)
    lq = F.log_softmax(prior_logits)
    return _saves(torch.empty(1, dtype=F32, device=DEVICE), lp, lq)


def total(losses):
    return _saves(torch.empty(1, dtype=F32, device=DEVICE), *losses)


# ---------------------------------------------------------------------------------------------
# replay.py / envs: the replay lives in host memory (numpy chunks), the envs are CPU processes

class HostArray(object):
    """A numpy array of the replay (host memory): its shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype


class Replay(object):
    """Uniform replay over stored episodes; "online" sampling keeps each batch row on its episode,
    consecutive chunks, as DreamerV3 does with replay_context."""

    def __init__(self, cfg, capacity=1_000_000):
        self.cfg, self.capacity, self.size = cfg, capacity, 0
        self.cursors = [0] * cfg.batch_size

    def add(self, n):
        self.size = min(self.capacity, self.size + n)

    def sample(self):
        c = self.cfg
        self.cursors = [(x + c.batch_length) % 1000 for x in self.cursors]
        return {"image": HostArray((c.batch_size, c.batch_length, c.image_size, c.image_size, 3), torch.uint8),
                "action": HostArray((c.batch_size, c.batch_length, c.num_actions), F32),
                "reward": HostArray((c.batch_size, c.batch_length), F32),
                "is_first": HostArray((c.batch_size, c.batch_length), F32),
                "is_terminal": HostArray((c.batch_size, c.batch_length), F32)}


class MemoryMazeVecEnv(object):
    def __init__(self, cfg):
        self.num = cfg.envs
        self.cfg = cfg

    def step(self, actions):
        c = self.cfg
        return {"image": HostArray((self.num, c.image_size, c.image_size, 3), torch.uint8),
                "is_first": HostArray((self.num,), F32)}


def to_device(arr):
    """torch.as_tensor(arr, device="cuda")"""
    return torch.empty(numel(*arr.shape), dtype=arr.dtype, device=DEVICE)


def to_float(x):
    """x.float() / 255.0 - 0.5"""
    return torch.empty(x.nbytes, dtype=F32, device=DEVICE)


# ---------------------------------------------------------------------------------------------
# agent.py

class Agent(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        self.wm = WorldModel(cfg)
        self.actor = MLPHead(self.wm.feat_size, cfg.mlp_units, cfg.num_actions)
        self.critic = MLPHead(self.wm.feat_size, cfg.mlp_units, cfg.reward_bins)
        self.slow_critic = MLPHead(self.wm.feat_size, cfg.mlp_units, cfg.reward_bins)
        self._wm_opt = torch.optim.AdamW(self.wm.parameters(), lr=cfg.model_lr, eps=1e-8, weight_decay=0.0)
        self._actor_opt = torch.optim.AdamW(self.actor.parameters(), lr=cfg.actor_lr, eps=1e-5, weight_decay=0.0)
        self._critic_opt = torch.optim.AdamW(self.critic.parameters(), lr=cfg.critic_lr, eps=1e-5, weight_decay=0.0)
        self._carry = None
        self._updates = 0

    def preprocess(self, data):
        data = {k: to_device(v) for k, v in data.items()}
        data["image"] = to_float(data["image"])
        return data

    def policy(self, obs, state):
        with torch.no_grad():
            image = to_float(to_device(obs["image"]))
            embed = self.wm.encoder(image)
            if state is None:
                state = self.wm.dynamics.initial(self.cfg.envs)
                action = torch.empty(self.cfg.envs * self.cfg.num_actions, dtype=F32, device=DEVICE)
            else:
                state, action = state
            is_first = to_device(obs["is_first"])
            post, _ = self.wm.dynamics.obs_step(state, action, embed, is_first)
            logits = self.actor(self.wm.dynamics.get_feat(post))
            action = straight_through_sample(logits)
        return action, ({"deter": post["deter"], "stoch": post["stoch"]}, action)

    def train(self, data):
        data = self.preprocess(data)
        if self._carry is None:
            self._carry = self.wm.dynamics.initial(self.cfg.batch_size)
        post = self._train_world_model(data)
        self._train_behavior({k: v.detach() for k, v in post.items()})
        self._updates += 1

    def _train_world_model(self, data):
        wm = self.wm
        embed = wm.encoder(data["image"])
        carry, post, prior = wm.dynamics.observe(self._carry, embed, data["action"], data["is_first"])
        feat = wm.dynamics.get_feat(post)
        recon = wm.decoder(feat)
        losses = [mse_loss(recon, data["image"]),
                  F.log_softmax(wm.reward(feat)),
                  F.log_softmax(wm.cont(feat)),
                  kl_loss(post["logits"], prior["logits"])]
        wm_loss = total(losses)
        self._wm_opt.zero_grad()
        wm_loss.backward(retain_graph=True)
        self._wm_opt.step()
        self._carry = carry
        return post

    def _train_behavior(self, start):
        cfg, dyn = self.cfg, self.wm.dynamics
        feats, actions = [], []
        with torch.no_grad():
            state = {"deter": start["deter"], "stoch": start["stoch"]}
            for _ in range(cfg.imag_horizon):
                feat = dyn.get_feat(state)
                action = straight_through_sample(self.actor(feat))
                feats.append(feat)
                actions.append(action)
                state = dyn.imagine_step(state, action)
            feats.append(dyn.get_feat(state))
            imag_feat = stack(feats)
            slow_value = self.slow_critic(imag_feat)
        policy = F.log_softmax(self.actor(imag_feat))
        actor_loss = total([policy])
        self._actor_opt.zero_grad()
        actor_loss.backward()
        self._actor_opt.step()
        value = F.log_softmax(self.critic(imag_feat))
        critic_loss = total([value])
        self._critic_opt.zero_grad()
        critic_loss.backward()
        self._critic_opt.step()
        update_slow_critic(self.critic, self.slow_critic, mix=0.02)


def update_slow_critic(critic, slow, mix):
    """for s, d in zip(critic.parameters(), slow.parameters()): d.data.lerp_(s.data, mix) -- in place."""
    for s, d in zip(critic.parameters(), slow.parameters()):
        pass


def main():
    cfg = Config()
    random.seed(0)
    envs = MemoryMazeVecEnv(cfg)
    replay = Replay(cfg)
    agent = Agent(cfg)
    replay.add(cfg.prefill)                          # random-policy prefill, CPU only
    step, state, debt = cfg.prefill, None, 0.0
    obs = envs.step(None)
    replayed_per_update = cfg.batch_size * cfg.batch_length
    while step < cfg.steps:
        action, state = agent.policy(obs, state)
        obs = envs.step(action)
        replay.add(envs.num)
        step += envs.num
        debt += envs.num * cfg.train_ratio / replayed_per_update
        while debt >= 1:
            agent.train(replay.sample())
            debt -= 1
            if agent._updates % cfg.log_every == 0:
                print("step %d update %d" % (step, agent._updates), flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
