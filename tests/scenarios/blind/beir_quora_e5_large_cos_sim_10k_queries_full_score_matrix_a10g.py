"""BEIR Quora retrieval evaluation of e5-large-v2 on an A10G (24 GB): util.cos_sim over all queries at once.

The real script (eval_quora.py, sentence-transformers 3.x, beir for the data and the metrics):

    model = SentenceTransformer("intfloat/e5-large-v2", device="cuda")          # fp32, 335M params
    corpus, queries, qrels = GenericDataLoader("datasets/quora").load(split="test")
    chunks = []
    for i in range(0, len(doc_ids), 50_000):                                    # tokenizer RAM
        chunks.append(model.encode(["passage: " + corpus[d]["text"] for d in doc_ids[i:i + 50_000]],
                                   batch_size=1024, convert_to_tensor=True))
    corpus_emb = torch.cat(chunks); del chunks
    query_emb = model.encode(["query: " + queries[q] for q in qids], batch_size=1024, convert_to_tensor=True)
    scores = util.cos_sim(query_emb, corpus_emb)                                # <- OOM
    top = torch.topk(scores, k=100, dim=1)
    ndcg, _map, recall, precision = EvaluateRetrieval.evaluate(qrels, to_run(top), [1, 10, 100])

What happens: BEIR's Quora split is a duplicate-question task with a large query set: 10,000 test
queries against 522,931 corpus questions.  Encoding succeeds (the corpus embeddings are 522,931 x 1024
fp32 = 2.0 GiB, the queries 40 MiB).  Then util.cos_sim normalises both sides (a second 2.0 GiB copy of
the corpus embeddings) and multiplies them: the score matrix is 10,000 x 522,931 fp32 = 20.9 GB =
19.48 GiB, asked for in one piece.  The A10G has 22.5 GiB; the CUDA context (~0.5 GiB), the model
(1.25 GiB), the corpus embeddings and their normalised copy (4.0 GiB) leave ~16.7 GiB.  The mm fails
asking 19.48 GiB (shortfall ~2.8 GiB).  Nothing here has autograd: encode() runs under no_grad and the
embeddings are leaves without grad.

What an expert says first: the job is fine, the one operation is not -- never materialise the full
query x corpus score matrix.  Score the queries in chunks (e.g. 1,000 queries, or the corpus in 50k
shards as BEIR's DenseRetrievalExactSearch does with corpus_chunk_size) and keep only the running
top-100 per query (or put the corpus in a faiss index).  fp16 embeddings would also halve the matrix
(9.7 GiB) but only postpone the problem for a bigger query set.
Wrong advice: a smaller encode batch_size (the encode is long done; 1024 is not what failed), gradient
checkpointing or inference_mode (there is no autograd graph at all), expandable_segments / empty_cache
(the request is one 19.5 GiB block larger than all free memory, not a fragmentation).
"""
import torch

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_NAME = "intfloat/e5-large-v2"
HIDDEN, FFN, LAYERS, VOCAB, MAX_POS = 1024, 4096, 24, 30522, 512
N_CORPUS = 522_931          # BEIR quora corpus
N_QUERIES = 10_000          # BEIR quora test queries
ENCODE_CHUNK = 50_000
batch_size = 1024           # SentenceTransformer.encode batch
SEQ = 32                    # quora questions are short: ~15-30 word pieces, padded per batch
TOP_K = 100


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList: children under the keys "0" ... "n-1"."""

    def __init__(self, modules):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        torch.nn.Module.__init__(self)
        self.d_in, self.d_out = d_in, d_out
        self.weight = _weight(d_in * d_out)
        self.bias = _weight(d_out)

    def forward(self, x, tokens):
        return torch.empty(tokens * self.d_out, dtype=torch.float32)


class BertSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = Linear(HIDDEN, HIDDEN)
        self.key = Linear(HIDDEN, HIDDEN)
        self.value = Linear(HIDDEN, HIDDEN)
        self.output = Linear(HIDDEN, HIDDEN)

    def forward(self, x, tokens):
        q, k, v = self.query(x, tokens), self.key(x, tokens), self.value(x, tokens)
        ctx = torch.empty_like(v)                      # scaled_dot_product_attention(q, k, v)
        del q, k, v
        return self.output(ctx, tokens)


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = BertSelfAttention()
        self.intermediate = Linear(HIDDEN, FFN)
        self.output = Linear(FFN, HIDDEN)

    def forward(self, x, tokens):
        a = self.attention(x, tokens)
        h = self.intermediate(a, tokens)
        return self.output(h, tokens)


class BertModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = _weight(VOCAB * HIDDEN)
        self.position_embeddings = _weight(MAX_POS * HIDDEN)
        self.layer = ModuleList([BertLayer() for _ in range(LAYERS)])

    def forward(self, input_ids, tokens):
        x = torch.empty(tokens * HIDDEN, dtype=torch.float32)
        for blk in self.layer:
            x = blk(x, tokens)
        return x


class SentenceTransformer(object):
    """What sentence_transformers.SentenceTransformer does for encode(convert_to_tensor=True): batches
    under no_grad, mean pooling, every batch's embeddings kept on the device, stacked at the end."""

    def __init__(self, name, device="cuda"):
        self.name = name
        self.model = BertModel()
        self.model.eval()

    def encode(self, n_sentences, batch_size=32, convert_to_tensor=False):
        all_embeddings = []
        with torch.no_grad():
            for start in range(0, n_sentences, batch_size):
                b = min(batch_size, n_sentences - start)
                ids = torch.empty(b * SEQ, dtype=torch.int8)
                hidden = self.model(ids, b * SEQ)
                all_embeddings.append(torch.empty(b * HIDDEN, dtype=torch.float32))    # mean pooling
                del hidden, ids
            out = torch.empty(n_sentences * HIDDEN, dtype=torch.float32)                # torch.stack
            del all_embeddings
        return out


# --- sentence_transformers.util.cos_sim, as the library writes it
def normalize_embeddings(emb):
    return torch.empty_like(emb)                        # torch.nn.functional.normalize(emb, p=2, dim=1)


def cos_sim(a, b, n_a, n_b):
    a_norm = normalize_embeddings(a)
    b_norm = normalize_embeddings(b)
    return torch.empty(n_a * n_b, dtype=torch.float32)  # torch.mm(a_norm, b_norm.transpose(0, 1))


def encode_corpus(model, n_docs):
    chunks = []
    for start in range(0, n_docs, ENCODE_CHUNK):
        n = min(ENCODE_CHUNK, n_docs - start)
        chunks.append(model.encode(n, batch_size=batch_size, convert_to_tensor=True))
    corpus_emb = torch.empty(n_docs * HIDDEN, dtype=torch.float32)                     # torch.cat(chunks)
    del chunks
    return corpus_emb


def main():
    model = SentenceTransformer(MODEL_NAME, device="cuda")
    corpus_emb = encode_corpus(model, N_CORPUS)
    query_emb = model.encode(N_QUERIES, batch_size=batch_size, convert_to_tensor=True)
    print("encoded %d passages and %d queries" % (N_CORPUS, N_QUERIES))
    scores = cos_sim(query_emb, corpus_emb, N_QUERIES, N_CORPUS)
    top = torch.empty(N_QUERIES * TOP_K * 12)           # torch.topk: values + int64 indices
    print("ranked", top.nbytes, scores.nbytes)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
