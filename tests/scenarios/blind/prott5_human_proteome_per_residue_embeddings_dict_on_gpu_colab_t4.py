"""embed_proteome.py -- a PhD student's Colab notebook (free tier, Tesla T4, 15 GB) that embeds the human
proteome (UniProt Swiss-Prot, 20,350 canonical sequences) with ProtT5-XL-U50 (Rostlab/prot_t5_xl_half_uniref50-enc,
the encoder only, 1.2B parameters, fp16: 2.25 GiB) for a per-residue binding-site predictor trained next.

The loop is the one of the ProtTrans example notebook (sort by length, longest first; batches of at most 100
sequences / 4000 residues; a sequence longer than 1000 residues alone), with two changes of the student's:
the example's `except RuntimeError: print(...); continue` is gone (it skipped proteins silently; titin, 34,350
aa, was one of them), sequences longer than 5000 residues are filtered out before the loop instead, and the
per-residue embeddings stay on the GPU, because the predictor trains on the GPU right after:

    with torch.no_grad():
        embedding_repr = model(input_ids=input_ids, attention_mask=attention_mask)
    for batch_idx, identifier in enumerate(pdb_ids):
        s_len = seq_lens[batch_idx]
        emb_dict[identifier] = embedding_repr.last_hidden_state[batch_idx, :s_len]   # the example: .cpu()

The long proteins of the start go through (a 5000-residue protein alone: 4.5 GiB of attention temporaries,
freed after the batch).  But each stored embedding is a view into its batch's padded last_hidden_state, on the
GPU, ~2 KiB per residue in fp16, and nothing is ever released.  After 5,315 proteins (the longest quarter of the
proteome, 5.9M residues: 11.8 GiB in the dict), the forward pass of an ordinary batch, five proteins of 677
residues, fails in its first layer asking 280 MiB (the float32 softmax of the attention) with 42 MiB free.  The
student reads "out of memory in attention" and thinks of long sequences, but the long ones passed long ago.

An expert: the memory is the results dictionary, not the model or the batch (2.25 GiB of weights, a few hundred
MiB per batch): move each embedding off the GPU as it is made (`.cpu()`, as the example does, or write each
batch to an HDF5 file; a view keeps its whole padded batch alive, so slicing on the GPU does not shrink it),
and hand the predictor its batches from host memory.  Wrong first advice: a smaller batch or max_residues (the
batch is already small; it only moves the failure a few hundred proteins on), shorter sequences / truncation
(the failing batch is short, and cut proteins lose the residues the predictor needs), flash attention (T5's
relative position bias has no fused path, and attention is not what fills the card), quantization or a bigger
GPU (they move the failure further down the proteome), empty_cache / expandable_segments (the tensors are
live), inference_mode (already under no_grad).
"""
import math
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# --- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------------
# t[i, :n] (basic indexing) is a view: it shares t's storage and keeps all of it alive.
torch.Tensor.__getitem__ = lambda self, idx: self.view()


def new_tensor(shape, dtype=torch.float16):
    """A tensor of `shape` and `dtype` on the GPU (what the layers of the model produce)."""
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


# --- a slim transformers.T5EncoderModel: the allocations its forward makes, in fp16 ---------------------------
D_MODEL, D_FF, HEADS, D_KV, LAYERS = 1024, 16384, 32, 128, 24
INNER = HEADS * D_KV


class T5Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name in ("q", "k", "v", "o"):
            setattr(self, name, torch.nn.Parameter(torch.empty(D_MODEL * INNER, dtype=torch.float16,
                                                               device="cuda"), requires_grad=False))

    def forward(self, hidden, position_bias, B, L):
        # q, k, v; scores = q @ k^T + position_bias; softmax(scores.float()).type_as(scores) @ v, then o():
        # the layer's peak is the float32 softmax; its output is added to `hidden` in place
        attn_weights = new_tensor((B, HEADS, L, L), torch.float32)
        del attn_weights
        return hidden


class T5DenseActDense(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wi = torch.nn.Parameter(torch.empty(D_MODEL * D_FF, dtype=torch.float16, device="cuda"),
                                     requires_grad=False)
        self.wo = torch.nn.Parameter(torch.empty(D_FF * D_MODEL, dtype=torch.float16, device="cuda"),
                                     requires_grad=False)

    def forward(self, hidden, B, L):
        h = new_tensor((B, L, D_FF))                                 # relu(wi(hidden))
        return h


class T5Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.SelfAttention = T5Attention()
        self.DenseReluDense = T5DenseActDense()

    def forward(self, hidden, position_bias, B, L):
        hidden = self.SelfAttention(hidden, position_bias, B, L)     # hidden + o(attention)
        ff = self.DenseReluDense(hidden, B, L)
        del ff
        return hidden                                                # hidden + wo(relu(wi(hidden)))


class ModelOutput(object):
    def __init__(self, last_hidden_state):
        self.last_hidden_state = last_hidden_state


class T5EncoderModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.shared = torch.nn.Parameter(torch.empty(128 * D_MODEL, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)
        for i in range(LAYERS):
            setattr(self, "block_%d" % i, T5Block())

    def forward(self, input_ids, attention_mask):
        B, L = input_ids.shape
        hidden = new_tensor((B, L, D_MODEL))                         # embed_tokens
        position_bias = new_tensor((B, HEADS, L, L))                 # relative bias + extended mask, layer 0
        for i in range(LAYERS):
            hidden = getattr(self, "block_%d" % i)(hidden, position_bias, B, L)
        return ModelOutput(new_tensor((B, L, D_MODEL)))              # final_layer_norm


class T5Tokenizer(object):
    def batch_encode_plus(self, seqs, add_special_tokens=True, padding="longest"):
        L = max(len(s.replace(" ", "")) for s in seqs) + 1           # + </s>
        return {"input_ids": (len(seqs), L), "attention_mask": (len(seqs), L)}


# --- the notebook ---------------------------------------------------------------------------------------------
def read_fasta_lengths():
    """UniProt human reference proteome, canonical (stand-in: the lengths, log-normal as the real ones)."""
    rng = random.Random(9606)
    seqs = {}
    for i in range(20350):
        n = int(min(35000, max(30, rng.lognormvariate(math.log(415), 0.75))))
        seqs["sp|P%05d|HUMAN" % i] = "M" * n
    return seqs


def get_T5_model():
    model = T5EncoderModel()
    model = model.to("cuda").eval()
    return model, T5Tokenizer()


def get_embeddings(model, tokenizer, seqs, max_residues=4000, max_seq_len=1000, max_batch=100):
    emb_dict = dict()
    seq_dict = sorted(seqs.items(), key=lambda kv: len(seqs[kv[0]]), reverse=True)
    batch = list()
    for seq_idx, (pdb_id, seq) in enumerate(seq_dict, 1):
        seq = seq.replace("U", "X").replace("Z", "X").replace("O", "X")
        seq_len = len(seq)
        seq = " ".join(list(seq))
        batch.append((pdb_id, seq, seq_len))

        n_res_batch = sum([s_len for _, _, s_len in batch]) + seq_len
        if len(batch) >= max_batch or n_res_batch >= max_residues or seq_idx == len(seq_dict) or seq_len > max_seq_len:
            pdb_ids, seqs_b, seq_lens = zip(*batch)
            batch = list()

            token_encoding = tokenizer.batch_encode_plus(seqs_b, add_special_tokens=True, padding="longest")
            input_ids = new_tensor(token_encoding["input_ids"], torch.uint8)
            attention_mask = new_tensor(token_encoding["attention_mask"], torch.uint8)
            with torch.no_grad():
                embedding_repr = model(input_ids, attention_mask=attention_mask)

            for batch_idx, identifier in enumerate(pdb_ids):
                s_len = seq_lens[batch_idx]
                emb = embedding_repr.last_hidden_state[batch_idx, :s_len]
                emb_dict[identifier] = emb          # kept on the GPU: the predictor trains there next
            if len(emb_dict) % 1000 < len(pdb_ids):
                print("embedded %5d proteins, last L=%4d, GPU allocated %.1f GiB" % (
                    len(emb_dict), seq_len, torch.cuda.memory_allocated() / 2 ** 30))
    return emb_dict


seqs = read_fasta_lengths()
seqs = {k: v for k, v in seqs.items() if len(v) <= 5000}       # titin & co. do not fit (first try)
print("sequences:", len(seqs), "residues:", sum(len(v) for v in seqs.values()))
model, tokenizer = get_T5_model()
try:
    embeddings = get_embeddings(model, tokenizer, seqs)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
print("done:", len(embeddings))
sys.exit(0)
