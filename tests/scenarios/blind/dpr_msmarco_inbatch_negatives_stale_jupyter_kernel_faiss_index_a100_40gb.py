"""train_dpr.py -- a DPR-style dense retriever for MS MARCO passages: two bert-base-uncased towers (query and
passage encoders, 109.5M parameters each), in-batch negatives plus one BM25 hard negative per query, as in
the DPR paper, bf16 autocast, AdamW, on the group's shared A100 40GB workstation:

    q_enc = BertModel.from_pretrained("bert-base-uncased").cuda()
    p_enc = BertModel.from_pretrained("bert-base-uncased").cuda()
    optimizer = torch.optim.AdamW(list(q_enc.parameters()) + list(p_enc.parameters()), lr=2e-5)
    for batch in loader:                                  # 96 queries; 192 passages (positive + hard negative)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q = q_enc(**batch["query"]).last_hidden_state[:, 0]           # [96, 768], max_length 32
            p = p_enc(**batch["passages"]).last_hidden_state[:, 0]        # [192, 768], max_length 256
            scores = q @ p.T                                              # every other passage is a negative
            loss = F.cross_entropy(scores, batch["labels"])
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Yesterday the same command ran a full epoch at about 27 GiB peak.  Afterwards the student opened a Jupyter
notebook to look at failures: loaded the checkpoint's passage encoder, encoded the 8.8M-passage collection and
put it in a faiss.GpuIndexFlatIP (float16 storage: 12.6 GiB, plus FAISS's 1.5 GiB of temporary memory and
PyTorch's cache), and left the kernel running.  Today's run (a new learning rate) dies at the very first
step, in the passage tower's forward pass, with 19 GiB of the 40 GiB in reach of this process: nvidia-smi
lists the notebook's python holding 20.5 GiB on the same GPU.

An expert: nothing in the training changed; another process -- the idle Jupyter kernel with the FAISS index
-- holds half the card.  Shut that kernel down (or free its index and torch.cuda.empty_cache() in it), or run
the exploration on another GPU or with the index on the CPU, then rerun unchanged.
Wrong first advice: a smaller batch (in-batch negatives: 96 queries give each query 191 negatives; halving
the batch weakens the training signal, and only the foreign 20.5 GiB is new), gradient checkpointing or
GradCache (works around memory that belongs to a notebook), mixed precision (already bf16 autocast),
expandable_segments / empty_cache in the training (nothing is cached in this process at its first step),
an 8-bit optimizer / ZeRO (the optimizer state does not even exist yet), shorter passages (changes the
retriever), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: int64 (torch.long) for token ids; torch.matmul (a C function in PyTorch: its output is
# in both inputs' autograd graph).  Compiled as part of torch's file so that failing lines stay the program's.
_GAPS = '''
def matmul(a, b, out_elems):
    out = torch.empty(out_elems, dtype=torch.float32, device=a.device)
    out._saved = [a, b]
    return torch._derive(out, a, b)
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch._matmul_sized = _ns["matmul"]
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
# ----

device = "cuda"
H, HEADS, FFN, LAYERS, VOCAB = 768, 12, 3072, 12, 30522


def _param(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=device))


def act(tokens, per_token):
    """an activation of `per_token` bytes per token (bf16 under autocast; masks are bytes)"""
    return torch.empty(tokens * per_token, dtype=torch.uint8, device=device)


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * H * H + 4 * H + 2 * H)
        self.intermediate = _param(H * FFN + FFN)
        self.output = _param(FFN * H + H + 2 * H)

    def forward(self, hidden, batch, seq):
        T = batch * seq
        saved = [hidden]
        saved.append(act(T, 6 * H))                          # query, key, value (bf16)
        scores = act(T, 2 * HEADS * seq)                     # q @ k.T / sqrt(d), then softmax
        saved.append(act(T, 2 * HEADS * seq))                # attention probs
        del scores
        saved.append(act(T, HEADS * seq))                    # attention dropout mask
        saved.append(act(T, 2 * HEADS * seq))                # dropped probs
        saved.append(act(T, 2 * H))                          # context
        saved.append(act(T, H))                              # hidden dropout mask
        saved.append(act(T, 2 * H))                          # LayerNorm input
        saved.append(act(T, 2 * H))                          # intermediate input
        saved.append(act(T, 8 * H))                          # intermediate (3072) pre-GELU
        saved.append(act(T, 8 * H))                          # GELU output
        saved.append(act(T, H))                              # output dropout mask
        out = act(T, 2 * H)                                  # LayerNorm output
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

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids.shape
        hidden = act(batch * seq, 2 * H)                     # embeddings + LayerNorm + dropout
        for i in range(LAYERS):
            hidden = getattr(self, "layer%d" % i)(hidden, batch, seq)
        return hidden                                        # last_hidden_state


class Tokens(object):
    """a tokenizer's batch moved to the GPU: input_ids and attention_mask [batch, seq] (int64)"""

    def __init__(self, batch, seq):
        self.shape = (batch, seq)
        self.ids = torch.empty(batch * seq, dtype=torch.int64, device=device)
        self.mask = torch.empty(batch * seq, dtype=torch.int64, device=device)


class Batch(object):
    def __init__(self, n_queries):
        self.query = Tokens(n_queries, 32)
        self.passages = Tokens(2 * n_queries, 256)


def loader(n_queries, steps):
    for _ in range(steps):
        yield Batch(n_queries)


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


def main():
    q_enc = BertModel.from_pretrained("bert-base-uncased").cuda()
    p_enc = BertModel.from_pretrained("bert-base-uncased").cuda()
    optimizer = torch.optim.AdamW(list(q_enc.parameters()) + list(p_enc.parameters()), lr=3e-5)
    print("q_enc + p_enc: %.1fM parameters" % (sum(p.nbytes for p in optimizer.param_groups[0]["params"]) / 4e6))
    for step, batch in enumerate(loader(96, 1000)):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            q = q_enc(batch.query, None)
            p = p_enc(batch.passages, None)
            scores = torch._matmul_sized(q, p, 96 * 192)            # q[:, 0] @ p[:, 0].T: [96, 192]
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
