"""cl_daemon.py -- a grocery chain's shelf-recognition model learns each week's new SKUs and packaging without
forgetting the old ones: continual learning with Avalanche's GEM (Gradient Episodic Memory), in a daemon that
stays up between weeks on an on-prem NVIDIA RTX A5000 (24 GB, 24,564 MiB), because the plugin's episodic
memory and the strategy's state live in the process.  The model is a ViT-B/16 with a 4,096-SKU head (88.9M
parameters, float32 weights, bf16 autocast), SGD with momentum; each Monday the week's labelled crops become a
new experience:

    strategy = GEM(model, SGD(model.parameters(), lr=0.01, momentum=0.9), CrossEntropyLoss(),
                   patterns_per_exp=64, memory_strength=0.5, train_mb_size=64, train_epochs=1, device="cuda")
    for experience in weekly_stream():                # blocks until Monday's batch is labelled
        strategy.train(experience)

Avalanche's GEMPlugin, before every training iteration, computes one gradient per past experience on its
episodic memory and stacks them into the constraint matrix G [experiences, parameters]:

    G = []
    for t in range(strategy.clock.train_exp_counter):
        ...; loss.backward()
        G.append(torch.cat([p.grad.flatten() for p in strategy.model.parameters()], dim=0))
    self.G = torch.stack(G)                           # (experiences, parameters)

One row is the size of the model (339 MiB), and while the new G is built the old one is still alive, so the
peak holds three copies: the previous self.G, the list and the stack.  It ran every week since January; in week
20 (19 past experiences) the first iteration failed at torch.stack: a 6.3 GiB request with 6.0 GiB free, the
previous G (18 rows, 6.0 GiB) and the list's 19 rows (6.3 GiB) already on the card, and 4.2 GiB cached by
PyTorch in a segment that earlier rows had been carved from.

An expert: the memory is GEM's per-experience gradient memory, k x 88.9M floats, three times over at the
peak; it grows by one model-sized row every week and no batch setting changes that.  Use A-GEM (Avalanche's
AGEM: one reference gradient from a sample of the whole episodic memory, constant in the number of
experiences) or replay; if GEM's per-experience constraints are needed, keep G in host memory (the QP is
solved on the CPU anyway) or write the rows into one preallocated buffer and free the old G first.  Wrong first:
a smaller training batch or gradient checkpointing (activations are not what grows), mixed precision (already
on; the gradient rows are float32), expandable_segments or empty_cache (the cached 4.2 GiB would get this week
through, and the growth fails it again a few weeks later), an 8-bit optimizer (SGD's momentum is 339 MiB),
ZeRO/FSDP on one GPU, a bigger card (a 48 GB one reaches week 45), restarting (loses the episodic memory, and
the next week repeats it).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

F32, BF16 = torch.float32, torch.bfloat16
GiB = float(1 << 30)

# ---- stand-in gaps (C functions in PyTorch), compiled as part of torch's file so that the failing line stays
# the program's: torch.cat and torch.stack make one new tensor of the summed size.
_GAPS = """
def cat(tensors, dim=0):
    n = sum(t.nbytes for t in tensors)
    return torch.empty(n // torch._ITEMSIZE[tensors[0].dtype], dtype=tensors[0].dtype, device="cuda")


def stack(tensors, dim=0):
    n = sum(t.nbytes for t in tensors)
    return torch.empty(n // torch._ITEMSIZE[tensors[0].dtype], dtype=tensors[0].dtype, device="cuda")
"""
if not hasattr(torch, "stack"):
    _ns = {"torch": torch}
    exec(compile(_GAPS, torch.__file__, "exec"), _ns)
    torch.cat, torch.stack = _ns["cat"], _ns["stack"]

_SGD_MOMENTUM = """
class SGD(_SGD):
    # torch.optim.SGD with momentum: a momentum_buffer per parameter, made at the first step
    def _update(self):
        if not self.defaults.get("momentum"):
            return
        for p in self.param_groups[0]["params"]:
            if p.grad is not None and p not in self.state:
                self.state[p] = {"momentum_buffer": torch.empty(p.nbytes // 4, dtype=torch.float32,
                                                                device=p.device)}
"""
import torch.optim.optimizer as _opt_mod  # noqa: E402
_ns = {"torch": torch, "_SGD": torch.optim.SGD}
exec(compile(_SGD_MOMENTUM, _opt_mod.__file__, "exec"), _ns)
torch.optim.SGD = _ns["SGD"]
# ----

TOKENS = 197
D, MLP, HEADS, LAYERS = 768, 3072, 12, 12


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=F32, device="cuda"))


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.norm1 = _param(2 * D)
        self.qkv = _param(D * 3 * D + 3 * D)
        self.proj = _param(D * D + D)
        self.norm2 = _param(2 * D)
        self.fc1 = _param(D * MLP + MLP)
        self.fc2 = _param(MLP * D + D)

    def forward(self, x, b):
        """bf16 autocast: what the block saves for backward."""
        qkv = torch.empty(b * TOKENS * 3 * D, dtype=BF16, device="cuda")
        qkv._saved = x
        attn = torch.empty(b * HEADS * TOKENS * TOKENS, dtype=BF16, device="cuda")
        attn._saved = qkv
        h = torch.empty(b * TOKENS * D, dtype=BF16, device="cuda")
        h._saved = attn
        fc1 = torch.empty(b * TOKENS * MLP, dtype=BF16, device="cuda")
        fc1._saved = h
        gelu = torch.empty(b * TOKENS * MLP, dtype=BF16, device="cuda")
        gelu._saved = fc1
        out = torch.empty(b * TOKENS * D, dtype=BF16, device="cuda")
        out._saved = gelu
        return out


class VisionTransformer(torch.nn.Module):
    """timm vit_base_patch16_224, new head of 4,096 SKU classes."""

    def __init__(self, num_classes=4096):
        torch.nn.Module.__init__(self)
        self.patch_embed = _param(3 * 16 * 16 * D + D)
        self.pos_embed = _param(TOKENS * D + D)
        for i in range(LAYERS):
            setattr(self, "blocks_%d" % i, Block())
        self.norm = _param(2 * D)
        self.head = _param(D * num_classes + num_classes)

    def forward(self, images):
        b = images
        x = torch.empty(b * TOKENS * D, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            x = getattr(self, "blocks_%d" % i)(x, b)
        logits = torch.empty(b * 4096, dtype=F32, device="cuda")
        logits._saved = x
        return logits


class GEMPlugin(object):
    """avalanche.training.plugins.GEMPlugin, as far as memory goes."""

    def __init__(self, patterns_per_experience, memory_strength):
        self.patterns_per_experience = patterns_per_experience
        self.memory_strength = memory_strength
        self.memory_x, self.memory_y = {}, {}       # host memory: 64 crops per experience
        self.G = None

    def before_training_iteration(self, strategy):
        if strategy.train_exp_counter > 0:
            G = []
            strategy.model.train()
            for t in range(strategy.train_exp_counter):
                strategy.model.train()
                strategy.optimizer.zero_grad()
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    out = strategy.model(self.patterns_per_experience)      # self.memory_x[t].to(device)
                loss = F.cross_entropy(out, None)
                loss.backward()
                del out, loss
                G.append(torch.cat([p.grad.view(-1) for p in strategy.model.parameters()], dim=0))
            self.G = torch.stack(G)  # (experiences, parameters)

    def after_backward(self, strategy):                # @torch.no_grad() in Avalanche
        with torch.no_grad():
            if strategy.train_exp_counter > 0:
                g = torch.cat([p.grad.view(-1) for p in strategy.model.parameters()], dim=0)
                dots = torch.empty(strategy.train_exp_counter, dtype=F32, device="cuda")   # torch.mv(self.G, g)
                del g, dots

    def after_training_exp(self, strategy):
        self.memory_x[strategy.train_exp_counter] = "64 crops"
        self.memory_y[strategy.train_exp_counter] = "64 labels"


class GEM(object):
    """avalanche.training.GEM: a SupervisedTemplate with the GEMPlugin."""

    def __init__(self, model, optimizer, patterns_per_exp, memory_strength, train_mb_size, iterations_per_exp):
        self.model, self.optimizer = model, optimizer
        self.plugin = GEMPlugin(patterns_per_exp, memory_strength)
        self.train_mb_size = train_mb_size
        self.iterations = iterations_per_exp
        self.train_exp_counter = 0

    def train(self, experience):
        for it in range(self.iterations):
            self.plugin.before_training_iteration(self)
            self.optimizer.zero_grad()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = self.model(self.train_mb_size)
            loss = F.cross_entropy(out, None)
            loss.backward()
            del out, loss
            self.plugin.after_backward(self)
            self.optimizer.step()
        self.plugin.after_training_exp(self)
        self.train_exp_counter += 1


def weekly_stream(weeks):
    for w in range(1, weeks + 1):
        yield w


_week = {}


def main():
    model = VisionTransformer()
    nparams = sum(p.nbytes for p in model.parameters()) // 4
    print("ViT-B/16: %.1fM parameters, %.0f MiB per gradient row" % (nparams / 1e6, nparams * 4 / 2.0 ** 20))
    strategy = GEM(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9),
                   patterns_per_exp=64, memory_strength=0.5, train_mb_size=64, iterations_per_exp=3)
    for week in weekly_stream(52):
        _week["week"] = week
        strategy.train(week)
        print("week %2d done: %d experiences, G %.2f GiB, allocated %.2f GiB, peak %.2f GiB" % (
            week, strategy.train_exp_counter,
            (strategy.plugin.G.nbytes if strategy.plugin.G is not None else 0) / GiB,
            torch.cuda.memory_allocated() / GiB, torch.cuda.max_memory_allocated() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    print("failed in week %(week)d" % _week, file=sys.stderr)
    raise
sys.exit(0)
