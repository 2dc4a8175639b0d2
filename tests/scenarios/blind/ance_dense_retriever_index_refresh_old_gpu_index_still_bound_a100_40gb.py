"""train_ance.py -- ANCE-style dense-retriever training on MS MARCO (8.84M passages) on one A100 40GB
(cc 8.0): two BERT-base towers (fp32 master weights, bf16 autocast, AdamW), hard negatives mined
from a flat inner-product index over the whole corpus, refreshed every 5000 steps.  The index is the
team's FAISS-like GpuFlatIndex written in PyTorch (fp32 vectors on the GPU, chunked matmul top-k;
the faiss-gpu wheel did not match their CUDA):

    class Trainer:
        def refresh_index(self):
            with torch.no_grad():
                embs = encode_corpus(self.p_encoder, corpus)                 # chunks, to host memory
            self.index = GpuFlatIndex.from_host(embs)                       # 8.84M x 768 fp32 = 25 GiB
        def train(self):
            self.refresh_index()
            for step, batch in enumerate(loader):
                negs = self.index.search(q_emb, k=200)                       # hard negatives
                loss = contrastive(...); loss.backward(); opt.step(); opt.zero_grad()
                if step and step % 5000 == 0:
                    self.refresh_index()                                     # fails here

Steps 1-4999 run flat at ~33 GiB (index 25 GiB, model/grads/AdamW 3.2 GiB, activations cached).
At the first refresh `self.index = GpuFlatIndex.from_host(...)` builds the new index while the old one
is still bound to self.index (the right-hand side runs before the assignment): two 25 GiB indexes at
once.  PyTorch releases its cached activation blocks and retries, still 14 GiB short.  Not a leak:
one planned peak, every 5000 steps.

User: "OOM at step 5000 after a flat run -- leak in the miner?"
An expert, first: drop the old index before building the new one (`self.index = None` /
`del self.index`, then build), or keep the index off the GPU: host memory or a compressed IVF-PQ index
(the corpus at 64 bytes per vector is 540 MiB).  NEW remedy id: drop_old_before_rebuild ("free the
old copy before building its replacement"); release_references and index_off_gpu are acceptable.
Wrong advice: a smaller batch, gradient checkpointing or mixed precision (training is not the
peak), torch.inference_mode (the encoding is already under no_grad), expandable_segments or
empty_cache (the allocator already released its cache), hunting a leak.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

N_PASSAGES = 8841823
DIM = 768


class BertEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(90 * MiB, device="cuda"))
        for i in range(12):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(27 * MiB, device="cuda")))

    def forward(self, n_seqs, seq=256):
        out = None
        for i in range(12):
            a = torch.empty(n_seqs * seq * 768 * 2 * 6, device="cuda")     # saved activations, bf16
            if torch.is_grad_enabled():
                a._saved = out
            out = a                                  # under no_grad the last layer's is dropped
        emb = torch.empty(n_seqs * 768 * 4, device="cuda")
        emb._saved = out
        return emb


class GpuFlatIndex(object):
    """A flat inner-product index: the vectors (fp32) on the GPU, searched by chunked matmul."""

    def __init__(self, n, dim):
        self.ntotal, self.dim = n, dim
        self.xb = torch.empty(n * dim * 4, device="cuda")

    @classmethod
    def from_host(cls, embs):
        return cls(embs["n"], embs["dim"])

    def search(self, q, k):
        scores = torch.empty(32 * 1048576 * 4, device="cuda")               # one chunk of q @ xb.T
        top = torch.empty(32 * k * 12, device="cuda")
        del scores
        return top


def encode_corpus(p_encoder, n):
    for start in range(0, n, 1024 * 400):               # every 200th chunk shown; .cpu() per chunk
        e = p_encoder(1024, seq=192)
        del e
    return {"n": n, "dim": DIM}                          # a host array


class Trainer(object):
    def __init__(self):
        self.q_encoder = BertEncoder()
        self.p_encoder = BertEncoder()
        params = self.q_encoder.parameters() + self.p_encoder.parameters()
        self.opt = torch.optim.AdamW(params, lr=1e-5)
        self.index = None

    def refresh_index(self):
        with torch.no_grad():
            embs = encode_corpus(self.p_encoder, N_PASSAGES)
        self.index = GpuFlatIndex.from_host(embs)

    def train(self):
        self.refresh_index()
        for step in range(50, 40001, 50):                    # every 50th step shown
            with torch.no_grad():
                q_emb = self.q_encoder(16, seq=32)
            negs = self.index.search(q_emb, k=200)
            del q_emb
            with torch.autocast("cuda", dtype=torch.bfloat16):
                q = self.q_encoder(16, seq=32)
                p = self.p_encoder(16 * 8, seq=256)          # 1 positive + 7 mined negatives each
                loss = torch.empty(512, device="cuda")
                loss._saved = p                                 # (and q: its graph is small)
                loss._params = tuple(self.q_encoder.parameters() + self.p_encoder.parameters())
            del q, p
            scen_truth.backward(loss)
            self.opt.step()
            self.opt.zero_grad(set_to_none=True)
            del loss, negs
            if step % 5000 == 0:
                self.refresh_index()


try:
    Trainer().train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
