"""train_retriever.py -- fine-tuning a BERT-base bi-encoder (dense passage retriever, 110M parameters, one
encoder shared by queries and passages) on MS MARCO with online hard-negative mining, on a server with two
A100-SXM4-40GB.  Single process (`python train_retriever.py`, no torchrun, no device map): everything goes to
"cuda", i.e. GPU 0.  Run with plain `LD_PRELOAD=liboomguard.so python train_retriever.py`:

    model = AutoModel.from_pretrained("bert-base-uncased").cuda()
    miner = HardNegativeMiner(model, corpus)      # encodes all 8,841,823 passages once, under no_grad,
                                                  # into one fp32 matrix on the GPU (exact MIPS by matmul)
    for queries, positives in loader:             # 32 queries a step
        negs = miner.mine(queries, k=7)           # q @ corpus_emb.T, top-k: 7 hard negatives per query
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q = model(queries); p = model(positives + negs)      # 32 x 8 = 256 passages x 192 tokens
            loss = contrastive(q, p)              # in-batch + hard negatives
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The corpus matrix is 8,841,823 x 768 x 4 B = 25.3 GiB (fp32: the encoder ran without autocast), kept on GPU 0
for the whole run so that every step can search it.  The training step itself needs ~20 GiB (weights,
gradients and AdamW 1.6 GiB; bf16 activations of 256 passages x 192 tokens through 12 layers ~18 GiB): alone
it fits an A100 40GB, and so does the corpus matrix alone -- but not both on one card: the first step's
passage forward runs out part way through the encoder.  GPU 1 holds nothing at all (nvidia-smi: 0 MiB).

An expert says first: the index does not belong on the training GPU -- put corpus_emb on the idle GPU 1 and
search there (only the 32 query vectors and the top-k ids cross), or keep it off the GPU (faiss on the CPU,
or an fp16 / PQ-compressed index: 12.6 GiB / ~1 GiB).  Wrong advice: expandable_segments / empty_cache
(nothing is cached or fragmented: 25 GiB are live), a bigger GPU (there is a second 40 GB card idle), mixed
precision (the step is already bf16), ZeRO/FSDP sharding (a 110M model's state is 1.6 GiB), stopping other
processes (there are none), inference_mode (training).  A smaller batch or checkpointing would squeeze it
in, at the cost of in-batch negatives or speed, while 40 GB sit unused.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, FFN, LAYERS, HEADS, VOCAB = 768, 3072, 12, 12, 30522
N_PASSAGES = 8841823
QUERIES, PASSAGES_PER_QUERY, P_LEN, Q_LEN = 32, 8, 192, 32
ENCODE_BATCH = 512
ENCODE_BATCHES_RUN = 48      # the stand-in runs the first 48 batches: the rest only fill rows of corpus_emb
BF16 = torch.bfloat16
GiB = 1 << 30


def _reads_weights(module):
    """The layer's matmuls read every weight below it (what puts them in autograd's graph)."""
    for m in module.modules():
        for name in list(m._parameters):
            getattr(m, name)


def _kept(elems, prev, dtype=BF16):
    t = torch.empty(elems, dtype=dtype, device="cuda")
    t._saved = prev
    return t


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(n_in * n_out, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(n_out, dtype=torch.float32, device="cuda"))


class BertLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = nn.Module()
        self.attention.self = nn.Module()
        self.attention.self.query = Linear(HIDDEN, HIDDEN)
        self.attention.self.key = Linear(HIDDEN, HIDDEN)
        self.attention.self.value = Linear(HIDDEN, HIDDEN)
        self.attention.output = nn.Module()
        self.attention.output.dense = Linear(HIDDEN, HIDDEN)
        self.intermediate = nn.Module()
        self.intermediate.dense = Linear(HIDDEN, FFN)
        self.output = nn.Module()
        self.output.dense = Linear(FFN, HIDDEN)

    def forward(self, hidden, seqs, seq_len):
        """What one layer keeps for backward (bf16 autocast): q, k, v, attention probabilities and their
        dropout, context, attention output, FFN in and out.  Under no_grad nothing is kept: each tensor
        goes as soon as the next is made."""
        _reads_weights(self)
        tokens = seqs * seq_len
        probs = seqs * HEADS * seq_len * seq_len
        act = BF16 if torch.is_autocast_enabled() else torch.float32
        h = hidden
        for elems, dtype in ((tokens * HIDDEN, act), (tokens * HIDDEN, act), (tokens * HIDDEN, act),
                             (probs, act), (probs, torch.uint8), (probs, act), (tokens * HIDDEN, act),
                             (tokens * HIDDEN, act), (tokens * FFN, act), (tokens * FFN, act)):
            h = _kept(elems, h if torch.is_grad_enabled() else None, dtype)
        return _kept(tokens * HIDDEN, h if torch.is_grad_enabled() else None, act)


class BertModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = nn.Module()
        self.embeddings.word_embeddings = nn.Module()
        self.embeddings.word_embeddings.weight = nn.Parameter(
            torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.embeddings.position_embeddings = nn.Module()
        self.embeddings.position_embeddings.weight = nn.Parameter(
            torch.empty(512 * HIDDEN, dtype=torch.float32, device="cuda"))
        self.encoder = nn.Module()
        self.encoder.layer = nn.Module()
        for i in range(LAYERS):
            setattr(self.encoder.layer, str(i), BertLayer())

    def forward(self, input_ids, seqs, seq_len):
        _reads_weights(self.embeddings)
        h = _kept(seqs * seq_len * HIDDEN, input_ids if torch.is_grad_enabled() else None)
        for i in range(LAYERS):
            h = getattr(self.encoder.layer, str(i))(h, seqs, seq_len)
        return _kept(seqs * HIDDEN, h if torch.is_grad_enabled() else None, torch.float32)   # [CLS]


class HardNegativeMiner(object):
    """Exact maximum-inner-product search over the whole corpus, on the GPU the model is on."""

    def __init__(self, model, n_passages):
        self.model = model
        self.corpus_emb = torch.empty(n_passages * HIDDEN, dtype=torch.float32, device="cuda")   # 25.3 GiB
        with torch.no_grad():
            for start in range(0, n_passages, ENCODE_BATCH)[:ENCODE_BATCHES_RUN]:
                ids = torch.empty(ENCODE_BATCH * P_LEN * 8, device="cuda")
                emb = self.model(ids, min(ENCODE_BATCH, n_passages - start), P_LEN)
                del ids, emb                                # copied into self.corpus_emb[start:end]

    def mine(self, query_ids, k):
        with torch.no_grad():
            q = self.model(query_ids, QUERIES, Q_LEN)
            scores = torch.empty(QUERIES * N_PASSAGES, dtype=torch.float32, device="cuda")  # q @ corpus_emb.T
            top = torch.empty(QUERIES * (k + 1) * 8, device="cuda")                          # topk indices
            del scores, q
        return top


def loader():
    for step in range(100000):
        yield (torch.empty(QUERIES * Q_LEN * 8, device="cuda"),
               torch.empty(QUERIES * PASSAGES_PER_QUERY * P_LEN * 8, device="cuda"))


model = BertModel()                                          # .from_pretrained("bert-base-uncased").cuda()
miner = HardNegativeMiner(model, N_PASSAGES)
print("corpus encoded: %.1f GiB allocated on GPU 0" % (torch.cuda.memory_allocated() / GiB))
model.train()
optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)

try:
    for step, (queries, passages) in enumerate(loader()):
        negs = miner.mine(queries, k=7)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q = model(queries, QUERIES, Q_LEN)
            p = model(passages, QUERIES * PASSAGES_PER_QUERY, P_LEN)
            scores = F.log_softmax(p, -1)                    # q @ p.T over in-batch + hard negatives
            loss = F.nll_loss(scores, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del q, p, scores, loss, negs
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
