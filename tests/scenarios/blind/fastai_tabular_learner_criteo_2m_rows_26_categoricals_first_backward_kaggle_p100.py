"""criteo-fastai-baseline.ipynb (exported) -- a Kaggle notebook on the P100 (16 GB): a click-through-rate
baseline on the first 2M rows of the Criteo display-advertising data (13 integer features, 26 hashed
categorical columns), fastai's tabular API with every default, as in the fastai book's tabular chapter:

    to = TabularPandas(df, procs=[Categorify, FillMissing, Normalize], cat_names=cat_names,
                       cont_names=cont_names, y_names="label", y_block=CategoryBlock(), splits=splits)
    dls = to.dataloaders(bs=4096)
    learn = tabular_learner(dls, layers=[400, 400, 400], metrics=RocAucBinary())
    learn.fit_one_cycle(3, 2e-3)

tabular_learner sizes each column's embedding with fastai's rule of thumb, min(600, round(1.6 * n**0.56)):
every column with more than ~45k categories gets 600 dimensions.  In 2M rows of Criteo, seven hashed
columns have 58k to 1M distinct values (most seen once or twice), so the model has 2.5 billion embedding
parameters -- 9.3 GiB of float32, more than a thousand per training row -- against 2.7M in the MLP.  The
weights fit on the card; the first batch's forward goes through; loss.backward() makes nn.Embedding's dense
gradients, one per table, the size of the table, and fails on the fourth big table (C16), before fastai's
Adam would have added two more copies (18.6 GiB) at its first step.

An expert: the embedding sizing is the bug, not the batch: hashed ID-like columns need small embeddings
and a frequency threshold -- pass emb_szs={...} with 8-32 dims for the high-cardinality columns (or a
custom rule), and map categories seen fewer than ~10 times to one "rare" bucket (or hash to a fixed bucket
count) before Categorify; then the model is a few hundred MB.  Sparse gradients (nn.Embedding(sparse=True)
with SparseAdam) or tables kept off the GPU are the way when huge tables are really wanted (a recommender).
Wrong first advice: a smaller batch or gradient checkpointing (activations are ~100 MB), mixed precision
(fp32 master weights stay; the P100 has no fast fp16 anyway), an 8-bit optimizer (the failure is before
the step, and weights + gradients alone exceed the card), LoRA, quantization, flash attention,
empty_cache/expandable_segments, a bigger GPU.
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator and autograd's bookkeeping but no fastai, no
# pandas and few ops/modules.  The ops give a tensor a .shape and make its output's memory (nothing is
# computed); they are compiled into torch's own files, as PyTorch's ops are C++.  nn.Embedding and friends
# mirror torch's modules; the fastai classes mirror fastai 2.7's names and call structure.
# -----------------------------------------------------------------------------------------------------------
_OPS = r'''
def _result(shape, dtype, device, inputs=(), saves=()):
    n = 1
    for d in shape:
        n *= int(d)
    t = empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(d) for d in shape)
    if is_grad_enabled() and saves:
        t._saved = tuple(saves)
    return _derive(t, *inputs)


def cat(tensors, dim=1):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _result(shape, tensors[0].dtype, tensors[0].device, tuple(tensors))


class _Backward(object):
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from torch import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
        if not retain_graph:
            todo, seen = [self], set()
            while todo:
                t = todo.pop()
                if id(t) in seen:
                    continue
                seen.add(id(t))
                s = t.__dict__.pop("_saved", None)
                if s is not None:
                    todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))


Tensor.backward = _Backward.__dict__["backward"]
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)

_NN = r'''
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter
import torch


def _param(*shape):
    n = 1
    for d in shape:
        n *= int(d)
    p = Parameter(torch.empty(n, dtype=torch.float32))
    p.shape = tuple(shape)
    return p


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, sparse=False):
        Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.weight = _param(num_embeddings, embedding_dim)

    def forward(self, input):
        return torch._result((input.shape[0], self.embedding_dim), "float32", input.device,
                             (input, self.weight), (input,))


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        Module.__init__(self)
        self.out_features = out_features
        self.weight = _param(out_features, in_features)

    def forward(self, input):
        return torch._result((input.shape[0], self.out_features), "float32", input.device,
                             (input, self.weight), (input,))


class BatchNorm1d(Module):
    def __init__(self, num_features):
        Module.__init__(self)
        self.weight = _param(num_features)

    def forward(self, input):
        return torch._result(input.shape, "float32", input.device, (input, self.weight), (input,))


class ReLU(Module):
    def forward(self, input):
        return torch._result(input.shape, "float32", input.device, (input,), (input,))


class Dropout(Module):
    def __init__(self, p=0.5):
        Module.__init__(self)
        self.p = p

    def forward(self, input):
        if not self.training or self.p == 0:
            return input
        return torch._result(input.shape, "float32", input.device, (input,), (input,))


class ModuleList(Module):
    def __init__(self, mods=()):
        Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Sequential(ModuleList):
    def __init__(self, *mods):
        ModuleList.__init__(self, mods)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class CrossEntropyLoss(Module):
    def forward(self, input, target):
        return torch._result((1,), "float32", input.device, (input,), (input, target))
'''
_nn_ns = {}
exec(compile(_NN, torch.nn.modules.module.__file__, "exec"), _nn_ns)
for _name in ("Embedding", "Linear", "BatchNorm1d", "ReLU", "Dropout", "ModuleList", "Sequential",
              "CrossEntropyLoss"):
    setattr(torch.nn, _name, _nn_ns[_name])
nn = torch.nn


# --- pandas: the 2M-row sample, as far as the notebook looks at it -------------------------------------------
# distinct values per column in the first 2,000,000 rows of the Criteo display-advertising train.txt
CARDINALITY = {"C1": 1244, "C2": 531, "C3": 1013417, "C4": 412305, "C5": 248, "C6": 16, "C7": 10387, "C8": 496,
               "C9": 3, "C10": 38452, "C11": 4891, "C12": 934176, "C13": 3003, "C14": 26, "C15": 9624,
               "C16": 733521, "C17": 10, "C18": 4297, "C19": 1879, "C20": 4, "C21": 861230, "C22": 15, "C23": 15,
               "C24": 82104, "C25": 85, "C26": 57683}


class DataFrame(object):
    def __init__(self, nrows, names):
        self.nrows, self.columns = nrows, list(names)

    def __len__(self):
        return self.nrows

    def nunique(self, col):
        return CARDINALITY[col]


pd = types.ModuleType("pandas")
pd.read_csv = lambda path, sep=",", header="infer", nrows=None, names=None: DataFrame(nrows, names)
sys.modules["pandas"] = pd


# --- fastai 2.7 (fastai.tabular), the parts the notebook reaches ----------------------------------------------
def emb_sz_rule(n_cat):
    "Rule of thumb to pick embedding size corresponding to `n_cat`"
    return min(600, round(1.6 * n_cat ** 0.56))


class Categorify(object):
    pass


class FillMissing(object):
    pass


class Normalize(object):
    pass


class CategoryBlock(object):
    pass


class RandomSplitter(object):
    def __init__(self, valid_pct=0.2, seed=None):
        self.valid_pct = valid_pct

    def __call__(self, items):
        n = len(items)
        cut = int(n * (1 - self.valid_pct))
        return range(cut), range(cut, n)


def range_of(df):
    return range(len(df))


class TabularPandas(object):
    def __init__(self, df, procs, cat_names, cont_names, y_names, y_block=None, splits=None):
        self.df, self.cat_names, self.cont_names = df, cat_names, cont_names
        self.classes = {c: df.nunique(c) + 1 for c in cat_names}      # Categorify adds '#na#'
        self.splits = splits

    def dataloaders(self, bs=64):
        return TabDataLoaders(self, bs)


class TabDataLoaders(object):
    def __init__(self, to, bs):
        self.train_ds, self.bs = to, bs
        self.cat_names, self.cont_names = to.cat_names, to.cont_names
        self.classes = to.classes
        self.n_train = len(to.splits[0])

    @property
    def train(self):
        for _ in range(self.n_train // self.bs):
            x_cat = torch._result((self.bs, len(self.cat_names)), "float32", "cuda")    # int64 codes, as 2 x int32
            x_cont = torch._result((self.bs, len(self.cont_names)), "float32", "cuda")
            y = torch._result((self.bs,), "float32", "cuda")
            yield x_cat, x_cont, y


def get_emb_sz(to, sz_dict=None):
    "Get embedding size for each cat_name in `Tabular` or `DataLoaders`, or populate embedding size manually using sz_dict"
    sz_dict = sz_dict or {}
    return [(to.classes[n], sz_dict.get(n, emb_sz_rule(to.classes[n]))) for n in to.cat_names]


class LinBnDrop(nn.Sequential):
    def __init__(self, n_in, n_out, bn=True, p=0., act=None):
        layers = [nn.BatchNorm1d(n_in)] if bn else []
        layers += [nn.Linear(n_in, n_out)]
        if act is not None:
            layers.append(act)
        nn.Sequential.__init__(self, *layers)


class TabularModel(nn.Module):
    "Basic model for tabular data."

    def __init__(self, emb_szs, n_cont, out_sz, layers, embed_p=0., y_range=None, use_bn=True, bn_final=False,
                 bn_cont=True):
        nn.Module.__init__(self)
        self.embeds = nn.ModuleList([nn.Embedding(ni, nf) for ni, nf in emb_szs])
        self.emb_drop = nn.Dropout(embed_p)
        self.bn_cont = nn.BatchNorm1d(n_cont) if bn_cont else None
        n_emb = sum(e.embedding_dim for e in self.embeds)
        self.n_emb, self.n_cont = n_emb, n_cont
        sizes = [n_emb + n_cont] + layers + [out_sz]
        _layers = [LinBnDrop(sizes[i], sizes[i + 1], bn=use_bn and i != 0, act=nn.ReLU())
                   for i in range(len(sizes) - 2)]
        _layers.append(LinBnDrop(sizes[-2], sizes[-1], bn=False))
        self.layers = nn.Sequential(*_layers)

    def forward(self, x_cat, x_cont=None):
        if self.n_emb != 0:
            x = [e(x_cat) for i, e in enumerate(self.embeds)]
            x = torch.cat(x, 1)
            x = self.emb_drop(x)
        if self.n_cont != 0:
            x_cont = self.bn_cont(x_cont)
            x = torch.cat([x, x_cont], 1) if self.n_emb != 0 else x_cont
        return self.layers(x)


class Learner(object):
    def __init__(self, dls, model, loss_func=None, opt_func=None, lr=1e-3, metrics=None):
        self.dls, self.model, self.loss_func, self.lr = dls, model, loss_func, lr
        self.metrics = metrics
        self.opt = None

    def create_opt(self):
        self.opt = torch.optim.AdamW(self.model.parameters(), lr=self.lr, weight_decay=0.01)   # fastai's Adam(wd=0.01)

    def fit_one_cycle(self, n_epoch, lr_max=None, div=25., div_final=1e5, pct_start=0.25, wd=None):
        self.fit(n_epoch, lr=lr_max)

    def fit(self, n_epoch, lr=None):
        if self.opt is None:
            self.create_opt()
        self.model.cuda()                                        # TrainEvalCallback.before_fit: model to dls.device
        print("epoch     train_loss  valid_loss  roc_auc_score  time")
        for epoch in range(n_epoch):
            self._do_epoch_train()

    def _do_epoch_train(self):
        self.model.train()
        for i, b in enumerate(self.dls.train):
            self.one_batch(i, b)

    def one_batch(self, i, b):
        self.iter, self.xb, self.yb = i, b[:2], b[2:]
        self._do_one_batch()

    def _do_one_batch(self):
        self.pred = self.model(*self.xb)
        self.loss_grad = self.loss_func(self.pred, *self.yb)
        self.loss = self.loss_grad.detach()
        self._backward()
        self._step()
        self.opt.zero_grad()

    def _backward(self):
        self.loss_grad.backward()

    def _step(self):
        self.opt.step()


def tabular_learner(dls, layers=None, emb_szs=None, config=None, n_out=2, y_range=None, **kwargs):
    "Get a `Learner` using `dls`, with `metrics`, including a `TabularModel` created using the remaining params."
    if layers is None:
        layers = [200, 100]
    emb_szs = get_emb_sz(dls.train_ds, {} if emb_szs is None else emb_szs)
    model = TabularModel(emb_szs, len(dls.cont_names), n_out, layers, y_range=y_range)
    return Learner(dls, model, loss_func=nn.CrossEntropyLoss(), **kwargs)


class RocAucBinary(object):
    pass


fastai_all = types.ModuleType("fastai.tabular.all")
for _n in ("emb_sz_rule", "Categorify", "FillMissing", "Normalize", "CategoryBlock", "RandomSplitter", "range_of",
           "TabularPandas", "tabular_learner", "RocAucBinary", "get_emb_sz"):
    setattr(fastai_all, _n, globals()[_n])
fastai_all.pd = pd
sys.modules["fastai.tabular.all"] = fastai_all


# ===========================================================================================================
# the notebook's cells
# ===========================================================================================================
from fastai.tabular.all import *  # noqa: E402,F401,F403

try:
    cont_names = ["I%d" % i for i in range(1, 14)]
    cat_names = ["C%d" % i for i in range(1, 27)]
    df = pd.read_csv("../input/criteo-dataset/dac/train.txt", sep="\t", header=None, nrows=2_000_000,
                     names=["label"] + cont_names + cat_names)
    splits = RandomSplitter(valid_pct=0.1, seed=42)(range_of(df))
    to = TabularPandas(df, procs=[Categorify, FillMissing, Normalize], cat_names=cat_names, cont_names=cont_names,
                       y_names="label", y_block=CategoryBlock(), splits=splits)
    dls = to.dataloaders(bs=4096)
    learn = tabular_learner(dls, layers=[400, 400, 400], metrics=RocAucBinary())
    print(sum(p.nbytes for p in learn.model.parameters()) // 4, "parameters")
    learn.fit_one_cycle(3, 2e-3)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
