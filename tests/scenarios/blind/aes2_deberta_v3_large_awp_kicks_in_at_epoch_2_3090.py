"""train_aes2.py -- a Kaggler's training script for Learning Agency Lab - Automated Essay Scoring 2.0 on a home
RTX 3090 (24 GB): DeBERTa-v3-large (435M params, fp32 master weights, fp16 autocast + GradScaler, AdamW),
essays tokenized to max_length=1280, batch 2, gradient accumulation 2, 4 epochs per fold.  The batch size
was tuned on epoch 0 (peak ~19.5 GiB of the card's 23.5).  From the Feedback Prize 3 winners' write-ups the
script copies AWP (adversarial weight perturbation), switched on from epoch 2 (`awp_start=2`), the
Kaggle-standard class:

    def _save(self):
        for name, param in self.model.named_parameters():
            if param.requires_grad and param.grad is not None and self.adv_param in name:
                if name not in self.backup:
                    self.backup[name] = param.data.clone()
                    grad_eps = self.adv_eps * param.abs().detach()
                    self.backup_eps[name] = (self.backup[name] - grad_eps, self.backup[name] + grad_eps)

    ... scaler.scale(loss).backward()
        if CFG.awp and epoch >= CFG.awp_start:
            loss = awp.attack_backward(inputs, labels)      # _save, _attack_step, a second forward
            scaler.scale(loss).backward()
            awp._restore()

Epochs 0 and 1 of fold 0 run for hours without a problem.  At the first step of epoch 2, AWP keeps three
more fp32 copies of every "weight" parameter -- the backup and the two clamp bounds, 4.9 GiB in the dicts
awp.backup / awp.backup_eps -- while the gradients and AdamW's moments are alive, and the adversarial forward
pass (a full batch of activations again, ~12.8 GiB) fails part way through its layers.

An expert: what changed is the phase, not the batch: the job fit until AWP started, and AWP's weight copies
are the new memory.  Keep one copy instead of three (compute the clamp bounds from the backup inside
_attack_step instead of storing them: -3.2 GiB, free), or keep AWP's backup off the GPU (pinned CPU memory:
a copy per step over PCIe); gradient checkpointing or a smaller micro-batch would also make room, at a cost
paid in every step of every epoch.  Wrong first advice: mixed precision (already on), expandable_segments or
empty_cache (the memory is live), inference_mode (it is training), quantization, a bigger GPU.
"""
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.autograd._graph import derive

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30

# ---------------------------------------------------------------------------------------------------------
# What the simulator's torch lacks, in the shape of the real API, defined as if in the real libraries' files
# (a failing stack then shows the frames it shows with PyTorch and transformers): Parameter.data (get: the
# storage without its graph; set: the parameter takes the given tensor's storage), elementwise Tensor
# arithmetic (a new tensor of the same size), Tensor.abs/add_, torch.norm/isnan/max/min,
# F.smooth_l1_loss, dotted names in named_parameters(); and DeBERTa-v3-large as transformers lays it out
# (parameter names ending in weight / bias; each layer's activations saved for backward).
# ---------------------------------------------------------------------------------------------------------
def _as_library(path, src):
    ns = {"torch": torch, "nn": nn, "F": F, "derive": derive,
          "__name__": os.path.splitext(os.path.basename(path))[0]}
    exec(compile(src, path, "exec"), ns)
    return ns


_as_library(os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), r'''
class _Scalar(float):
    """A 0-dim result (torch.norm): a number here."""


def _data_get(self):
    return self.detach()


def _data_set(self, value):
    self._base = value._root() if value._base is not None else value


nn.Parameter.data = property(_data_get, _data_set)


def _new_like(a, *others):
    out = derive(torch.empty_like(a), a, *[o for o in others if isinstance(o, torch.Tensor)])
    if out._params:
        out._saved = a          # what autograd keeps for backward, when there is a graph
    return out


def _named_parameters(self, prefix=""):
    """Module.named_parameters() with the dotted names transformers' modules give."""
    seen = set()
    todo = [(prefix, self)]
    while todo:
        pre, m = todo.pop(0)
        for k, p in m._parameters.items():
            if p is not None and id(p) not in seen:
                seen.add(id(p))
                yield pre + k, p
        for k, sub in m._modules.items():
            todo.append((pre + k + ".", sub))


nn.Module.named_parameters = _named_parameters


torch.Tensor.__add__ = lambda a, b: _new_like(a, b)
torch.Tensor.__sub__ = lambda a, b: _new_like(a, b)
torch.Tensor.__mul__ = lambda a, b: _new_like(a, b)
torch.Tensor.__rmul__ = lambda a, b: _new_like(a, b)
torch.Tensor.__truediv__ = lambda a, b: _new_like(a, b)
torch.Tensor.abs = lambda a: _new_like(a)
torch.Tensor.add_ = lambda a, b: a
torch.norm = lambda t: _Scalar(1.0)
torch.isnan = lambda t: False
torch.max = lambda a, b: _new_like(a, b)
torch.min = lambda a, b: _new_like(a, b)


def smooth_l1_loss(input, target, reduction="mean"):
    loss = torch.empty(2, dtype=torch.float32, device=input.device)
    loss._saved = input
    return derive(loss, input)


F.smooth_l1_loss = smooth_l1_loss
''')

_hf = _as_library("/home/kaggler/miniconda3/envs/aes2/lib/python3.10/site-packages/transformers/models/deberta_v2/"
                  "modeling_deberta_v2.py", r'''
def _w(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


def _weights_used(module):
    """The forward reads its weights (module.weight, module.bias, ...): autograd records them."""
    for m in module.modules():
        for k in list(m._parameters):
            getattr(m, k)


class Linear(nn.Module):
    def __init__(self, i, o):
        nn.Module.__init__(self)
        self.weight = _w(i * o)
        self.bias = _w(o)


class LayerNorm(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.weight = _w(d)
        self.bias = _w(d)


class DebertaV2Layer(nn.Module):
    def __init__(self, d=1024, ff=4096):
        nn.Module.__init__(self)
        self.query_proj, self.key_proj, self.value_proj = Linear(d, d), Linear(d, d), Linear(d, d)
        self.attn_out, self.attn_ln = Linear(d, d), LayerNorm(d)
        self.intermediate, self.output, self.output_ln = Linear(d, ff), Linear(ff, d), LayerNorm(d)

    def forward(self, hidden):
        b, n = hidden.shape
        h16 = 2                                      # fp16 under autocast
        keep = torch.is_grad_enabled()               # saved for backward only with autograd on
        _weights_used(self)
        prev = hidden
        for nbytes in ([b * n * 1024 * h16] * 3       # q, k, v
                       + [b * 16 * n * n * h16] * 4   # scores, c2p, p2c, probs (disentangled attention)
                       + [b * 16 * n * n]             # dropout mask
                       + [b * n * 1024 * h16] * 2     # context, attention output
                       + [b * n * 4096 * h16] * 3     # intermediate, gelu, its output
                       + [b * n * 1024 * h16] * 3):   # output, residual, layer norm
            t = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            if keep:
                t._saved = prev
            prev = t
        out = torch.empty(b * n * 1024 * h16, dtype=torch.uint8, device="cuda")
        out.shape = hidden.shape
        if keep:
            out._saved = prev
        return out


class DebertaV2Model(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Module()
        self.embeddings.word_embeddings.weight = _w(128_100 * 1024)
        self.embeddings.LayerNorm = LayerNorm(1024)
        self.encoder = nn.Module()
        self.encoder.rel_embeddings = nn.Module()
        self.encoder.rel_embeddings.weight = _w(512 * 1024)
        self.encoder.LayerNorm = LayerNorm(1024)
        for i in range(24):
            setattr(self.encoder, "layer_%d" % i, DebertaV2Layer())

    def forward(self, input_ids):
        hidden = torch.empty(input_ids.shape[0] * input_ids.shape[1] * 1024 * 2, dtype=torch.uint8, device="cuda")
        hidden.shape = input_ids.shape
        _weights_used(self.embeddings)
        _weights_used(self.encoder.rel_embeddings)
        for i in range(24):
            hidden = getattr(self.encoder, "layer_%d" % i)(hidden)
        return hidden
''')
DebertaV2Model = _hf["DebertaV2Model"]        # AutoModel.from_pretrained("microsoft/deberta-v3-large")
Linear, _weights_used = _hf["Linear"], _hf["_weights_used"]


class CustomModel(nn.Module):
    """The FB3 / AES2 baseline's model: backbone, mean pooling, a linear head."""

    def __init__(self):
        nn.Module.__init__(self)
        self.model = DebertaV2Model()
        self.fc = Linear(1024, 1)

    def forward(self, inputs):
        last_hidden = self.model(inputs)
        _weights_used(self.fc)
        out = torch.empty(inputs.shape[0] * 4, dtype=torch.float32, device="cuda")
        out._saved = last_hidden
        return out


class AWP:
    def __init__(self, model, criterion, optimizer, apex, adv_param="weight", adv_lr=1.0, adv_eps=0.01):
        self.model = model
        self.criterion = criterion
        self.optimizer = optimizer
        self.adv_param = adv_param
        self.adv_lr = adv_lr
        self.adv_eps = adv_eps
        self.apex = apex
        self.backup = {}
        self.backup_eps = {}

    def attack_backward(self, inputs, label):
        with torch.autocast("cuda", enabled=self.apex):
            self._save()
            self._attack_step()
            y_preds = self.model(inputs)
            adv_loss = self.criterion(y_preds, label)
            self.optimizer.zero_grad()
        return adv_loss

    def _attack_step(self):
        e = 1e-6
        for name, param in self.model.named_parameters():
            if param.requires_grad and param.grad is not None and self.adv_param in name:
                norm1 = torch.norm(param.grad)
                norm2 = torch.norm(param.data.detach())
                if norm1 != 0 and not torch.isnan(norm1):
                    r_at = self.adv_lr * param.grad / (norm1 + e) * (norm2 + e)
                    param.data.add_(r_at)
                    param.data = torch.min(torch.max(param.data, self.backup_eps[name][0]), self.backup_eps[name][1])

    def _save(self):
        for name, param in self.model.named_parameters():
            if param.requires_grad and param.grad is not None and self.adv_param in name:
                if name not in self.backup:
                    self.backup[name] = param.data.clone()
                    grad_eps = self.adv_eps * param.abs().detach()
                    self.backup_eps[name] = (
                        self.backup[name] - grad_eps,
                        self.backup[name] + grad_eps,
                    )

    def _restore(self):
        for name, param in self.model.named_parameters():
            if name in self.backup:
                param.data = self.backup[name]
        self.backup = {}
        self.backup_eps = {}


# ---------------------------------------------------------------------------------------------------------
# The script
# ---------------------------------------------------------------------------------------------------------
class CFG:
    max_len = 1280
    batch_size = 2
    gradient_accumulation_steps = 2
    epochs = 4
    apex = True
    awp = True
    awp_start = 2
    adv_lr = 1e-4
    adv_eps = 1e-2
    steps_per_epoch = 3          # (3,462 micro-batches per epoch in the real run; the first few shown)


class Batch(object):
    def __init__(self, b, n):
        self.shape = (b, n)


def train_fn(fold, train_loader, model, criterion, optimizer, epoch, scheduler, scaler, awp):
    model.train()
    for step, (inputs, labels) in enumerate(train_loader):
        with torch.autocast("cuda", enabled=CFG.apex):
            y_preds = model(inputs)
            loss = criterion(y_preds, labels)
        if CFG.gradient_accumulation_steps > 1:
            loss = loss / CFG.gradient_accumulation_steps
        scen_truth.backward(scaler.scale(loss))
        if CFG.awp and epoch >= CFG.awp_start:
            loss = awp.attack_backward(inputs, labels)
            scen_truth.backward(scaler.scale(loss))
            awp._restore()
        if (step + 1) % CFG.gradient_accumulation_steps == 0:
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad()
        print("Epoch: [%d][%d/3462] allocated %.2f GiB, peak %.2f GiB"
              % (epoch + 1, step, torch.cuda.memory_allocated() / GiB, torch.cuda.max_memory_allocated() / GiB))


def valid_fn(valid_loader, model):
    model.eval()
    with torch.no_grad():
        for inputs, labels in valid_loader:
            with torch.autocast("cuda", enabled=CFG.apex):
                y_preds = model(inputs)
    model.train()


def loader(n, b):
    for _ in range(n):
        yield Batch(b, CFG.max_len), None


def train_loop(fold):
    model = CustomModel()
    criterion = F.smooth_l1_loss
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    scaler = torch.cuda.amp.GradScaler(enabled=CFG.apex)
    awp = AWP(model, criterion, optimizer, CFG.apex, adv_lr=CFG.adv_lr, adv_eps=CFG.adv_eps)
    for epoch in range(CFG.epochs):
        train_fn(fold, loader(CFG.steps_per_epoch + 1, CFG.batch_size), model, criterion, optimizer, epoch,
                 None, scaler, awp)
        valid_fn(loader(2, CFG.batch_size * 2), model)


try:
    for fold in range(4):
        train_loop(fold)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
