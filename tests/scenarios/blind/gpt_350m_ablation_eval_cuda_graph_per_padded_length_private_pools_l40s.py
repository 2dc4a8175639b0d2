"""Data-mix ablations on one 8x L40S node: eight independent single-GPU runs (one per card, CUDA_VISIBLE_DEVICES=i)
of a GPT-2-medium-size LM (354M, 24 layers, d=1024, vocab 50304, seq 2048) pretrained from scratch, with a
"fast eval" helper that replays the evaluation forward as CUDA graphs.

The real program: the lab's own train.py, bf16 autocast, AdamW, packed 8 x 2048 training batches, evaluation at
step 0 and every 50 steps on 10 batches of a shuffled held-out loader.  The held-out documents are NOT packed:
the loader uses DataCollatorWithPadding(tokenizer, pad_to_multiple_of=64), so every eval batch is padded to its
own longest document.  Evaluation was launch-bound at batch 8, so someone wrote GraphedEvaluator after the CUDA
graphs docs (whole-network capture): warm up on a side stream, then
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):            # no pool=... : every graph gets its own private memory pool
        static_logits = model(static_ids)
and cache (g, static_ids, static_logits) per (batch, padded length) in self.graphs, which lives for the whole run.

What happens: each new padded length captures a new graph whose private pool keeps its capture's memory
reserved (the live fp32 static logits, 8 x L x 50304 x 4 B, plus the freed bf16 logits and hidden states it
reuses on replay) as long as the graph object lives: 2.4-3.2 GiB per length near 1000-2048 tokens.  The eval
at step 0 captures 3 lengths (11.5 GiB of pools, 6.7 GiB of it live static logits), the eval at step 50 adds
5 more (8 graphs, 26.2 GiB of pools).  Training itself needs ~28 GiB (weights 1.3 + AdamW 2.6 + grads 1.3 GiB,
bf16 activations of 8 x 2048 tokens ~15 GiB, logits + fp32 log_softmax ~7.7 GiB) of the card's 45 GiB, so
the first training step after the second evaluation dies with CUDA OOM (a 128 MiB activation) in its forward,
with ~11 GiB "reserved but unallocated" that sits in the graphs' private pools, although the 50 steps and
the evaluation before ran fine and the training step is the same shape as always.

What an expert says first: the memory is held by CUDA-graph private pools, one per distinct eval shape; cut the
number of shapes (pad eval batches to a fixed length or a couple of buckets, e.g. pad_to_multiple_of=2048 /
max_length padding, drop_last), or share one pool across captures (torch.cuda.graph(g, pool=...)), or drop the
graphs after each evaluation.  Wrong advice: empty_cache or expandable_segments (private pools of live graphs
are not returned to the caching allocator), smaller training batch or gradient checkpointing (the training step
is unchanged and fit 50 times), a bigger card (the pools grow with every new length).
"""
import math
import random

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)


# ---- torch.cuda.CUDAGraph / torch.cuda.graph as far as memory goes (the stand-in torch has no capture):
# while a graph is captured every allocation comes from that graph's own private pool, which stays reserved
# for its replays as long as the graph object lives (PyTorch's torch.cuda.graph(g) without pool=...)
if not hasattr(torch.cuda, "CUDAGraph"):
    class _CUDAGraph(object):
        _pools = [0]

        def __init__(self):
            _CUDAGraph._pools[0] += 1
            self.pool = (1, _CUDAGraph._pools[0])

        def replay(self):
            pass

    class _graph(object):
        def __init__(self, cuda_graph, pool=None, stream=None):
            self.pool = pool if pool is not None else cuda_graph.pool

        def __enter__(self):
            self._empty = plain = torch.empty
            pool = self.pool
            torch.empty = lambda n, *args, **kw: plain(n, *args, pool_id=pool, **kw)
            return self

        def __exit__(self, *exc):
            torch.empty = self._empty
            return False

    torch.cuda.CUDAGraph = _CUDAGraph
    torch.cuda.graph = _graph
# ----


class Config:
    n_layer = 24
    n_head = 16
    d_model = 1024
    vocab_size = 50304
    seq_len = 2048
    train_batch_size = 8
    eval_batch_size = 8
    eval_iters = 10
    eval_interval = 50
    max_steps = 20000
    lr = 3e-4
    seed = 5


cfg = Config()
ID_BYTES = 8      # int64 token ids


def n_tokens(ids):
    return ids.nbytes // ID_BYTES


def keep_for_backward(out, inp):
    """What autograd saves: with grad enabled the output keeps its input alive until backward."""
    if torch.is_grad_enabled():
        out._saved = inp
    return out


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d_in * d_out, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d_out, dtype=torch.float32))
        self.d_out = d_out

    def forward(self, x, tokens):
        return keep_for_backward(torch.empty(tokens * self.d_out, dtype=torch.bfloat16), x)


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.d = d

    def forward(self, x, tokens):
        return keep_for_backward(torch.empty(tokens * self.d, dtype=torch.bfloat16), x)


class Block(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        d = c.d_model
        self.ln1 = LayerNorm(d)
        self.qkv = Linear(d, 3 * d)
        self.proj = Linear(d, d)
        self.ln2 = LayerNorm(d)
        self.fc = Linear(d, 4 * d)
        self.fc_out = Linear(4 * d, d)
        self.d = d

    def forward(self, x, tokens):
        qkv = self.qkv(self.ln1(x, tokens), tokens)
        att = keep_for_backward(torch.empty(tokens * self.d, dtype=torch.bfloat16), qkv)   # F.sdpa, flash
        x = keep_for_backward(torch.empty(tokens * self.d, dtype=torch.float32), self.proj(att, tokens))
        h = self.fc(self.ln2(x, tokens), tokens)
        h = keep_for_backward(torch.empty(tokens * 4 * self.d, dtype=torch.bfloat16), h)       # gelu
        return keep_for_backward(torch.empty(tokens * self.d, dtype=torch.float32), self.fc_out(h, tokens))


class TransformerLM(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.tok_emb = torch.nn.Parameter(torch.empty(c.vocab_size * c.d_model, dtype=torch.float32))
        self.pos_emb = torch.nn.Parameter(torch.empty(c.seq_len * c.d_model, dtype=torch.float32))
        self.blocks = [Block(c) for _ in range(c.n_layer)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)
        self.ln_f = LayerNorm(c.d_model)

    def forward(self, ids, labels=None):
        tokens = n_tokens(ids)
        x = keep_for_backward(torch.empty(tokens * self.c.d_model, dtype=torch.float32), ids)
        for block in self.blocks:
            x = block(x, tokens)
        x = self.ln_f(x, tokens)
        logits = keep_for_backward(torch.empty(tokens * self.c.vocab_size, dtype=torch.bfloat16), x)  # tied head
        logits = keep_for_backward(torch.empty(tokens * self.c.vocab_size, dtype=torch.float32), logits)  # .float()
        if labels is None:
            return logits
        return F.cross_entropy(logits, labels)


class GraphedEvaluator(object):
    """Replays the eval forward as a CUDA graph per input shape (eval is launch-bound at batch 8)."""

    def __init__(self, model):
        self.model = model
        self.graphs = {}          # (batch, padded_len) -> (graph, static_ids, static_logits)

    def _capture(self, bsz, seqlen):
        static_ids = torch.empty(ID_BYTES * bsz * seqlen)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for _ in range(3):                       # warm-up on a side stream before capture
                self.model(static_ids)
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                static_logits = self.model(static_ids)
        self.graphs[(bsz, seqlen)] = (g, static_ids, static_logits)

    def __call__(self, ids, bsz, seqlen):
        key = (bsz, seqlen)
        if key not in self.graphs:
            self._capture(bsz, seqlen)
        g, static_ids, static_logits = self.graphs[key]
        # static_ids.copy_(ids)
        g.replay()
        return static_logits


class HeldOutLoader(object):
    """Shuffled held-out documents, batched and padded like DataCollatorWithPadding(pad_to_multiple_of=64)."""

    def __init__(self, doc_lengths, batch_size, pad_to_multiple_of=64, seed=0):
        self.doc_lengths = doc_lengths
        self.batch_size = batch_size
        self.multiple = pad_to_multiple_of
        self.rng = random.Random(seed)

    def __iter__(self):
        order = list(range(len(self.doc_lengths)))
        self.rng.shuffle(order)
        for i in range(0, len(order) - self.batch_size + 1, self.batch_size):
            longest = max(self.doc_lengths[j] for j in order[i:i + self.batch_size])
            padded = -(-longest // self.multiple) * self.multiple
            ids = torch.empty(ID_BYTES * self.batch_size * padded)       # input_ids.to("cuda")
            labels = torch.empty(ID_BYTES * self.batch_size * padded)
            yield ids, labels, self.batch_size, padded


class PackedTrainLoader(object):
    """Pre-tokenized shards packed into seq_len blocks."""

    def __init__(self, batch_size, seq_len):
        self.batch_size, self.seq_len = batch_size, seq_len

    def next_batch(self):
        x = torch.empty(ID_BYTES * self.batch_size * self.seq_len)
        y = torch.empty(ID_BYTES * self.batch_size * self.seq_len)
        return x, y


def evaluate(model, evaluator, val_loader):
    model.eval()
    losses = []
    for i, (ids, labels, bsz, seqlen) in enumerate(val_loader):
        if i == cfg.eval_iters:
            break
        logits = evaluator(ids, bsz, seqlen)
        with torch.no_grad():
            loss = F.cross_entropy(logits, labels)
        losses.append(0.0)       # loss.item()
    model.train()
    return sum(losses) / max(len(losses), 1)


def main():
    torch.cuda.set_device(0)
    rng = random.Random(cfg.seed)
    held_out = [min(cfg.seq_len, int(math.exp(rng.gauss(math.log(420), 1.0))) + 8) for _ in range(20000)]

    model = TransformerLM(cfg)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    evaluator = GraphedEvaluator(model)
    val_loader = HeldOutLoader(held_out, cfg.eval_batch_size, pad_to_multiple_of=64, seed=cfg.seed)
    train_loader = PackedTrainLoader(cfg.train_batch_size, cfg.seq_len)

    for step in range(cfg.max_steps):
        if step % cfg.eval_interval == 0:
            val_loss = evaluate(model, evaluator, val_loader)
            print("step %d: val loss %.4f, %d eval graphs cached" % (step, val_loss, len(evaluator.graphs)))
        x, y = train_loader.next_batch()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(x, y)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
