"""ESM-2 650M per-residue embeddings kept as GPU views in a dict: each keeps its whole batch tensor (A10G 24GB).

The real program (embed_gh5_family.py) computes per-residue ESM-2 embeddings for a protein family (48,000
glycoside hydrolase sequences from a metagenome screen) to train a small downstream active-site predictor.
The author adapted esm's scripts/extract.py but kept the results on the GPU "to save the copies":

    model, alphabet = esm.pretrained.esm2_t33_650M_UR50D()
    model = model.eval().cuda()
    dataset = FastaBatchedDataset.from_file("gh5_family.fasta")
    batches = dataset.get_batch_indices(toks_per_batch=16384, extra_toks_per_seq=1)   # 4x extract.py's
    loader = DataLoader(dataset, collate_fn=alphabet.get_batch_converter(1022), batch_sampler=batches)
    embeddings = {}
    with torch.no_grad():
        for labels, strs, toks in loader:
            out = model(toks.cuda(non_blocking=True), repr_layers=[33])
            reps = out["representations"][33]                    # B x T x 1280, fp32
            for i, label in enumerate(labels):
                embeddings[label] = reps[i, 1:len(strs[i]) + 1]  # a view: no .clone(), no .cpu()
    torch.save(embeddings, "gh5_esm2_t33.pt")

extract.py does `t[i, 1:L+1].clone()` and moves results to the CPU; this script keeps views.  A view keeps its
whole base storage alive, so the dict holds one full B x T x 1280 fp32 tensor per batch (toks_per_batch 16384:
up to 16384 x 1280 x 4 B = 84 MB per batch), padding and the rows of the sorted-by-length neighbours included.

Sizes: weights 651M fp32 = 2.6 GB; the forward under no_grad is transient (per layer q/k/v, attention
weights B x 20 heads x T x T fp32: 16384 x 20 x T x 4 B, ~350-450 MB for the mid-length batches, FFN);
A10G 23,028 MiB less a 512 MiB context and the weights leaves ~19.5 GiB, i.e. ~230 batches of ~80 MB.  The
48,000 sequences make ~1,040 batches: the job dies about a fifth of the way through, with ~17.5 GiB of kept
batch tensors (20 GiB allocated), on an ordinary ~350 MiB attention-weights transient of the next forward.
The cache shows ~1.8 GiB reserved but unallocated at that moment: holes between the kept tensors, a side
effect of the growth, not its cause.

What an expert says: memory grows by one batch tensor per batch, held by the `embeddings` dict; the forward
is small and already under no_grad.  Copy each embedding off the GPU (`reps[i, 1:L+1].clone().cpu()`, or
mean-pool and `.cpu()`); clone() alone would still grow (~1.8 MB per protein) and die later.  Wrong advice:
inference_mode (no_grad is on, no graph), a smaller toks_per_batch (grows just the same), fp16/quantisation
of the model (the 2.6 GB of weights are not the problem), expandable segments / empty_cache (they would win
back the 1.8 GiB of holes: ~20 more batches of 1,040), a bigger card (the dict still grows without bound).
"""
import random

import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn

device = "cuda"

NUM_LAYERS = 33
EMBED_DIM = 1280
HEADS = 20
FFN_DIM = 4 * EMBED_DIM
VOCAB = 33
TOKS_PER_BATCH = 16384
TRUNCATION = 1022
NUM_SEQUENCES = 48_000


# --- the model ---------------------------------------------------------------------------------------------
def weight(numel):
    return nn.Parameter(torch.empty(numel, dtype=torch.float32, device=device))


def activation(numel):
    return torch.empty(numel, dtype=torch.float32, device=device)


class TransformerLayer(nn.Module):
    def __init__(self, embed_dim, ffn_dim, heads):
        nn.Module.__init__(self)
        self.heads = heads
        self.q_proj = weight(embed_dim * embed_dim)
        self.k_proj = weight(embed_dim * embed_dim)
        self.v_proj = weight(embed_dim * embed_dim)
        self.out_proj = weight(embed_dim * embed_dim)
        self.fc1 = weight(embed_dim * ffn_dim)
        self.fc2 = weight(ffn_dim * embed_dim)
        self.norms = weight(4 * embed_dim)

    def forward(self, x, batch, seq_len):
        qkv = activation(3 * batch * seq_len * EMBED_DIM)
        attn_weights = activation(batch * self.heads * seq_len * seq_len)     # softmax(q k^T), rotary q/k
        attn = activation(batch * seq_len * EMBED_DIM)
        del attn_weights, qkv
        ffn = activation(batch * seq_len * FFN_DIM)
        out = activation(batch * seq_len * EMBED_DIM)
        del ffn, attn
        return out


class ESM2(nn.Module):
    def __init__(self, num_layers=NUM_LAYERS, embed_dim=EMBED_DIM, heads=HEADS):
        nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * embed_dim)
        self.layers = nn.Module()
        for i in range(num_layers):
            setattr(self.layers, str(i), TransformerLayer(embed_dim, FFN_DIM, heads))
        self.emb_layer_norm_after = weight(2 * embed_dim)
        self.lm_head = weight(embed_dim * embed_dim + 2 * embed_dim + VOCAB)
        self.contact_head = weight(num_layers * heads + 1)

    def forward(self, tokens, repr_layers=(), return_contacts=False):
        batch, seq_len = tokens.shape
        x = activation(batch * seq_len * EMBED_DIM)
        representations = {}
        for i, layer in enumerate(self.layers._modules.values()):
            x = layer(x, batch, seq_len)
            if i + 1 in repr_layers:
                representations[i + 1] = activation(batch * seq_len * EMBED_DIM)   # emb_layer_norm_after(x)
        logits = activation(batch * seq_len * VOCAB)
        return {"logits": logits, "representations": representations}


def esm2_t33_650M_UR50D():
    return ESM2(), "ESM-1b alphabet"


# --- the data ----------------------------------------------------------------------------------------------
class Tokens(object):
    """the batch converter's B x T int64 token tensor, moved to the GPU"""

    def __init__(self, batch, seq_len):
        self.shape = (batch, seq_len)
        self.data = torch.empty(batch * seq_len * 8, device=device)


def read_fasta(path):
    rng = random.Random(5)
    seqs = []
    for k in range(NUM_SEQUENCES):
        length = int(min(max(rng.lognormvariate(5.8, 0.35), 60), 1400))
        seqs.append(("GH5_%06d" % k, length))
    return seqs


def get_batch_indices(seqs, toks_per_batch, extra_toks_per_seq=1):
    """esm.data.FastaBatchedDataset.get_batch_indices: sorted by length, greedily packed"""
    order = sorted(range(len(seqs)), key=lambda i: seqs[i][1])
    batches, buf, max_len = [], [], 0
    for i in order:
        sz = min(seqs[i][1], TRUNCATION) + extra_toks_per_seq
        if buf and max(sz, max_len) * (len(buf) + 1) > toks_per_batch:
            batches.append(buf)
            buf, max_len = [], 0
        max_len = max(max_len, sz)
        buf.append(i)
    if buf:
        batches.append(buf)
    return batches


def batch_converter(seqs, idx):
    labels = [seqs[i][0] for i in idx]
    lengths = [min(seqs[i][1], TRUNCATION) for i in idx]
    toks = Tokens(len(idx), max(lengths) + 2)          # <cls> ... <eos>, padded
    return labels, lengths, toks


def extract_embeddings(model, seqs, batches):
    embeddings = {}
    with torch.no_grad():
        for batch_idx, idx in enumerate(batches):
            labels, lengths, toks = batch_converter(seqs, idx)
            out = model(toks, repr_layers=[33], return_contacts=False)
            reps = out["representations"][33]
            for i, label in enumerate(labels):
                embeddings[label] = reps.view(lengths[i], EMBED_DIM)    # reps[i, 1:L+1]: a view of reps
            if batch_idx % 200 == 0:
                print("batch %d/%d (%d sequences)" % (batch_idx + 1, len(batches), len(embeddings)))
    return embeddings


def main():
    model, alphabet = esm2_t33_650M_UR50D()
    model = model.eval().cuda()
    seqs = read_fasta("gh5_family.fasta")
    batches = get_batch_indices(seqs, TOKS_PER_BATCH, extra_toks_per_seq=1)
    print("%d sequences, %d batches" % (len(seqs), len(batches)))
    embeddings = extract_embeddings(model, seqs, batches)
    torch.save(embeddings, "gh5_esm2_t33.pt")


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
