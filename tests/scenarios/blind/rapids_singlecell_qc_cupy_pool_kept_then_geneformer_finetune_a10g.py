"""annotate_and_finetune.py -- a computational-biology postdoc's pipeline on an AWS g5.2xlarge (one NVIDIA
A10G, 24 GB): 400,000 cells of a lung-atlas subset (33,538 genes, ~2,000 detected per cell) go through
quality control, normalisation, highly-variable genes, PCA, a kNN graph and Leiden clustering with
rapids-singlecell (CuPy on the GPU), and the clusters, annotated, become labels for fine-tuning Geneformer
(PyTorch, BertForSequenceClassification, 6 layers, 2,048 gene tokens per cell) in the same process:

    adata = sc.read_h5ad("lung_atlas_subset.h5ad")
    rsc.get.anndata_to_GPU(adata)                       # X as a cupyx CSR matrix: 5.96 GiB
    rsc.pp.calculate_qc_metrics(adata); rsc.pp.filter_cells(adata, min_genes=200); rsc.pp.filter_genes(...)
    adata.layers["counts"] = adata.X.copy()
    rsc.pp.normalize_total(adata, target_sum=1e4); rsc.pp.log1p(adata)
    rsc.pp.highly_variable_genes(adata, n_top_genes=2000, flavor="seurat_v3", layer="counts")
    rsc.pp.pca(adata, n_comps=50); rsc.pp.neighbors(adata); rsc.tl.leiden(adata, resolution=1.0)
    rsc.get.anndata_to_CPU(adata, convert_all=True)      # everything back in host memory
    gc.collect(); torch.cuda.empty_cache()                # "start the fine-tune with a clean GPU"
    ...
    for batch in train_loader:                            # batch 12 x 2048 tokens, float32
        loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Each part works on its own: the preprocessing ran in its own notebook, and Geneformer's fine-tuning at batch
12 peaks at 11.6 GiB.  Together the first forward pass dies in the 4th encoder layer: "CUDA out of
memory. Tried to allocate 768.00 MiB. GPU 0 has a total capacity of 22.49 GiB of which 364.00 MiB is free.
... Of the allocated memory 6.58 GiB is allocated by PyTorch, and 381.02 MiB is reserved by PyTorch but
unallocated."  PyTorch holds 6.9 GiB; 14.7 GiB of the card are held by this process outside PyTorch.  Moving
the AnnData back to the host released every CuPy array, but not the memory: CuPy's default memory pool keeps
the blocks it freed for its next arrays (the raw and filtered CSR matrices, the counts layer, the dense HVG
matrix for PCA: 14.7 GiB of free blocks, 0 bytes in use), and torch.cuda.empty_cache() can only return
PyTorch's own cache, which is empty.

An expert: the memory is CuPy's, in this process: release its pool before the PyTorch part --
cupy.get_default_memory_pool().free_all_blocks() (and the pinned pool) after anndata_to_CPU -- or give both
libraries one allocator (RMM: rmm_cupy_allocator for CuPy, rmm_torch_allocator for PyTorch), or run the
preprocessing as its own process.  Then the fine-tune has the card it had alone.
Wrong first advice: torch.cuda.empty_cache() or expandable_segments (PyTorch's own cache is 0.4 GiB and
not what fills the card), a smaller batch, gradient checkpointing or mixed precision (they shrink a job that
fits the card by itself to make room for a pool of free blocks), stopping other processes (nvidia-smi lists
only this one), a bigger instance, quantization or inference settings (this is training).
"""
import gc
import sys

import cupy
import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB, GiB = 1 << 20, 1 << 30

# ---- stand-in gaps.  anndata and scanpy keep host arrays (shape and dtype only here); rapids-singlecell's
# functions allocate what they allocate on the GPU, as CuPy arrays from CuPy's default memory pool, and
# anndata_to_CPU drops them (their blocks go back to the pool).  transformers' BertForSequenceClassification
# for Geneformer-10M: its forward keeps, per layer, what autograd saves for backward.


class HostArray(object):
    def __init__(self, shape, dtype="float32"):
        self.shape, self.dtype = tuple(shape), dtype


class CSRMatrixGPU(object):
    """cupyx.scipy.sparse.csr_matrix: data (float32), indices (int32), indptr (int32)."""

    def __init__(self, n_rows, nnz):
        self.shape_rows, self.nnz = n_rows, nnz
        self.data = cupy.empty((nnz,), cupy.float32)
        self.indices = cupy.empty((nnz,), cupy.int32)
        self.indptr = cupy.empty((n_rows + 1,), cupy.int32)

    def copy(self):
        return CSRMatrixGPU(self.shape_rows, self.nnz)


class AnnData(object):
    def __init__(self, n_obs, n_vars, nnz):
        self.n_obs, self.n_vars, self.nnz = n_obs, n_vars, nnz
        self.X = HostArray((n_obs, n_vars))
        self.layers, self.obsm, self.obsp, self.obs, self.var = {}, {}, {}, {}, {}


class sc(object):
    @staticmethod
    def read_h5ad(path):
        return AnnData(400_000, 33_538, 400_000 * 2_000)


class _Get(object):
    @staticmethod
    def anndata_to_GPU(adata, convert_all=False):
        adata.X = CSRMatrixGPU(adata.n_obs, adata.nnz)

    @staticmethod
    def anndata_to_CPU(adata, convert_all=False):
        adata.X = HostArray((adata.n_obs, adata.n_vars))
        for store in (adata.layers, adata.obsm, adata.obsp, adata.obs, adata.var):
            for k in list(store):
                store[k] = HostArray(getattr(store[k], "shape", ()))


class _Pp(object):
    @staticmethod
    def calculate_qc_metrics(adata):
        adata.obs["n_genes_by_counts"] = cupy.empty((adata.n_obs,), cupy.float32)
        adata.obs["total_counts"] = cupy.empty((adata.n_obs,), cupy.float32)
        adata.var["n_cells_by_counts"] = cupy.empty((adata.n_vars,), cupy.float32)

    @staticmethod
    def filter_cells(adata, min_genes=None):
        kept = int(adata.n_obs * 0.973)
        X = CSRMatrixGPU(kept, int(adata.nnz * 0.975))        # the subset is a new matrix
        adata.n_obs, adata.nnz, adata.X = kept, X.nnz, X

    @staticmethod
    def filter_genes(adata, min_cells=None):
        adata.n_vars = 26_114                                  # in place: only the column index shrinks

    @staticmethod
    def normalize_total(adata, target_sum=None):
        pass                                                   # in place on X.data

    @staticmethod
    def log1p(adata):
        pass

    @staticmethod
    def highly_variable_genes(adata, n_top_genes=2000, flavor="seurat_v3", layer=None):
        adata.var["highly_variable"] = cupy.empty((adata.n_vars,), cupy.int8)

    @staticmethod
    def pca(adata, n_comps=50, use_highly_variable=True):
        dense = cupy.empty((adata.n_obs, 2000), cupy.float32)   # the HVG columns, densified and scaled
        adata.obsm["X_pca"] = cupy.empty((adata.n_obs, n_comps), cupy.float32)
        del dense

    @staticmethod
    def neighbors(adata, n_neighbors=15):
        adata.obsp["distances"] = cupy.empty((adata.n_obs * n_neighbors * 2,), cupy.float32)
        adata.obsp["connectivities"] = cupy.empty((adata.n_obs * n_neighbors * 2,), cupy.float32)


class _Tl(object):
    @staticmethod
    def leiden(adata, resolution=1.0):
        adata.obs["leiden"] = cupy.empty((adata.n_obs,), cupy.int32)


class rsc(object):
    get, pp, tl = _Get, _Pp, _Tl


def _param(*shape):
    n = 1
    for s in shape:
        n *= s
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class BertLayer(torch.nn.Module):
    def __init__(self, d, ff):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = (_param(d, d) for _ in range(4))
        self.intermediate, self.output = _param(d, ff), _param(ff, d)
        self.ln = _param(4 * d)

    def forward(self, hidden, b, s, heads, d, ff):
        f32 = torch.float32
        q, k, v = (torch.empty(b * s * d, dtype=f32, device="cuda") for _ in range(3))
        scores = torch.empty(b * heads * s * s, dtype=f32, device="cuda")
        probs = torch.empty(b * heads * s * s, dtype=f32, device="cuda")      # softmax saves its output
        del scores
        mask = torch.empty(b * heads * s * s, dtype=torch.uint8, device="cuda")  # attention dropout
        dropped = torch.empty(b * heads * s * s, dtype=f32, device="cuda")
        ctx = torch.empty(b * s * d, dtype=f32, device="cuda")
        inter = torch.empty(b * s * ff, dtype=f32, device="cuda")
        act = torch.empty(b * s * ff, dtype=f32, device="cuda")
        out = torch.empty(b * s * d, dtype=f32, device="cuda")
        out._saved = [hidden, q, k, v, probs, mask, dropped, ctx, inter, act]
        return torch._derive(out, hidden)


class _SeqClsOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class BertForSequenceClassification(torch.nn.Module):
    """Geneformer-10M: 6 layers, hidden 256, 4 heads, intermediate 512, 25,426 gene tokens, 2,048 positions."""

    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.d, self.ff, self.heads = 256, 512, 4
        self.word_embeddings, self.position_embeddings = _param(25_426, 256), _param(2_048, 256)
        self.layers = [BertLayer(self.d, self.ff) for _ in range(6)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = _param(256, num_labels)

    @classmethod
    def from_pretrained(cls, path, num_labels=2, output_attentions=False, output_hidden_states=False):
        return cls(num_labels)

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        b, s = input_ids.shape_
        hidden = torch.empty(b * s * self.d, dtype=torch.float32, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, b, s, self.heads, self.d, self.ff)
        logits = torch.empty(b * 64, dtype=torch.float32, device="cuda")
        logits._saved = hidden
        loss = torch.nn.functional.cross_entropy(torch._derive(logits, hidden), labels)
        return _SeqClsOutput(loss, logits)


_plain_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """Tensor.backward as PyTorch runs it: with retain_graph False the graph's saved tensors are freed after."""
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    t = self
    while isinstance(t, torch.Tensor) and not retain_graph:
        nxt = getattr(t, "_saved", None)
        t._saved = None
        t = nxt


torch.Tensor.backward = _backward


def token_batches(n_cells, batch_size=12, seq_len=2048):
    """Geneformer's rank-value encoding of each cell, padded to 2,048 tokens; batches moved to the GPU."""
    for _ in range(n_cells // batch_size):
        ids = torch.empty(batch_size * seq_len, dtype=torch.float32, device="cuda")   # int64 in the real run
        ids.shape_ = (batch_size, seq_len)
        yield {"input_ids": ids, "labels": torch.empty(batch_size * 2, dtype=torch.float32, device="cuda")}
# ----


def preprocess(path):
    adata = sc.read_h5ad(path)
    rsc.get.anndata_to_GPU(adata)
    rsc.pp.calculate_qc_metrics(adata)
    rsc.pp.filter_cells(adata, min_genes=200)
    rsc.pp.filter_genes(adata, min_cells=3)
    adata.layers["counts"] = adata.X.copy()
    rsc.pp.normalize_total(adata, target_sum=1e4)
    rsc.pp.log1p(adata)
    rsc.pp.highly_variable_genes(adata, n_top_genes=2000, flavor="seurat_v3", layer="counts")
    rsc.pp.pca(adata, n_comps=50)
    rsc.pp.neighbors(adata, n_neighbors=15)
    rsc.tl.leiden(adata, resolution=1.0)
    rsc.get.anndata_to_CPU(adata, convert_all=True)
    return adata


def finetune(adata, epochs=3):
    model = BertForSequenceClassification.from_pretrained("ctheodoris/Geneformer", num_labels=38)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-5, weight_decay=0.001)
    for epoch in range(epochs):
        for step, batch in enumerate(token_batches(adata.n_obs)):
            out = model(**batch)
            out.loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def main():
    adata = preprocess("lung_atlas_subset.h5ad")
    print("clusters ready: %d cells x %d genes" % (adata.n_obs, adata.n_vars))
    gc.collect()
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    print("GPU free before fine-tuning: %.2f of %.2f GiB" % (free / GiB, total / GiB))
    finetune(adata)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
