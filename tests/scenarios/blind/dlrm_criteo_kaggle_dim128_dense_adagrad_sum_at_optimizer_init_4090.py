"""train_ctr.py -- a practitioner's DLRM-style click-through model on the Criteo Display Advertising Challenge
data (Kaggle, 45.8M impressions, 13 dense + 26 categorical features; the categorical columns have 3 to 10.1M
distinct values, 33.76M in all), on a home workstation's RTX 4090 (24 GB).  The first version followed the
DLRM reference's Kaggle settings (embedding dim 16, SGD) and used 2 GiB.  For the second, the practitioner
takes the MLPerf DLRM architecture (dim 128, bottom MLP 13-512-256-128, top MLP 479-1024-1024-512-256-1) and,
because "Adagrad is what production CTR models use for sparse features", Adagrad for the tables:

    emb_l = nn.ModuleList(nn.EmbeddingBag(n, 128, mode="sum", sparse=True) for n in ln_emb)
    model = DLRM(emb_l, bot_mlp, top_mlp).to("cuda")                     # 16.1 GiB of tables
    sparse_opt = torch.optim.Adagrad(model.emb_l.parameters(), lr=0.01)    # sparse gradients: supported
    dense_opt = torch.optim.Adam(list(model.bot_l.parameters()) + list(model.top_l.parameters()), lr=1e-3)
    for dense_x, offsets, indices, y in loader: ...

The tables (33.76M rows x 128 x 4 bytes = 16.1 GiB) load onto the card.  The script then dies on the
optimizer's constructor line, before a single batch: torch.optim.Adagrad creates its accumulator `sum`, a
dense tensor the size of each table, in __init__ (not at the first step as Adam does).  It gets through
table 2 (10.1M rows, 4.8 GiB) and table 3, and fails at table 11 (8.35M rows, a 3.98 GiB request) with 1.4
GiB free (22.0 GiB allocated: the tables and the first accumulators).  The sparse gradients do not help:
Adagrad's state is per element, so the whole 16.1 GiB is doubled.

An expert: the optimizer state, not the data or the model's forward, is what does not fit.  Keep one
accumulator per embedding row instead of per element -- row-wise Adagrad (FBGEMM / TorchRec's
EXACT_ROWWISE_ADAGRAD fused into the embedding backward, or DLRM's RWSAdagrad): 33.76M floats = 129 MiB -- or
plain SGD for the tables as the DLRM reference does; or shrink the tables (dim 64, or hash the three largest
columns into fewer rows), which halves both the tables and the state.
Wrong first advice: a smaller batch, gradient checkpointing, mixed precision or flash attention (no batch has
run; activations are nothing here), an 8-bit optimizer (bitsandbytes' 8-bit optimizers do not take the sparse
gradients of EmbeddingBag(sparse=True); going dense adds a 16 GiB gradient), expandable_segments / empty_cache
(a fresh process, nothing cached), ZeRO / FSDP or more GPUs (one card), quantization or LoRA (training the
tables is the point), inference_mode.
"""
import os
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: nn.EmbeddingBag, nn.Linear, nn.ModuleList, torch.full_like and torch.optim.Adagrad and
# Adam (PyTorch's own modules), compiled as PyTorch's files so that the failing line stays the program's.
_NN = '''
class EmbeddingBag(nn.Module):
    def __init__(self, num_embeddings, embedding_dim, mode="mean", sparse=False):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim, self.mode, self.sparse = num_embeddings, embedding_dim, mode, sparse
        self.weight = nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32, device="cuda"))


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))


class ModuleList(nn.Module):
    def __init__(self, modules=()):
        nn.Module.__init__(self)
        self._n = 0
        for m in modules:
            self.append(m)

    def append(self, m):
        setattr(self, str(self._n), m)
        self._n += 1
        return self

    def __iter__(self):
        return iter([self._modules[str(i)] for i in range(self._n)])

    def __len__(self):
        return self._n


def full_like(input, fill_value, memory_format=None):
    return torch.empty(input.nbytes // 4, dtype=torch.float32, device=input.device)
'''
_ADAGRAD = '''
class Adagrad(Optimizer):
    """torch.optim.Adagrad: the accumulator `sum` (the size of each parameter) is made in __init__."""

    def __init__(self, params, lr=1e-2, lr_decay=0, weight_decay=0, initial_accumulator_value=0, eps=1e-10,
                 foreach=None, maximize=False, differentiable=False, fused=None):
        defaults = dict(lr=lr, lr_decay=lr_decay, eps=eps, weight_decay=weight_decay,
                        initial_accumulator_value=initial_accumulator_value, foreach=foreach, maximize=maximize,
                        differentiable=differentiable, fused=fused)
        super(Adagrad, self).__init__(params, defaults)
        for group in self.param_groups:
            for p in group["params"]:
                state = self.state.setdefault(p, {})
                state["step"] = 0.0
                init_value = initial_accumulator_value
                state["sum"] = torch.full_like(p, init_value, memory_format=torch.preserve_format)
'''
_ns = {"torch": torch, "nn": nn}
exec(compile(_NN, torch.__file__, "exec"), _ns)
nn.EmbeddingBag, nn.Linear, nn.ModuleList = _ns["EmbeddingBag"], _ns["Linear"], _ns["ModuleList"]
torch.full_like = _ns["full_like"]
torch.preserve_format = "preserve_format"
_ans = {"torch": torch, "Optimizer": torch.optim.Optimizer}
exec(compile(_ADAGRAD, os.path.join(os.path.dirname(torch.optim.Optimizer.__init__.__code__.co_filename),
                                    "adagrad.py"), "exec"), _ans)
torch.optim.Adagrad = _ans["Adagrad"]
torch.optim.Adam = torch.optim.AdamW   # Adam: the same two moments made at the first step
# ----

# distinct values per categorical column of the Kaggle data (as DLRM's kaggle preprocessing counts them)
LN_EMB = [1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27, 14992, 5461306,
          10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572]
M_SPA = 128
LN_BOT = [13, 512, 256, 128]
LN_TOP = [479, 1024, 1024, 512, 256, 1]


def create_mlp(ln):
    return nn.ModuleList(nn.Linear(ln[i], ln[i + 1]) for i in range(len(ln) - 1))


class DLRM(nn.Module):
    def __init__(self, emb_l, bot_l, top_l):
        nn.Module.__init__(self)
        self.emb_l = emb_l
        self.bot_l = bot_l
        self.top_l = top_l


def main():
    emb_l = nn.ModuleList(nn.EmbeddingBag(n, M_SPA, mode="sum", sparse=True) for n in LN_EMB)
    model = DLRM(emb_l, create_mlp(LN_BOT), create_mlp(LN_TOP)).to("cuda")
    tables = sum(p.nbytes for p in model.emb_l.parameters())
    print("model on cuda:0: %d tables, %.2f GiB; allocated %.2f GiB" % (
        len(model.emb_l), tables / 2.0 ** 30, torch.cuda.memory_allocated() / 2.0 ** 30))
    sparse_opt = torch.optim.Adagrad(model.emb_l.parameters(), lr=0.01)
    dense_opt = torch.optim.Adam(list(model.bot_l.parameters()) + list(model.top_l.parameters()), lr=1e-3)
    print("optimizers ready; training on 45,840,617 impressions, batch 2048")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
