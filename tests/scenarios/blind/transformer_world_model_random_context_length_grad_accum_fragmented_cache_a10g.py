"""A transformer world model (IRIS-style: a frozen VQ tokenizer turns each 64x64 camera frame into 16 codes,
the world model is a GPT over 17 tokens per frame -- 16 observation codes + 1 action token -- that predicts
the next frame's codes, the reward and the episode end) trained from the replay buffer of a robot
pick-and-place task, on an AWS g5 instance: one A10G (22.5 GiB).  8 layers, d_model 1024, 16 heads, eager
attention (the score matrices are materialized), AdamW.  To make the model work with short histories at
deployment the trainer samples the context length of every micro-batch uniformly between 4 and 24 frames
(68 to 408 tokens), and it accumulates gradients over 4 micro-batches of 80 segments:

    for step in range(num_steps):
        for _ in range(grad_acc_steps):
            num_frames = rng.randint(4, 24)
            batch = replay.sample(batch_size=80, num_frames=num_frames)       # tokens to the GPU
            loss = world_model.compute_loss(batch) / grad_acc_steps
            loss.backward()
        optimizer.step()
        optimizer.zero_grad()

What happens: a micro-batch's activations grow with the square of its context: at 24 frames (408 tokens)
each layer keeps q/k/v (80 x 408 x 3072 x 4 B = 383 MiB), the attention probabilities (80 x 16 x 408^2 x
4 B = 813 MiB), the attention output (128 MiB), the MLP's hidden layer (510 MiB) and its output: about
15.3 GiB over the 8 layers; at 4 frames (68 tokens) 1.7 GiB.  Weights, gradients and AdamW state of the
102 M parameters are 1.5 GiB; the whole job peaks at 17 GiB of tensors (+0.5 GiB context) on a 22.5 GiB
card: it fits.  But every micro-batch asks for blocks of other sizes, and the gradients (made by the first
micro-batch's backward in the holes between its activations, then kept through the next three
micro-batches) and the AdamW state (made at the first step in the same way) sit inside the cached segments
of earlier, differently sized passes: the freed blocks around them cannot be merged or returned.  At step 21 a 24-frame micro-batch asks for an
attention-probability block of 813 MiB: 480 MiB are free on the device, 6.1 GiB are reserved by PyTorch but
unallocated -- in pieces, none of 813 MiB -- and 15.4 GiB are allocated.  The OOM's own retry frees only
whole segments and fails again.

What an expert says first: fragmentation.  The request (0.8 GiB) is far smaller than what the allocator
holds unused (6.1 GiB); the job's tensors need ~17 GiB of the 22.5.  Set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (one growing segment per stream, mapped in 2 MiB pages:
freed pages are reused whatever the next size is).  Bucketing the context lengths (a few fixed lengths)
would also help.  Wrong advice: a bigger GPU, a smaller batch or gradient checkpointing as the first fix
(the tensors fit; the cache's layout is what fails), empty_cache() in the loop (the holes are in segments
that still hold live blocks: it returns nothing useful, and costs a cudaMalloc per block afterwards),
closing other processes (there are none), quantization.
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)


class WorldModelConfig(object):
    tokens_per_frame = 17          # 16 VQ codes + 1 action token
    max_frames = 24
    min_frames = 4
    embed_dim = 1024
    num_layers = 8
    num_heads = 16
    obs_vocab_size = 512
    act_vocab_size = 16


class TrainConfig(object):
    batch_size = 80
    grad_acc_steps = 4
    learning_rate = 1e-4
    num_steps = 200000
    seed = 4


# --- what the CUDA kernels of the real code allocate (the stand-in torch computes nothing) ---------------
def _out(numel, like, *inputs, saves=None, dtype=torch.float32):
    out = torch.empty(numel, dtype=dtype, device=like.device)
    if saves is not None and torch.is_grad_enabled():
        out._saved = saves
    return torch._derive(out, *inputs)


def backward(loss):
    """loss.backward() and what PyTorch then does to the graph (retain_graph=False): the tensors its
    nodes saved are freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if x is not None)


class ModuleList(nn.Module):
    """nn.ModuleList: children under "0" ... "n-1"."""

    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        self._len = len(modules)

    def __iter__(self):
        return (getattr(self, str(i)) for i in range(self._len))


class SelfAttention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.embed_dim
        self.num_heads = cfg.num_heads
        self.qkv = nn.Parameter(torch.empty(3 * d * d, dtype=torch.float32))
        self.proj = nn.Parameter(torch.empty(d * d, dtype=torch.float32))

    def forward(self, x, b, t, d):
        qkv = _out(b * t * 3 * d, x, x, self.qkv, saves=x)
        att = _out(b * self.num_heads * t * t, qkv, qkv, saves=qkv)   # softmax(q @ k^T / sqrt(d) + mask)
        return _out(b * t * d, att, att, qkv, self.proj, saves=(att, qkv, x))


class MLP(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        d = cfg.embed_dim
        self.fc1 = nn.Parameter(torch.empty(4 * d * d, dtype=torch.float32))
        self.fc2 = nn.Parameter(torch.empty(4 * d * d, dtype=torch.float32))

    def forward(self, x, b, t, d):
        h = _out(b * t * 4 * d, x, x, self.fc1, saves=x)           # gelu(fc1(ln_2(x)))
        return _out(b * t * d, h, h, self.fc2, saves=h)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.attn = SelfAttention(cfg)
        self.mlp = MLP(cfg)

    def forward(self, x, b, t, d):
        x = self.attn(x, b, t, d)
        return self.mlp(x, b, t, d)


class WorldModel(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.cfg = cfg
        d = cfg.embed_dim
        self.embedder = nn.Parameter(torch.empty((cfg.obs_vocab_size + cfg.act_vocab_size) * d, dtype=torch.float32))
        self.pos_emb = nn.Parameter(torch.empty(cfg.max_frames * cfg.tokens_per_frame * d, dtype=torch.float32))
        self.blocks = ModuleList([Block(cfg) for _ in range(cfg.num_layers)])
        self.head_observations = nn.Parameter(torch.empty(d * cfg.obs_vocab_size, dtype=torch.float32))

    def forward(self, tokens, b, num_frames):
        t = num_frames * self.cfg.tokens_per_frame
        d = self.cfg.embed_dim
        x = _out(b * t * d, tokens, tokens, self.embedder, saves=tokens)
        for block in self.blocks:
            x = block(x, b, t, d)
        return _out(b * t * self.cfg.obs_vocab_size, x, x, self.head_observations, saves=x)

    def compute_loss(self, batch):
        logits_observations = self(batch["tokens"], batch["batch_size"], batch["num_frames"])
        return _out(1, logits_observations, logits_observations, saves=logits_observations)   # cross-entropy


class ReplayBuffer(object):
    """Episodes kept in host memory, already tokenized by the frozen VQ tokenizer; sample() cuts segments
    of num_frames frames and moves their tokens to the GPU."""

    def __init__(self, cfg, device):
        self.cfg = cfg
        self.device = device

    def sample(self, batch_size, num_frames):
        t = num_frames * self.cfg.tokens_per_frame
        tokens = torch.empty(batch_size * t, dtype=torch.float64, device=self.device)   # int64 ids
        return {"tokens": tokens, "batch_size": batch_size, "num_frames": num_frames}


class Trainer(object):
    def __init__(self, cfg, train_cfg, device="cuda:0"):
        self.cfg, self.train_cfg = cfg, train_cfg
        self.world_model = WorldModel(cfg)
        self.optimizer = torch.optim.AdamW(self.world_model.parameters(), lr=train_cfg.learning_rate)
        self.replay = ReplayBuffer(cfg, device)
        self.rng = random.Random(train_cfg.seed)

    def train_world_model(self):
        tc = self.train_cfg
        for step in range(tc.num_steps):
            for _ in range(tc.grad_acc_steps):
                num_frames = self.rng.randint(self.cfg.min_frames, self.cfg.max_frames)
                batch = self.replay.sample(batch_size=tc.batch_size, num_frames=num_frames)
                loss = self.world_model.compute_loss(batch)
                backward(loss)
                del loss, batch
            self.optimizer.step()
            self.optimizer.zero_grad()


def main():
    torch.cuda.set_device(0)
    trainer = Trainer(WorldModelConfig(), TrainConfig())
    trainer.train_world_model()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
