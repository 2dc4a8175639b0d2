"""train_retriever.py -- fine-tuning bge-base-en-v1.5 (110M parameters, fp32, 0.4 GiB) as a biomedical
dense retriever on PubMed title -> abstract pairs, with the in-batch-negatives InfoNCE loss, on one A100
40GB, fp16 autocast + GradScaler.  The paper being reproduced uses 1024 pairs per batch (1023 negatives
per query); the first try at batch 1024 died in the forward pass, so the author "micro-batched" the
encoding:

    q_embs, p_embs = [], []
    with torch.autocast("cuda", dtype=torch.float16):
        for i in range(0, len(titles), chunk_size):                 # chunk_size = 64
            q_embs.append(encode(model, titles[i:i + chunk_size], 32))
            p_embs.append(encode(model, abstracts[i:i + chunk_size], 256))
        q, p = torch.cat(q_embs), torch.cat(p_embs)
        loss = F.cross_entropy(q @ p.T / 0.02, labels)
    scaler.scale(loss).backward()

Chunking the forward pass changes nothing about memory: each chunk's embeddings are appended with their
autograd graph, and every graph -- 12 layers of activations, ~96 MiB per 256-token abstract, 6.8 GiB per
chunk of 64 pairs -- stays alive until the single backward at the end, so the 16 chunks need what the
whole batch needed (~108 GiB).  The first training step fails in the forward pass of the 6th chunk's
abstracts (a 24 MiB request inside the encoder) with five chunks' graphs (34 GiB) held through the two
lists.  Nothing is cached, nothing leaks across steps: this is one step's graph.

An expert: the loss couples all 1024 embeddings, so the chunks' graphs must not all be kept.  Use the
gradient cache (GradCache; sentence-transformers' CachedMultipleNegativesRankingLoss): embed every chunk
under no_grad, compute the loss and its gradient w.r.t. the 2048 embeddings, then re-encode chunk by chunk
with grad and backpropagate that gradient (one chunk's activations at a time, ~7 GiB).  Gradient
checkpointing of the encoder also fits (only each layer's input kept: ~10 GiB for the batch).  Wrong first
advice: a smaller batch or "backward per micro-batch" (each chunk's own loss has 63 negatives instead of
1023: a different objective, the very thing the 1024 batch is for), dropping the references to the
embeddings (the loss needs them), empty_cache/expandable_segments (nothing is cached), mixed precision (it
is already fp16), inference_mode (this is training).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch / transformers have and the stand-ins lack, mirrored in plain Python (compiled as
# torch's own files, so that frames in them count as the framework's): tensor shapes, torch.cat, CLS
# slicing, F.normalize, F.scaled_dot_product_attention, matmul/transpose, arithmetic on the loss, Tensor.backward freeing the graph,
# Embedding/Linear/LayerNorm/GELU/Dropout, a GradScaler, and a fast tokenizer's output moved to the GPU.
_TENSOR_OPS = r'''
from torch.autograd._graph import derive
_ITEM = {"float32": 4, "float16": 2, "bfloat16": 2, "uint8": 1, "int8": 1}

def _numel(shape):
    n = 1
    for s in shape:
        n *= int(s)
    return n

def _op(shape, dtype, *inputs):
    out = torch.empty(_numel(shape), dtype=dtype, device="cuda")
    out.shape = tuple(shape)
    out._saved = inputs[0] if len(inputs) == 1 else tuple(inputs)
    return derive(out, *inputs)

def cat(tensors, dim=0):
    shape = (sum(t.shape[0] for t in tensors),) + tuple(tensors[0].shape[1:])
    return _op(shape, tensors[0].dtype, *tensors)

def _getitem(self, idx):                    # hidden[:, 0]: a view of the CLS position (storage shared)
    v = self.view()
    v.shape = (self.shape[0],) + tuple(self.shape[2:])
    v._saved = self
    return v

def _T(self):
    v = self.view()
    v.shape = tuple(reversed(self.shape))
    v._saved = self
    return v

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0):
    out = _op(query.shape, query.dtype, query, key, value)
    out.logsumexp = torch.empty(_numel(query.shape[:-1]) * 4, device="cuda")    # saved for backward
    return out

def _matmul(self, other):
    dtype = "float16" if torch.is_autocast_enabled() else self.dtype
    return _op((self.shape[0], other.shape[-1]), dtype, self, other)

def _scalar(self, other=None):
    return _op(getattr(self, "shape", (1,)), self.dtype, self)

def normalize(input, p=2.0, dim=-1):
    return _op(input.shape, "float32", input)

_plain_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if s is None:
            continue
        t._saved = None
        todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, torch.Tensor))
'''
_ns = {"torch": torch}
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), _ns)
torch.cat = _ns["cat"]
torch.Tensor.__getitem__ = _ns["_getitem"]
torch.Tensor.T = property(_ns["_T"])
torch.Tensor.__matmul__ = _ns["_matmul"]
torch.Tensor.__truediv__ = torch.Tensor.__mul__ = torch.Tensor.__rmul__ = _ns["_scalar"]
torch.Tensor.backward = _ns["_backward"]
F.normalize = _ns["normalize"]
F.scaled_dot_product_attention = _ns["scaled_dot_product_attention"]

_NN_OPS = r'''
from torch.nn.modules.module import Module
from torch.nn.parameter import Parameter

def _param(*shape):
    p = Parameter(torch.empty(_numel(shape), dtype="float32", device="cuda"))
    p.shape = tuple(shape)
    return p

def _act(x, width, dtype=None):
    dtype = dtype or ("float16" if torch.is_autocast_enabled() else "float32")
    return _op(tuple(x.shape[:-1]) + (width,), dtype, x)

class Embedding(Module):
    def __init__(self, num, dim):
        Module.__init__(self)
        self.weight = _param(num, dim)
        self.dim = dim
    def forward(self, ids):
        return _op(tuple(ids.shape) + (self.dim,), "float32", ids)

class Linear(Module):
    def __init__(self, fin, fout):
        Module.__init__(self)
        self.weight = _param(fout, fin)
        self.bias = _param(fout)
        self.out_features = fout
    def forward(self, x):
        return _act(x, self.out_features)

class LayerNorm(Module):
    def __init__(self, dim, eps=1e-12):
        Module.__init__(self)
        self.weight = _param(dim)
        self.bias = _param(dim)
    def forward(self, x):
        return _act(x, x.shape[-1], "float32")         # autocast runs layer_norm in fp32

class GELU(Module):
    def forward(self, x):
        return _act(x, x.shape[-1], x.dtype)

class Dropout(Module):
    def __init__(self, p=0.1):
        Module.__init__(self)
        self.p = p
    def forward(self, x):
        if not self.training:
            return x
        mask = _act(x, x.shape[-1], "uint8")           # the mask kept for backward
        return _act(mask, x.shape[-1], x.dtype)

class GradScaler(object):
    def __init__(self, device="cuda", init_scale=65536.0):
        self._scale = init_scale
    def scale(self, outputs):
        return outputs
    def step(self, optimizer):
        return optimizer.step()
    def update(self):
        pass
'''
_ns.update(_numel=_ns["_numel"], _op=_ns["_op"])
exec(compile(_NN_OPS, torch.nn.modules.module.__file__, "exec"), _ns)
nn.Embedding, nn.Linear, nn.LayerNorm, nn.GELU, nn.Dropout = (_ns["Embedding"], _ns["Linear"], _ns["LayerNorm"],
                                                              _ns["GELU"], _ns["Dropout"])
torch.amp = type(sys)("torch.amp")
torch.amp.GradScaler = _ns["GradScaler"]

_TOKENIZER = r'''
class BatchEncoding(dict):
    def to(self, device):
        for k, shape in self.pop("_shapes").items():
            t = torch.empty(_numel(shape) * 8, device=device)        # int64
            t.shape = shape
            self[k] = t
        return self

class BertTokenizerFast(object):
    """AutoTokenizer.from_pretrained("BAAI/bge-base-en-v1.5"): padding=True pads to the longest in the call."""
    def __call__(self, texts, padding=True, truncation=True, max_length=512, return_tensors="pt"):
        longest = min(max(t.n_tokens for t in texts), max_length)
        enc = BatchEncoding()
        enc["_shapes"] = {"input_ids": (len(texts), longest), "attention_mask": (len(texts), longest)}
        return enc
'''
exec(compile(_TOKENIZER, torch.__file__, "exec"), _ns)
BertTokenizerFast = _ns["BertTokenizerFast"]
# --- end of the stand-in additions; the user's program follows


class BertLayer(nn.Module):
    def __init__(self, h=768, inter=3072):
        nn.Module.__init__(self)
        self.query, self.key, self.value = nn.Linear(h, h), nn.Linear(h, h), nn.Linear(h, h)
        self.attn_out = nn.Linear(h, h)
        self.attn_dropout = nn.Dropout(0.1)
        self.attn_norm = nn.LayerNorm(h)
        self.intermediate = nn.Linear(h, inter)
        self.act = nn.GELU()
        self.output = nn.Linear(inter, h)
        self.out_dropout = nn.Dropout(0.1)
        self.out_norm = nn.LayerNorm(h)

    def forward(self, x, attention_mask):
        q, k, v = self.query(x), self.key(x), self.value(x)
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, dropout_p=0.1)
        x = self.attn_norm(self.attn_dropout(self.attn_out(ctx)))
        return self.out_norm(self.out_dropout(self.output(self.act(self.intermediate(x)))))


class ModelOutput(object):
    def __init__(self, last_hidden_state):
        self.last_hidden_state = last_hidden_state


class BertModel(nn.Module):
    """AutoModel.from_pretrained("BAAI/bge-base-en-v1.5")."""

    def __init__(self, vocab=30522, h=768, layers=12):
        nn.Module.__init__(self)
        self.word_embeddings = nn.Embedding(vocab, h)
        self.position_embeddings = nn.Embedding(512, h)
        self.emb_norm = nn.LayerNorm(h)
        self.n = layers
        for i in range(layers):
            setattr(self, "layer_%d" % i, BertLayer(h))

    def forward(self, input_ids, attention_mask):
        x = self.emb_norm(self.word_embeddings(input_ids))
        for i in range(self.n):
            x = getattr(self, "layer_%d" % i)(x, attention_mask)
        return ModelOutput(x)


class Text(object):
    def __init__(self, n_tokens):
        self.n_tokens = n_tokens


def pubmed_pairs(step, n):
    """(title, abstract) pairs: titles ~20-32 tokens, abstracts truncated at 256 (most are longer)."""
    return ([Text(20 + (step + i) % 13) for i in range(n)], [Text(230 + (step * 7 + i) % 90) for i in range(n)])


tokenizer = BertTokenizerFast()


def encode(model, texts, max_length):
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt").to("cuda")
    out = model(**batch)
    return F.normalize(out.last_hidden_state[:, 0], dim=-1)      # CLS pooling, as bge


def main():
    batch_size, chunk_size, temperature = 1024, 64, 0.02
    model = BertModel()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cuda")
    labels = torch.empty(batch_size * 8, device="cuda")             # arange(batch_size): the diagonal
    for step in range(20000):
        titles, abstracts = pubmed_pairs(step, batch_size)
        q_embs, p_embs = [], []
        with torch.autocast("cuda", dtype=torch.float16):
            for i in range(0, len(titles), chunk_size):
                q_embs.append(encode(model, titles[i:i + chunk_size], 32))
                p_embs.append(encode(model, abstracts[i:i + chunk_size], 256))
            q, p = torch.cat(q_embs), torch.cat(p_embs)
            scores = q @ p.T / temperature
            loss = F.cross_entropy(scores, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        del q_embs, p_embs, q, p, scores, loss
        if step % 50 == 0:
            print("step", step, "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
