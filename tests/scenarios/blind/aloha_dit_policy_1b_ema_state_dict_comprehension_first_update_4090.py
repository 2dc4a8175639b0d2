"""train_policy.py -- a robotics lab fine-tunes its 1.1B-parameter diffusion-transformer visuomotor policy
(26 DiT blocks, width 1536, three ResNet-18 camera encoders; fp32 master weights 4.2 GiB) on bimanual
ALOHA demonstrations, on one RTX 4090 (24 GB) under a desk.  bf16 autocast, AdamW (8.5 GiB of moments),
batch 32 of 64-step action chunks, and an EMA of the weights (decay 0.9999, fp32, 4.2 GiB) because the
EMA policy is the one that gets rolled out on the robot.  The EMA helper is the lab's own:

    ema_policy = copy.deepcopy(policy).eval()
    @torch.no_grad()
    def update_ema(ema_model, model, decay):
        ema_state = ema_model.state_dict()
        new_state = {k: decay * ema_state[k] + (1.0 - decay) * v for k, v in model.state_dict().items()}
        ema_model.load_state_dict(new_state)

    for step, batch in enumerate(loader):
        optimizer.zero_grad(set_to_none=True)          # the tutorial's order: gradients live until here
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = policy.compute_loss(batch)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        update_ema(ema_policy, policy, 0.9999)

The forward, the backward and the first AdamW step of step 1 all go through (weights + gradients + EMA
+ moments = 21.5 GiB with the batch; the 3 GiB of camera-encoder activations are gone by then, their
blocks cached).  The EMA update then builds `new_state`, a complete second EMA (4.2 GiB) beside the one
it replaces, while the gradients are still alive: it dies 1.3 GiB in, at block 8 of 26, in
`decay * ema_state[k] + ...`, autograd off (the 0.6 GiB the cache still holds is in pieces, and would not
hold the remaining 2.9 GiB anyway).

An expert: the phase decides.  This is the EMA update after the step, not the forward: activations are
freed, so the batch size, the chunk length and checkpointing are irrelevant.  Update the EMA in place
(`ema_p.lerp_(p, 1 - decay)`, or `torch._foreach_lerp_(ema_params, params, 1 - decay)`, or diffusers'
EMAModel / timm's ModelEmaV3, which do that): no second copy, and 21.2 GiB fits the card.  (Calling
zero_grad before the EMA update would also fit, narrowly; keeping the EMA on the CPU costs 4 GiB of
transfers per step.)  Wrong first advice: a smaller batch, gradient checkpointing, expandable_segments /
empty_cache (the live tensors do not fit), inference_mode (autograd is already off), a bigger GPU.
"""
import copy
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
WIDTH = 1536
DEPTH = 26
BATCH_SIZE = 32
CAMERAS = 3


# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
def _named_parameters(self, prefix=""):
    """Module.named_parameters() with PyTorch's dotted names (blocks.3.attn.qkv.weight)."""
    seen = []
    todo = [(prefix, self)]
    while todo:
        pre, m = todo.pop()
        for k, p in m._parameters.items():
            if p is not None and all(p is not q for q in seen):
                seen.append(p)
                yield pre + k, p
        todo.extend(reversed([(pre + name + ".", sub) for name, sub in m._modules.items()]))


def _state_dict(self):
    """Module.state_dict(): the parameters by dotted name (PyTorch gives detached tensors sharing them)."""
    import collections
    return collections.OrderedDict((k, p.detach()) for k, p in _named_parameters(self))


def _scale(self, s):
    """s * tensor: a new tensor of the same size (in the graph only when autograd records)."""
    return torch._derive(torch.empty_like(self), self)


def _add(a, b):
    return torch._derive(torch.empty_like(a), a, b)


def _decorate(self, fn):
    """@torch.no_grad() used as a decorator."""
    mode = self

    def wrapper(*args, **kwargs):
        with mode:
            return fn(*args, **kwargs)
    return wrapper


_autograd_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """loss.backward(): the gradients, then (retain_graph=False) what the graph saved is freed."""
    _autograd_backward(self, gradient, retain_graph, create_graph, inputs)
    todo = [self]
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor) and t.__dict__.get("_saved") is not None:
            todo.append(t._saved)
            t._saved = None


torch.Tensor.backward = _backward
torch.no_grad.__call__ = _decorate
torch.nn.Module.named_parameters = _named_parameters
torch.nn.Module.state_dict = _state_dict
torch.Tensor.__rmul__ = _scale
torch.Tensor.__mul__ = _scale
torch.Tensor.__add__ = _add


def clip_grad_norm_(parameters, max_norm):
    """torch.nn.utils.clip_grad_norm_: a norm per gradient (small), scaled in place."""
    return 1.0


# -- the policy ------------------------------------------------------------------------------------------
class Linear(torch.nn.Module):
    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(fout * 4, device="cuda"))
        self.fout = fout

    def forward(self, x, tokens):
        out = torch.empty(tokens * self.fout * 2, device="cuda")          # bf16 under autocast
        out._saved = x
        return out


class DiTBlock(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.adaLN_modulation = Linear(d, 6 * d)
        self.qkv = Linear(d, 3 * d)
        self.proj = Linear(d, d)
        self.fc1 = Linear(d, 4 * d)
        self.fc2 = Linear(4 * d, d)

    def forward(self, x, c, tokens):
        mod = self.adaLN_modulation(c, BATCH_SIZE)
        h = self.proj(self.qkv(x, tokens), tokens)
        h = self.fc2(self.fc1(h, tokens), tokens)
        h._saved = (x, h._saved, mod)
        return h


class ResNet18(torch.nn.Module):
    """A camera encoder: 11.7M parameters; ~32 MiB of bf16 activations kept per 240x320 frame."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(4):
            setattr(self, "layer%d" % (i + 1), torch.nn.Parameter(torch.empty(2_925_000 * 4, device="cuda")))

    def forward(self, frames, n_frames):
        h = frames
        for i in range(8):                                       # stem + 4 stages x 2 blocks (simplified)
            a = torch.empty(n_frames * 4 * MiB, device="cuda")
            a._saved = h
            h = a
        feat = torch.empty(n_frames * 512 * 2, device="cuda")
        feat._saved = h
        return feat


class DiffusionTransformerPolicy(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for cam in range(CAMERAS):
            setattr(self, "obs_encoder_%d" % cam, ResNet18())
        self.action_in = Linear(14, WIDTH)
        self.cond_proj = Linear(CAMERAS * 512 + 14, WIDTH)
        for i in range(DEPTH):
            setattr(self, "block_%d" % i, DiTBlock(WIDTH))
        self.action_out = Linear(WIDTH, 14)

    def compute_loss(self, batch):
        return self(batch)

    def forward(self, batch):
        feats = [getattr(self, "obs_encoder_%d" % cam)(batch["images"][cam], BATCH_SIZE)
                 for cam in range(CAMERAS)]
        tokens = BATCH_SIZE * 65                                   # 64 noisy actions + the timestep
        c = self.cond_proj(batch["qpos"], BATCH_SIZE)
        c._saved = (c._saved, feats)
        x = self.action_in(batch["noisy_actions"], tokens)
        for i in range(DEPTH):
            x = getattr(self, "block_%d" % i)(x, c, tokens)
        pred = self.action_out(x, tokens)
        loss = torch.empty(512, device="cuda")                     # MSE against the noise
        loss._saved = pred
        return loss


@torch.no_grad()
def update_ema(ema_model, model, decay):
    ema_state = ema_model.state_dict()
    new_state = {k: decay * ema_state[k] + (1.0 - decay) * v for k, v in model.state_dict().items()}
    ema_model.load_state_dict(new_state)


def aloha_episodes(n):
    for _ in range(n):
        yield {"images": [torch.empty(BATCH_SIZE * 3 * 240 * 320 * 2, device="cuda") for _ in range(CAMERAS)],
               "qpos": torch.empty(BATCH_SIZE * 14 * 4, device="cuda"),
               "noisy_actions": torch.empty(BATCH_SIZE * 64 * 14 * 4, device="cuda")}


def main():
    policy = DiffusionTransformerPolicy().cuda()
    policy.train()
    ema_policy = copy.deepcopy(policy).eval()
    for p in ema_policy.parameters():
        p.requires_grad_(False)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-4, weight_decay=1e-6)
    n_params = sum(p.nbytes for p in policy.parameters()) // 4
    print("policy parameters: %.2fB" % (n_params / 1e9))
    for step, batch in enumerate(aloha_episodes(200_000)):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = policy.compute_loss(batch)
        loss.backward()
        clip_grad_norm_(policy.parameters(), 1.0)
        optimizer.step()
        print("step %d: after optimizer.step allocated %.1f GiB" % (step, torch.cuda.memory_allocated() / 2**30))
        update_ema(ema_policy, policy, 0.9999)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
