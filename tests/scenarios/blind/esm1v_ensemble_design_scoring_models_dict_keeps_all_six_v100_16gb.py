"""score_library.py -- a protein-engineering group scores a designed variant library of their enzyme
(a 510-residue hydrolase) zero-shot before ordering it: the ESM-1v ensemble (five 650M models, seeds 1-5)
plus ESM-2 650M, the usual "average the five ESM-1v scores and compare with ESM-2" recipe.  It runs on
the lab's shared DGX-1 node, one Tesla V100-SXM2-16GB per user.  fair-esm loads each model in float32
(2.4 GiB of weights each) on the CPU; the notebook moves it to the GPU and keeps it in a dict "so the
next batch of designs can be rescored without reloading":

    models, scores = {}, {}
    for name in MODEL_NAMES:
        model, alphabet = esm.pretrained.load_model_and_alphabet(name)
        models[name] = model.eval().cuda()
        scores[name] = score_variants(models[name], alphabet, variants)   # torch.no_grad inside

The scoring itself is light: batches of 32 full-length mutant sequences (514 tokens with BOS/EOS),
under torch.no_grad, a transient of about 1.7 GB per layer (ESM's attention computes its 20 heads'
514x514 weights in float32).  ESM-2 and ESM-1v seeds 1-4 score fine; every model stays in `models`;
the sixth (esm1v_..._5) loads -- 14.7 GiB of weights now resident of the 15.3 GiB the context leaves --
and its first batch fails in the attention of layer 0, on an 80 MiB projection: about half a GiB is left
for a layer that needs 1.7 GB.  The week before, with only the five ESM-1v
models, it fitted, which is why the loop looks innocent.

An expert: six models are resident while only one is ever used; the dict is a cache of models that is
never bounded.  Score the whole library with one model, save its scores, free it (drop it from the dict,
gc.collect, empty_cache), then load the next -- or bound the dict to the model in use (keep the others
on the CPU and move one at a time).  Peak becomes one model (2.4 GiB) plus one batch.  Halving the
weights (.half(), fine for ESM on a V100) is a reasonable second step but only moves the wall to the
12th model.  Wrong first advice: a smaller batch (the batch is not what fills the card: 14.7 of 15.3 GiB
are weights; batch 16 needs 0.85 GB and still fails here), inference_mode (already no_grad), flash attention,
gradient checkpointing (no training), expandable_segments or empty_cache alone (the models are live,
referenced by the dict), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

nn = torch.nn
f32 = torch.float32


# ---- fair-esm, as far as this notebook uses it (esm/modules.py, esm/model/esm2.py, esm/pretrained.py) ----
class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(d_in * d_out, dtype=f32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(d_out, dtype=f32, device="cuda"))


class MultiheadAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.k_proj = Linear(embed_dim, embed_dim)
        self.v_proj = Linear(embed_dim, embed_dim)
        self.q_proj = Linear(embed_dim, embed_dim)
        self.out_proj = Linear(embed_dim, embed_dim)

    def forward(self, x, batch, seq_len, dim):
        q = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        k = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        v = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        attn_weights = torch.empty(batch * self.num_heads * seq_len * seq_len, dtype=f32, device="cuda")  # q @ k^T
        attn_probs = torch.empty(batch * self.num_heads * seq_len * seq_len, dtype=f32, device="cuda")    # softmax
        del attn_weights
        attn = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        del attn_probs, q, k, v
        out = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        return out


class TransformerLayer(nn.Module):
    def __init__(self, embed_dim, ffn_dim, heads):
        nn.Module.__init__(self)
        self.self_attn = MultiheadAttention(embed_dim, heads)
        self.self_attn_layer_norm = nn.Parameter(torch.empty(2 * embed_dim, dtype=f32, device="cuda"))
        self.fc1 = Linear(embed_dim, ffn_dim)
        self.fc2 = Linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.Parameter(torch.empty(2 * embed_dim, dtype=f32, device="cuda"))
        self.dims = (embed_dim, ffn_dim)

    def forward(self, x, batch, seq_len):
        dim, ffn = self.dims
        h = self.self_attn(x, batch, seq_len, dim)
        up = torch.empty(batch * seq_len * ffn, dtype=f32, device="cuda")
        act = torch.empty(batch * seq_len * ffn, dtype=f32, device="cuda")
        del up
        out = torch.empty(batch * seq_len * dim, dtype=f32, device="cuda")
        del act, h
        return out


class ESM(nn.Module):
    def __init__(self, num_layers=33, embed_dim=1280, heads=20, alphabet_size=33):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(alphabet_size * embed_dim, dtype=f32, device="cuda"))
        for i in range(num_layers):
            setattr(self, "layer_%d" % i, TransformerLayer(embed_dim, 4 * embed_dim, heads))
        self.emb_layer_norm_after = nn.Parameter(torch.empty(2 * embed_dim, dtype=f32, device="cuda"))
        self.lm_head_dense = Linear(embed_dim, embed_dim)
        self.contact_head = nn.Parameter(torch.empty(num_layers * heads + 1, dtype=f32, device="cuda"))
        self.num_layers, self.embed_dim, self.alphabet_size = num_layers, embed_dim, alphabet_size

    def forward(self, tokens, repr_layers=()):
        batch, seq_len = tokens
        x = torch.empty(batch * seq_len * self.embed_dim, dtype=f32, device="cuda")
        for i in range(self.num_layers):
            x = getattr(self, "layer_%d" % i)(x, batch, seq_len)
        logits = torch.empty(batch * seq_len * self.alphabet_size, dtype=f32, device="cuda")
        return {"logits": logits}


def load_model_and_alphabet(name):
    """esm.pretrained.load_model_and_alphabet: the checkpoint (float32) read on the CPU; the notebook
    moves the model to the GPU (here it is built there: .cuda() keeps the weights where they are)."""
    return ESM(), "ESM-1b alphabet"


# ---- the notebook ----
MODEL_NAMES = ["esm2_t33_650M_UR50D"] + ["esm1v_t33_650M_UR90S_%d" % s for s in range(1, 6)]
SEQ_LEN = 510 + 2
BATCH = 32


def read_library(path):
    """The 160 designs the group wants to order (mutant sequences, full length)."""
    return ["design_%03d" % i for i in range(160)]


def score_variants(model, alphabet, variants):
    out = []
    with torch.no_grad():
        for i in range(0, len(variants), BATCH):
            chunk = variants[i:i + BATCH]
            res = model((len(chunk), SEQ_LEN))
            out.extend([0.0] * len(chunk))          # log-likelihood ratio per design (on the CPU)
            del res
    return out


variants = read_library("designs/round3_library.fasta")
models, scores = {}, {}
try:
    for name in MODEL_NAMES:
        model, alphabet = load_model_and_alphabet(name)
        models[name] = model.eval().cuda()
        scores[name] = score_variants(models[name], alphabet, variants)
        print("%-24s scored %d designs, allocated %.2f GiB" % (name, len(scores[name]),
                                                              torch.cuda.memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
