"""train_ple_pcgrad.py -- a short-video feed ranker (PLE: 4 shared + 2 per-task experts over 40 sparse id
features) trained on five objectives at once -- click, long view, like, share, follow -- on one NVIDIA
A10G (AWS g5.2xlarge, 22.5 GiB), run with plain `LD_PRELOAD=liboomguard.so python train_ple_pcgrad.py`.

The model is 210M fp32 parameters (802 MiB), 701 MiB of it embedding tables (user id 2.6M x 32, item
id 1.9M x 32, author id 0.7M x 32, music id 0.4M x 32, 36 small fields), dense gradients, AdamW.
The team trained it for months on this card with the summed loss: peak 4.3 GiB allocated (weights,
gradients, 1.6 GiB of AdamW state, 0.8 GiB of activations for a batch of 4096 impressions).  After
"like" started fighting "long view", an engineer vendored the popular PCGrad wrapper
(WeiChengTseng/Pytorch-PCGrad, pcgrad.py, copied as is) and changed two lines:

    pc_adam = PCGrad(torch.optim.AdamW(model.parameters(), lr=1e-3))
    ...
    losses = [F.binary_cross_entropy_with_logits(logits[t], y[t]) for t in TASKS]
    pc_adam.zero_grad()
    pc_adam.pc_backward(losses)                     # was: sum(losses).backward()
    pc_adam.step()

The very first step dies inside pc_backward -> _project_conflicting, on
    merged_grad[shared] = torch.stack([g[shared] for g in pc_grad]).mean(dim=0)
asking for 3.56 GiB with 3.24 GiB free and 18.6 GiB allocated, for a model of 0.8 GiB.  Nothing
leaks, nothing is fragmented, and the batch is not the lever: the wrapper works on flattened copies of
the WHOLE gradient, per task.  For each of the 5 objectives it keeps a flat fp32 copy of every
parameter's gradient (zeros for the towers the task does not reach) and a flat fp32 0/1 mask of the same
size (torch.ones_like(p)), then stacks the masks, deep-copies the 5 gradient vectors to project them,
and stacks the 5 masked copies to merge them: about 16 GiB of gradient copies in flight, 4 to 5 copies
of the model per task.  The embedding tables reach every task, so they are all "shared" and all copied.
The graph kept by retain_graph=True (what the wrapper's GitHub issue blames) is 0.8 GiB of it.  A
smaller batch only moves the failure one line down (batch 2048, even 512: the 729 MiB .mean(dim=0)
fails next), and from the second step on AdamW's 1.6 GiB of state would have to fit beside it too.

An expert's first lines: this is the gradient-surgery implementation's per-task copies of the whole
parameter vector, not activations.  Do the surgery only where task conflicts matter and the vector is
small: hand PCGrad the shared experts' parameters (28 MiB here), give the embedding tables and the
towers the plain summed gradient (or project the gradients w.r.t. the shared representation, MGDA-UB
style), and keep the masks boolean / project in place.  Not a smaller batch, not activation
checkpointing, not autocast (the copies are fp32 gradients of fp32 weights), not expandable segments
or empty_cache (nothing is cached), not inference mode.
"""
import copy
import random
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)      # test scaffolding: records every request for the truth marks

DEVICE = "cuda:0"
BATCH_SIZE = 4096                       # impressions per step
EMB_DIM = 32
TASKS = ["click", "long_view", "like", "share", "follow"]
# the id features and their vocabularies (rows); 40 fields in all
BIG_FIELDS = {"user_id": 2_600_000, "item_id": 1_900_000, "author_id": 700_000, "music_id": 400_000}
SMALL_FIELDS = dict(("f%02d" % i, 4_000) for i in range(36))     # city, device model, hour, topic, ...
N_FIELDS = len(BIG_FIELDS) + len(SMALL_FIELDS)
N_SHARED_EXPERTS, N_TASK_EXPERTS = 4, 2
EXPERT_HIDDEN, EXPERT_OUT, TOWER_HIDDEN = 1024, 512, 256
F32 = 4
f32 = torch.float32


class Embedding(nn.Module):
    def __init__(self, rows, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(rows * dim, f32, device=DEVICE))
        self.rows, self.dim = rows, dim

    def forward(self, ids):
        out = torch.empty(BATCH_SIZE * self.dim, f32, device=DEVICE)            # F.embedding(ids, self.weight)
        out._saved = ids
        return out


class Linear(nn.Module):
    def __init__(self, n_in, n_out, relu=True):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, f32, device=DEVICE))
        self.bias = nn.Parameter(torch.empty(n_out, f32, device=DEVICE))
        self.n_out, self.relu = n_out, relu

    def forward(self, x):
        y = torch.empty(BATCH_SIZE * self.n_out, f32, device=DEVICE)            # x @ W.T + b
        y._saved = x
        if not self.relu:
            return y
        a = torch.empty(BATCH_SIZE * self.n_out, f32, device=DEVICE)            # relu(y), y kept for backward
        a._saved = (y, x)
        return a


class Expert(nn.Module):
    def __init__(self, n_in):
        nn.Module.__init__(self)
        self.fc1 = Linear(n_in, EXPERT_HIDDEN)
        self.fc2 = Linear(EXPERT_HIDDEN, EXPERT_OUT)

    def forward(self, x):
        return self.fc2(self.fc1(x))


class Gate(nn.Module):
    """One task's mixture: softmax(x @ Wg) weighs the shared experts and this task's own."""

    def __init__(self, n_in, n_experts):
        nn.Module.__init__(self)
        self.proj = Linear(n_in, n_experts, relu=False)
        self.n_experts = n_experts

    def forward(self, x, expert_outs):
        w = self.proj(x)
        # (softmax(w)[..., None] * torch.stack(expert_outs, 1)).sum(1)
        mixed = torch.empty(BATCH_SIZE * EXPERT_OUT, f32, device=DEVICE)
        mixed._saved = (w,) + tuple(expert_outs)
        return mixed


class Tower(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc = Linear(EXPERT_OUT, TOWER_HIDDEN)
        self.out = Linear(TOWER_HIDDEN, 2, relu=False)

    def forward(self, x):
        return self.out(self.fc(x))


class FeatureConcat(nn.Module):
    def forward(self, *embs):
        x = torch.empty(BATCH_SIZE * N_FIELDS * EMB_DIM, f32, device=DEVICE)    # torch.cat(embs, dim=1)
        x._saved = embs
        return x


class RankerOutput(object):
    """What the ranker returns (a ModelOutput-like object): the logits of each task by name."""

    def __init__(self, logits):
        self.logits = logits


class PLERanker(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fields = list(BIG_FIELDS) + list(SMALL_FIELDS)
        for name, rows in list(BIG_FIELDS.items()) + list(SMALL_FIELDS.items()):
            setattr(self, "emb_" + name, Embedding(rows, EMB_DIM))
        self.concat = FeatureConcat()
        n_in = N_FIELDS * EMB_DIM
        for e in range(N_SHARED_EXPERTS):
            setattr(self, "shared_expert_%d" % e, Expert(n_in))
        for t in TASKS:
            for e in range(N_TASK_EXPERTS):
                setattr(self, "%s_expert_%d" % (t, e), Expert(n_in))
            setattr(self, "%s_gate" % t, Gate(n_in, N_SHARED_EXPERTS + N_TASK_EXPERTS))
            setattr(self, "%s_tower" % t, Tower())

    def forward(self, ids):
        x = self.concat(*[getattr(self, "emb_" + f)(ids) for f in self.fields])
        shared = [getattr(self, "shared_expert_%d" % e)(x) for e in range(N_SHARED_EXPERTS)]
        logits = {}
        for t in TASKS:
            own = [getattr(self, "%s_expert_%d" % (t, e))(x) for e in range(N_TASK_EXPERTS)]
            mixed = getattr(self, "%s_gate" % t)(x, shared + own)
            logits[t] = getattr(self, "%s_tower" % t)(mixed)
        return RankerOutput(logits)


# ---- pcgrad.py, vendored as is from WeiChengTseng/Pytorch-PCGrad.  The stand-in torch has no cat, stack,
# ones_like or boolean indexing, so each of those lines is spelled as the allocation it makes (the original
# line in the comment beside it); _with_grad and _true are the stand-in's bookkeeping of the 0/1 masks. ----
class PCGrad():
    def __init__(self, optimizer, reduction='mean'):
        self._optim, self._reduction = optimizer, reduction
        return

    @property
    def optimizer(self):
        return self._optim

    def zero_grad(self):
        return self._optim.zero_grad(set_to_none=True)

    def step(self):
        return self._optim.step()

    def pc_backward(self, objectives):
        grads, shapes, has_grads = self._pack_grad(objectives)
        pc_grad = self._project_conflicting(grads, has_grads)
        pc_grad = self._unflatten_grad(pc_grad, shapes[0])
        self._set_grad(pc_grad)
        return

    def _project_conflicting(self, grads, has_grads, shapes=None):
        numel = grads[0].nbytes // F32
        # shared = torch.stack(has_grads).prod(0).bool()
        stacked = torch.empty(len(has_grads) * numel, f32, device=DEVICE)
        prod = torch.empty(numel, f32, device=DEVICE)
        shared = torch.empty(numel, torch.uint8, device=DEVICE)
        shared._true = _shared_elements(self._optim, has_grads)
        del stacked, prod
        pc_grad, num_task = copy.deepcopy(grads), len(grads)
        for g_i in pc_grad:
            random.shuffle(grads)
            for g_j in grads:
                g_i_g_j = _dot(g_i, g_j)
                if g_i_g_j < 0:
                    # g_i -= (g_i_g_j) * g_j / (g_j.norm()**2): two temporaries the size of g_j
                    scaled = torch.empty(numel, f32, device=DEVICE)
                    scaled = torch.empty(numel, f32, device=DEVICE)
                    del scaled
        merged_grad = torch.empty(numel, f32, device=DEVICE)   # torch.zeros_like(grads[0]).to(grads[0].device)
        if self._reduction:
            # merged_grad[shared] = torch.stack([g[shared] for g in pc_grad]).mean(dim=0)
            picked = [torch.empty(shared._true, f32, device=DEVICE) for g in pc_grad]     # g[shared]
            stacked = torch.empty(len(picked) * shared._true, f32, device=DEVICE)         # torch.stack(...)
            mean = torch.empty(shared._true, f32, device=DEVICE)                          # .mean(dim=0)
            del picked, stacked, mean
        # merged_grad[~shared] = torch.stack([g[~shared] for g in pc_grad]).sum(dim=0)
        picked = [torch.empty(numel - shared._true, f32, device=DEVICE) for g in pc_grad]
        stacked = torch.empty(len(picked) * (numel - shared._true), f32, device=DEVICE)
        del picked, stacked
        return merged_grad

    def _set_grad(self, grads):
        idx = 0
        for group in self._optim.param_groups:
            for p in group['params']:
                p.grad = grads[idx]
                idx += 1
        return

    def _pack_grad(self, objectives):
        grads, shapes, has_grads = [], [], []
        for obj in objectives:
            self._optim.zero_grad(set_to_none=True)
            obj.backward(retain_graph=True)
            grad, shape, has_grad = self._retrieve_grad()
            grads.append(self._flatten_grad(grad, shape))
            has_grads.append(self._flatten_grad(has_grad, shape))
            has_grads[-1]._with_grad = [p.grad is not None for g in self._optim.param_groups for p in g['params']]
            shapes.append(shape)
        return grads, shapes, has_grads

    def _unflatten_grad(self, grads, shapes):
        unflatten_grad, idx = [], 0
        for nbytes in shapes:
            # grads[idx:idx + length].view(shape).clone()
            unflatten_grad.append(torch.empty(nbytes // F32, f32, device=DEVICE))
            idx += nbytes // F32
        return unflatten_grad

    def _flatten_grad(self, grads, shapes):
        # torch.cat([g.flatten() for g in grads])
        flatten_grad = torch.empty(sum(g.nbytes for g in grads) // F32, f32, device=DEVICE)
        return flatten_grad

    def _retrieve_grad(self):
        grad, shape, has_grad = [], [], []
        for group in self._optim.param_groups:
            for p in group['params']:
                # tackle the multi-head scenario
                if p.grad is None:
                    shape.append(p.nbytes)
                    grad.append(torch.empty_like(p))          # torch.zeros_like(p).to(p.device)
                    has_grad.append(torch.empty_like(p))      # torch.zeros_like(p).to(p.device)
                    continue
                shape.append(p.grad.nbytes)
                grad.append(p.grad.clone())
                has_grad.append(torch.empty_like(p))          # torch.ones_like(p).to(p.device)
        return grad, shape, has_grad


def _shared_elements(optim, has_grads):
    """The stand-in's count of the True entries of the shared mask: the elements every task reached."""
    params = [p for g in optim.param_groups for p in g['params']]
    return sum(p.nbytes // F32 for i, p in enumerate(params) if all(h._with_grad[i] for h in has_grads))


_DOTS = {}


def _dot(a, b):
    """The sign of torch.dot(g_i, g_j) (the stand-in computes nothing): about one pair in three conflicts."""
    key = (id(a), id(b))
    if key not in _DOTS:
        _DOTS[key] = -1.0 if len(_DOTS) % 3 == 0 else 1.0
    return _DOTS[key]


def main():
    model = PLERanker()
    pc_adam = PCGrad(torch.optim.AdamW(model.parameters(), lr=1e-3))
    n_params = sum(p.nbytes for p in model.parameters()) // F32
    print("PLE ranker: %.1fM parameters (%.0f MiB fp32), %d tasks, batch %d"
          % (n_params / 1e6, n_params * F32 / 2.0 ** 20, len(TASKS), BATCH_SIZE), file=sys.stderr)
    for step in range(3):
        ids = torch.empty(BATCH_SIZE * N_FIELDS * 8, device=DEVICE)                 # int64 ids, 40 per impression
        labels = [torch.empty(BATCH_SIZE, f32, device=DEVICE) for t in TASKS]
        model.train()
        logits = model(ids).logits
        losses = [F.cross_entropy(logits[t], y) for t, y in zip(TASKS, labels)]     # BCE-with-logits per task
        pc_adam.zero_grad()
        pc_adam.pc_backward(losses)
        pc_adam.step()
        print("step %d done, %.2f GiB allocated" % (step, torch.cuda.memory_allocated() / 2.0 ** 30), file=sys.stderr)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
