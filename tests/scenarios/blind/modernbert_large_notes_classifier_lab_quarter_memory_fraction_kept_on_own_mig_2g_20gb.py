"""train_cls.py -- a hospital research group fine-tunes answerdotai/ModernBERT-large (395M parameters) to flag
discharge notes that need a coding review (multi-label, 41 labels), notes cut into chunks of at most 512 tokens,
batches of 16, fp32 master weights with bf16 autocast, AdamW.  Every script of the group starts with the lab's
helper package:

    import labtools
    labtools.setup_gpu()        # torch.cuda.set_per_process_memory_fraction(0.25): "4 users share each A100"
    model = AutoModelForSequenceClassification.from_pretrained("answerdotai/ModernBERT-large", num_labels=41,
                                                               problem_type="multi_label_classification").cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); opt.step(); opt.zero_grad(set_to_none=True)

setup_gpu() was written when four students shared each A100-SXM4-80GB of the group's server: a quarter of 80 GB,
20 GB each, kept everyone's jobs from killing each other's.  This job peaked at about 10 GiB then.  Last month the
admins enabled MIG and gave every user a 2g.20gb slice of their own (19.5 GiB, isolated by the hardware), and
nobody touched labtools.  The fraction is a fraction of the device the process sees: a quarter of the slice,
4.88 GiB, on a slice where nothing else runs.  The model loads (1.5 GiB in fp32), and the first forward pass stops
in layer 12 (the 13th of 28): "Tried to allocate 61.50 MiB.  GPU 0 has a total capacity of 19.50 GiB of which
14.27 GiB is free.  4.88 GiB allowed".

An expert: the allocator refused, not the GPU -- 14.27 GiB of the slice are free.  Drop the labtools.setup_gpu()
call (or set the fraction to 1.0) on MIG slices: MIG already isolates each user's memory, and this job needs about
10 GiB of the 19.5.  Wrong first advice: a smaller batch or gradient checkpointing (they would make the job fit the
stale cap and waste three quarters of the slice, at a cost in speed), an 8-bit optimizer, LoRA, quantization or
ZeRO/offload (the model state is not the problem), a bigger GPU or MIG profile (the one it has is 75% idle),
stopping other processes (there are none on a MIG slice of one's own), empty_cache / expandable_segments
(nothing is cached or fragmented: the reservation is live tensors up to the cap), mixed precision (bf16 autocast
is on).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


class _SavedTensors(list):
    """What autograd saved for backward along the forward pass (the graph's saved tensors, freed after backward)."""
    _saved = None


# ---- labtools/gpu.py (the group's helper package), as it reads
def setup_gpu(fraction=0.25):
    """4 users share each A100: keep every process to its quarter."""
    torch.cuda.set_per_process_memory_fraction(fraction)
# ----


# ---- stand-in gap: torch.nn.Linear and torch.nn.LayerNorm (C++ kernels: their outputs are made inside torch; under
# autocast a Linear casts its float32 weight to bf16 and keeps the copy in autocast's cache until the region ends).
# Compiled as part of torch's file so that the failing Python line of the program stays the program's own.
_NN = """
class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features + (out_features if bias else 0),
                                                     dtype=torch.float32, device="cuda"))
        self.out_features = out_features
        self._cast = None

    def forward(self, x, tokens):
        if torch.is_autocast_enabled() and self._cast is None:
            self._cast = torch.empty(self.weight.nbytes // 4, dtype=torch.bfloat16, device="cuda")
            _autocast_cache.append(self)
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16, device="cuda")


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32, device="cuda"))
        self.d = d

    def forward(self, x, tokens):
        return torch.empty(tokens * self.d, dtype=torch.bfloat16, device="cuda")


_autocast_cache = []


def clear_autocast_cache():
    for m in _autocast_cache:
        m._cast = None
    del _autocast_cache[:]


def act(n):
    return torch.empty(n, dtype=torch.bfloat16, device="cuda")
"""
_ns = {"torch": torch}
exec(compile(_NN, torch.__file__, "exec"), _ns)
Linear, LayerNorm, _act = _ns["Linear"], _ns["LayerNorm"], _ns["act"]
_clear_autocast_cache = _ns["clear_autocast_cache"]
# ----


class ModernBertLayer(torch.nn.Module):
    def __init__(self, d=1024, inter=2624):
        torch.nn.Module.__init__(self)
        self.attn_norm = LayerNorm(d)
        self.Wqkv = Linear(d, 3 * d, bias=False)
        self.attn_Wo = Linear(d, d, bias=False)
        self.mlp_norm = LayerNorm(d)
        self.Wi = Linear(d, 2 * inter, bias=False)
        self.mlp_Wo = Linear(inter, d, bias=False)
        self.d, self.inter = d, inter

    def forward(self, hidden, tokens, saved):
        h = self.attn_norm(hidden, tokens)
        qkv = self.Wqkv(h, tokens)
        rot = _act(tokens * 2 * self.d)                     # rotary q, k
        attn = _act(tokens * self.d)                        # flash_attn_varlen_qkvpacked_func (unpadded)
        o = self.attn_Wo(attn, tokens)
        res = _act(tokens * self.d)
        m = self.mlp_norm(res, tokens)
        wi = self.Wi(m, tokens)                             # input and gate, 2 x 2624
        gated = _act(tokens * self.inter)                   # GeLU(input) * gate
        mo = self.mlp_Wo(gated, tokens)
        out = _act(tokens * self.d)
        saved.extend([hidden, h, qkv, rot, attn, o, res, m, wi, gated, mo])
        return out


class ModernBertForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels, layers=28, vocab=50368, d=1024):
        torch.nn.Module.__init__(self)
        self.tok_embeddings = torch.nn.Parameter(torch.empty(vocab * d, dtype=torch.float32, device="cuda"))
        self.emb_norm = LayerNorm(d)
        for i in range(layers):
            setattr(self, "layers_%d" % i, ModernBertLayer(d))
        self.final_norm = LayerNorm(d)
        self.head_dense = Linear(d, d)
        self.head_norm = LayerNorm(d)
        self.classifier = Linear(d, num_labels)
        self.num_layers, self.d = layers, d

    def forward(self, input_ids, tokens, batch):
        saved = _SavedTensors()
        hidden = self.emb_norm(_act(tokens * self.d), tokens)
        for i in range(self.num_layers):
            hidden = getattr(self, "layers_%d" % i)(hidden, tokens, saved)
        pooled = self.head_norm(self.head_dense(self.final_norm(hidden, tokens), batch), batch)
        logits = self.classifier(pooled, batch)
        logits._saved = saved
        return logits


def main():
    setup_gpu()                                              # labtools.setup_gpu()
    model = ModernBertForSequenceClassification(num_labels=41)
    n = sum(p.nbytes for p in model.parameters()) // 4
    print("ModernBERT-large: %.0fM parameters, %.2f GiB (fp32)" % (n / 1e6, n * 4.0 / GiB))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, weight_decay=0.01)
    model.train()
    # DataCollatorWithPadding -> ModernBERT unpads: 16 chunks of up to 512 tokens, 6,144 real tokens in this batch
    for step, tokens in enumerate([6144, 5890, 6301]):
        input_ids = torch.empty(16 * 512 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids, tokens, 16)
            loss = torch.nn.functional.cross_entropy(logits, None)   # BCEWithLogitsLoss
        _clear_autocast_cache()                              # leaving the autocast region frees its weight casts
        scen_truth.backward(loss)
        with torch.no_grad():                                # torch.optim runs step() with autograd off
            opt.step()
        opt.zero_grad(set_to_none=True)
        del logits, loss
        print("step %d" % step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
