"""rerank_eval.py -- offline evaluation of a product-search retrieval stack on one NVIDIA L4 (24 GB) of the
team's GCP inference VM.  Candidate generation is the recommendation team's two-tower model, trained with
TensorFlow Recommenders and shipped as a SavedModel (the query tower: string lookup, 2M x 64 query-token
embedding, two dense layers -- about 0.5 GB); the item embeddings sit in a FAISS IVF index in host memory.
The search team reranks the top 100 with a PyTorch cross-encoder, BAAI/bge-reranker-large (XLM-RoBERTa
large, 560M parameters, float16: 1.1 GB):

    import tensorflow as tf
    import torch
    from transformers import AutoTokenizer, AutoModelForSequenceClassification

    query_tower = tf.saved_model.load("gs://.../query_tower/3")
    reranker = AutoModelForSequenceClassification.from_pretrained(
        "BAAI/bge-reranker-large", torch_dtype=torch.float16).cuda().eval()
    for q in dev_queries:
        q_emb = query_tower(tf.constant([q])).numpy()
        _, ids = item_index.search(q_emb, 100)                           # faiss.IndexIVFFlat, CPU
        pairs = tok([q] * 100, [titles[i] for i in ids[0]], padding=True, truncation=True,
                    max_length=512, return_tensors="pt").to("cuda")
        with torch.inference_mode():
            scores = reranker(**pairs).logits.squeeze(-1)

(transformers 4.38: XLM-R's eager attention, [100, 16, 512, 512] float16 scores = 800 MiB per tensor.)  The
reranker alone was benchmarked at about 3 GB peak on this card.  The combined script dies at the first
query, inside the reranker's first attention layer: "Tried to allocate 800.00 MiB ... of which 640.00 MiB is
free" on a 22.5 GiB card where PyTorch holds 1.6 GiB.  TensorFlow, at its first op (restoring the
SavedModel's variables onto the GPU), initialised its GPU runtime, and its BFC allocator reserved nearly all
the free memory -- 19.8 GiB -- for itself, as it does by default, to hold a query tower of half a gigabyte.

An expert: stop TensorFlow from grabbing the GPU: tf.config.experimental.set_memory_growth(gpu, True) (or
TF_FORCE_GPU_ALLOW_GROWTH=true) before TF's first op, or cap it with a logical device memory_limit -- or, as
the query tower is tiny, hide the GPU from TensorFlow (tf.config.set_visible_devices([], "GPU")) and run it
on the CPU.  Nothing about the reranker needs to change.
Wrong first advice: a smaller rerank batch / fewer candidates (the reranker needs ~3 GB of a 22.5 GiB card),
quantizing or offloading the reranker (it is 1.1 GB), mixed precision or inference_mode (already float16
under inference_mode), flash / SDPA attention (it would drop the 800 MiB score tensors and might squeeze
into the 2 GiB TensorFlow left over, while 19.8 GiB stay locked for a 0.5 GB model and the next longer batch
fails again),
expandable_segments / empty_cache (PyTorch caches nothing), "close other processes" (TensorFlow is in this
process; nvidia-smi shows one python), a bigger GPU.
"""
import sys
import types

import tensorflow as tf
import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: tf.saved_model.load, tf.constant (TensorFlow), torch int64.  The loaded SavedModel's
# variables are restored onto the GPU: TensorFlow's first op there initialises its runtime and allocator.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8


class _LoadedQueryTower(object):
    """what tf.saved_model.load returns: a trackable object with the restored variables, callable"""

    def __init__(self, path):
        self.path = path
        self.variables = [
            tf.zeros([2_000_000, 64], tf.float32),     # query-token embedding (StringLookup vocabulary)
            tf.zeros([64 * 3, 256], tf.float32),       # dense 1
            tf.zeros([256, 128], tf.float32),          # dense 2 (the 128-d query embedding)
        ]

    def __call__(self, queries):
        return tf.zeros([len(queries.value), 128], tf.float32)


class _Constant(object):
    def __init__(self, value):
        self.value = value


if not hasattr(tf, "saved_model"):
    tf.saved_model = types.SimpleNamespace(load=lambda path, tags=None, options=None: _LoadedQueryTower(path))
if not hasattr(tf, "constant"):
    tf.constant = _Constant
# ----

device = "cuda"
H, HEADS, FFN, LAYERS, VOCAB = 1024, 16, 4096, 24, 250002


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float16, device=device))


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * H * H + 4 * H + 2 * H)
        self.intermediate = _param(H * FFN + FFN)
        self.output = _param(FFN * H + H + 2 * H)

    def forward(self, hidden, batch, seq):
        T = batch * seq
        q = torch.empty(T * H, dtype=torch.float16, device=device)
        k = torch.empty(T * H, dtype=torch.float16, device=device)
        v = torch.empty(T * H, dtype=torch.float16, device=device)
        scores = torch.empty(batch * HEADS * seq * seq, dtype=torch.float16, device=device)   # q @ k.T
        scaled = torch.empty(batch * HEADS * seq * seq, dtype=torch.float16, device=device)   # / sqrt(d)
        del scores
        masked = torch.empty(batch * HEADS * seq * seq, dtype=torch.float16, device=device)   # + mask
        del scaled
        probs = torch.empty(batch * HEADS * seq * seq, dtype=torch.float16, device=device)    # softmax
        del masked
        ctx = torch.empty(T * H, dtype=torch.float16, device=device)                         # probs @ v
        del q, k, v, probs
        attn_out = torch.empty(T * H, dtype=torch.float16, device=device)
        del ctx
        inter = torch.empty(T * FFN, dtype=torch.float16, device=device)
        out = torch.empty(T * H, dtype=torch.float16, device=device)
        del inter, attn_out
        return out


class XLMRobertaForSequenceClassification(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = _param(VOCAB * H + 514 * H + H + 2 * H)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, XLMRobertaLayer())
        self.classifier = _param(H * H + H + H + 1)

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids.shape
        hidden = torch.empty(batch * seq * H, dtype=torch.float16, device=device)
        for i in range(LAYERS):
            hidden = getattr(self, "layer%d" % i)(hidden, batch, seq)
        return torch.empty(batch, dtype=torch.float16, device=device)   # logits


AutoModelForSequenceClassification = XLMRobertaForSequenceClassification


class Encoding(object):
    """the tokenizer's BatchEncoding after .to("cuda"): input_ids, attention_mask [pairs, 512] int64"""

    def __init__(self, pairs, seq):
        self.shape = (pairs, seq)
        self.input_ids = torch.empty(pairs * seq, dtype=torch.int64, device=device)
        self.attention_mask = torch.empty(pairs * seq, dtype=torch.int64, device=device)


def main():
    query_tower = tf.saved_model.load("gs://search-models/two_tower/query_tower/3")
    reranker = AutoModelForSequenceClassification.from_pretrained(
        "BAAI/bge-reranker-large", torch_dtype=torch.float16).cuda().eval()
    dev_queries = ["wireless earbuds noise cancelling", "usb c hub 4k 60hz", "trail running shoes wide"]
    for q in dev_queries:
        q_emb = query_tower(tf.constant([q]))                     # .numpy() -> item_index.search(q_emb, 100)
        pairs = Encoding(100, 512)                                 # tok([q] * 100, titles, ...).to("cuda")
        with torch.inference_mode():
            scores = reranker(pairs, None)
        print("%s: reranked 100 candidates" % q)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
