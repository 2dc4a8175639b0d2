"""train_retriever.py -- fine-tuning BAAI/bge-base-en-v1.5 (109.5M parameters) as an MS MARCO passage
retriever with ANCE-style hard negatives re-mined from the model itself: before each epoch the script encodes
the 8,841,823-passage collection, puts the embeddings in a FAISS GPU flat index (float16 storage), mines the
top-200 for every training query, and keeps the index for the epoch's in-training recall checks.  Contrastive
loss over groups of train_group_size 10 (1 positive + 9 mined negatives) for 32 queries per step, passages at
max_length 256, bf16 autocast, AdamW:

    model = AutoModel.from_pretrained("BAAI/bge-base-en-v1.5").cuda()
    ...
    res = faiss.StandardGpuResources()
    cfg = faiss.GpuIndexFlatConfig()
    cfg.useFloat16 = True                         # cfg.device defaults to 0
    index = faiss.GpuIndexFlatIP(res, 768, cfg)
    index.add(corpus_emb)                         # 8.84M x 768 float16: 12.65 GiB
    _, hard_neg = index.search(query_emb, 200)
    for batch in loader:                          # 32 queries, 320 passages
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = contrastive_loss(model(**batch["q"]), model(**batch["p"]))
        loss.backward(); optimizer.step(); optimizer.zero_grad()

It was written on a single A100 80GB, where index (12.65 GiB + FAISS's 1.5 GiB of temporary memory) and
training (about 39 GiB at its peak) sat side by side. The lab's new box has two RTX A6000 (48 GB each); the
script is launched as before, `python train_retriever.py`, both GPUs visible. Everything lands on cuda:0 --
the model by .cuda(), the index by cfg.device's default -- and the first training step dies in the passage
forward pass, about 5.5 GiB short, while nvidia-smi shows GPU 1 at 0 MiB.

An expert: this process leaves a 48 GB GPU idle; the index does not have to share a card with the training.
Put it on the second GPU (cfg.device = 1, or faiss.index_cpu_to_gpu(res, 1, cpu_index)), or keep the flat
index in host memory (mining 0.5M queries on the CPU, or a compressed IVF-PQ index); the training then has
the whole of GPU 0 and runs unchanged.  (Later, DDP over both GPUs with the index on the CPU.)
Wrong first advice: a smaller batch or train_group_size (fewer negatives per query: a weaker retriever, to
make room for an index that can go elsewhere), gradient checkpointing (~30% slower, same result as moving
one config field), mixed precision (already bf16 autocast), expandable_segments / empty_cache (PyTorch's cache
is small and given back before the failure; the index is live), an 8-bit optimizer / ZeRO (AdamW's state of
a 110M model is 0.8 GiB), quantization or LoRA, "other processes" (there are none), a bigger GPU.
"""
import ctypes
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: int64 for token ids; torch.matmul (its output is in both inputs' graph); no_grad as a decorator.  Compiled as
# part of torch's file so that failing lines stay the program's own.
_GAPS = '''
def matmul(a, b, out_elems):
    out = torch.empty(out_elems, dtype=torch.float32, device=a.device)
    out._saved = [a, b]
    return torch._derive(out, a, b)

def _no_grad_call(self, func):
    # @torch.no_grad() as a decorator
    def decorate_context(*args, **kwargs):
        with type(self)():
            return func(*args, **kwargs)
    return decorate_context
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch._matmul_sized = _ns["matmul"]
if "__call__" not in vars(torch.no_grad):
    torch.no_grad.__call__ = _ns["_no_grad_call"]
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8


class faiss(object):
    """faiss-gpu 1.8 as far as the script uses it: the GPU index's storage and StandardGpuResources' temporary
    memory are FAISS's own cudaMalloc calls on the index's device (outside PyTorch's allocator)."""
    _rt = None

    @classmethod
    def _cuda_malloc(cls, device, nbytes):
        if cls._rt is None:
            cls._rt = ctypes.CDLL("libcudart.so.13")
            cls._rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
            cls._rt.cudaSetDevice.argtypes = [ctypes.c_int]
            cls._rt.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        prev = ctypes.c_int(0)
        cls._rt.cudaGetDevice(ctypes.byref(prev))
        cls._rt.cudaSetDevice(device)
        p = ctypes.c_void_p(0)
        err = cls._rt.cudaMalloc(ctypes.byref(p), nbytes)
        cls._rt.cudaSetDevice(prev.value)
        if err != 0:
            raise RuntimeError("Error in virtual void* faiss::gpu::StandardGpuResourcesImpl::allocMemory(...) "
                               "at faiss/gpu/StandardGpuResources.cpp:530: Error: 'err == cudaSuccess' failed: "
                               "failed to cudaMalloc %d bytes on device %d (error 2 out of memory)" % (nbytes, device))
        return p.value

    class StandardGpuResources(object):
        TEMP_MEM = 1536 << 20            # getDefaultTempMemForGPU(): 1.5 GiB on cards over 8 GiB

        def __init__(self):
            self._temp = {}

        def _init_device(self, device):
            if device not in self._temp:
                self._temp[device] = faiss._cuda_malloc(device, self.TEMP_MEM)

    class GpuIndexFlatConfig(object):
        def __init__(self):
            self.device = 0
            self.useFloat16 = False

    class GpuIndexFlatIP(object):
        def __init__(self, res, d, cfg):
            self.res, self.d, self.cfg = res, d, cfg
            self.ntotal = 0
            self._storage = []
            res._init_device(cfg.device)

        def add(self, n):
            # index.add(x): x is an [n, d] float32 numpy array; stored as float16 with useFloat16
            nbytes = n * self.d * (2 if self.cfg.useFloat16 else 4)
            self._storage.append(faiss._cuda_malloc(self.cfg.device, nbytes))
            self.ntotal += n

        def search(self, nq, k):
            # tiles the queries through the temporary memory; results come back to host numpy arrays
            return None, None
# ----

device = "cuda"
H, HEADS, FFN, LAYERS, VOCAB = 768, 12, 3072, 12, 30522
N_PASSAGES = 8_841_823
N_TRAIN_QUERIES = 502_939


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=device))


def act(tokens, per_token):
    return torch.empty(tokens * per_token, dtype=torch.uint8, device=device)


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * H * H + 4 * H + 2 * H)
        self.intermediate = _param(H * FFN + FFN)
        self.output = _param(FFN * H + H + 2 * H)

    def forward(self, hidden, batch, seq):
        T = batch * seq
        if not torch.is_grad_enabled():                      # encoding: nothing is saved
            qkv = act(T, 6 * H)
            probs = act(T, 2 * HEADS * seq)
            del qkv
            inter = act(T, 8 * H)
            del probs
            out = act(T, 2 * H)
            del inter
            return out
        saved = [hidden]
        saved.append(act(T, 6 * H))                          # query, key, value (bf16)
        scores = act(T, 2 * HEADS * seq)
        saved.append(act(T, 2 * HEADS * seq))                # attention probs
        del scores
        saved.append(act(T, HEADS * seq))                    # attention dropout mask
        saved.append(act(T, 2 * HEADS * seq))                # dropped probs
        saved.append(act(T, 2 * H))                          # context
        saved.append(act(T, H))                              # hidden dropout mask
        saved.append(act(T, 2 * H))                          # LayerNorm input
        saved.append(act(T, 2 * H))                          # intermediate input
        saved.append(act(T, 8 * H))                          # intermediate pre-GELU
        saved.append(act(T, 8 * H))                          # GELU output
        saved.append(act(T, H))                              # output dropout mask
        out = act(T, 2 * H)
        out._saved = saved
        return out


class BertModel(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = _param(VOCAB * H + 512 * H + 2 * H + 2 * H)
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, BertLayer())
        self.pooler = _param(H * H + H)

    def forward(self, tokens, attention_mask=None):
        batch, seq = tokens.shape
        hidden = act(batch * seq, 2 * H)
        for i in range(LAYERS):
            hidden = getattr(self, "layer%d" % i)(hidden, batch, seq)
        return hidden


AutoModel = BertModel


class Tokens(object):
    def __init__(self, batch, seq):
        self.shape = (batch, seq)
        self.input_ids = torch.empty(batch * seq, dtype=torch.int64, device=device)
        self.attention_mask = torch.empty(batch * seq, dtype=torch.int64, device=device)


def backward(loss):
    """loss.backward() (retain_graph=False): afterwards autograd frees what the graph saved."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(saved if isinstance(saved, (list, tuple)) else [saved])


@torch.no_grad()
def encode_corpus(model, batches):
    model.eval()
    for _ in range(batches):                     # stands for 8,635 batches of 1,024 passages
        with torch.autocast("cuda", dtype=torch.bfloat16):
            emb = model(Tokens(1024, 256))
        del emb                                  # emb[:, 0].float().cpu().numpy() -> corpus_emb
    return N_PASSAGES


def mine(model, res):
    n = encode_corpus(model, 3)
    cfg = faiss.GpuIndexFlatConfig()
    cfg.useFloat16 = True
    index = faiss.GpuIndexFlatIP(res, 768, cfg)
    index.add(n)
    _, hard_neg = index.search(N_TRAIN_QUERIES, 200)
    return index, hard_neg


def main():
    model = AutoModel.from_pretrained("BAAI/bge-base-en-v1.5").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.01)
    res = faiss.StandardGpuResources()
    for epoch in range(3):
        index, hard_neg = mine(model, res)
        print("epoch %d: index of %d passages on GPU %d, hard negatives mined" % (epoch, index.ntotal, index.cfg.device))
        model.train()
        for step in range(15625):                # 500k queries / 32
            with torch.autocast("cuda", dtype=torch.bfloat16):
                q = model(Tokens(32, 32))
                p = model(Tokens(32 * 10, 256))
                scores = torch._matmul_sized(q, p, 32 * 320)        # q[:, 0] @ p[:, 0].T / temperature
                loss = torch.nn.functional.cross_entropy(scores, None)
            backward(loss)
            optimizer.step()
            optimizer.zero_grad()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
