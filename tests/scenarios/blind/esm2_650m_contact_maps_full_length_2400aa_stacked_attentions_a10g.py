"""ESM-2 650M unsupervised contact maps for a benchmark set, one 2,398-residue protein, on an A10G (24 GB).

The real program (fair-esm 2.0, PyTorch 2.1, one A10G on an AWS g5.xlarge):

    model, alphabet = esm.pretrained.esm2_t33_650M_UR50D()
    model = model.eval().cuda()
    batch_converter = alphabet.get_batch_converter()      # truncation_seq_length=None: no cropping
    contacts = {}
    for label, seq in read_fasta("dca_benchmark_full_length.fasta"):
        _, _, toks = batch_converter([(label, seq)])
        with torch.no_grad():
            out = model(toks.cuda(), repr_layers=[33], return_contacts=True)
        contacts[label] = out["contacts"][0].cpu().numpy()

The user wants full-length contact maps for a coevolution benchmark (PDB chains and a few multidomain
proteins), so they removed extract.py's default `--truncation_seq_length 1022` and call the model one
sequence at a time (batch 1).  The first 36 chains (148-1,104 residues) go through; the 37th is a
2,398-residue non-ribosomal peptide synthetase module, L = 2,400 tokens with BOS/EOS.

return_contacts=True sets need_head_weights: every one of the 33 layers returns its fp32 softmax
attention weights, (1, 20 heads, L, L) = 20 x 2400^2 x 4 B = 460.8 MB (439.5 MiB), and ESM2.forward keeps
them all in a list (`attn_weights.append(attn.transpose(1, 0))`): 33 x 439.5 MiB = 14.16 GiB.  Then
`attentions = torch.stack(attn_weights, 1)` asks for the same 14.16 GiB again in one block, before the
ContactPredictionHead (which makes more copies: the padding mask product, APC, symmetrization).
Weights 651 M x 4 B = 2.43 GiB, CUDA context ~0.5 GiB, the 33 kept maps 14.16 GiB: 17.1 GiB in use of
22.49 GiB, about 5.3 GiB free; the stack's 14.16 GiB cannot fit.  The model is already under
torch.no_grad() and the batch is one sequence.

What an expert says first: this is the sequence length, quadratic, times 33 layers x 20 heads of kept
attention maps: crop it.  ESM-2 was trained on crops of 1,022 residues; predict contacts on overlapping
1,022-residue windows (or crop to the domains) and stitch the maps; at L = 1,024 the kept maps are
33 x 20 x 1024^2 x 4 = 2.6 GiB and the stack as much again, which fits.  model.half() would halve the
maps (a second-line help; at 2,400 it still needs 7.1 + 7.1 GiB beside 1.2 GiB of weights, tight).
Wrong advice: inference_mode/no_grad (already on, no graph is kept), a smaller batch (it is 1),
empty_cache/expandable_segments (nothing is cached or fragmented: 14 GiB of live maps), gradient
checkpointing (no training), flash-attention (it returns no attention weights, and the contact head is
built on them).
"""
import torch
import torch.nn as nn
import scen_truth

scen_truth.note_every_empty(torch)

EMBED_DIM = 1280
NUM_LAYERS = 33
NUM_HEADS = 20
FFN_DIM = 5120
VOCAB = 33


class ModuleList(nn.Module):
    """torch.nn.ModuleList: children kept under "0" ... "n-1"."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32)) if bias else None

    def forward(self, x):
        rows = x.nbytes // (4 * self.in_features)
        w = self.weight
        out = torch.empty(rows * self.out_features, dtype=torch.float32)
        if torch.is_grad_enabled():
            out._saved = (x, w)
        return out


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        out = torch.empty(x.nbytes // 4, dtype=torch.float32)
        if torch.is_grad_enabled():
            out._saved = x
        return out


class MultiheadAttention(nn.Module):
    """esm.multihead_attention.MultiheadAttention (rotary embeddings, no bias_kv)."""

    def __init__(self, embed_dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.k_proj = Linear(embed_dim, embed_dim)
        self.v_proj = Linear(embed_dim, embed_dim)
        self.q_proj = Linear(embed_dim, embed_dim)
        self.out_proj = Linear(embed_dim, embed_dim)

    def forward(self, x, seq_len, need_head_weights=False):
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        # attn_weights = torch.bmm(q, k.transpose(1, 2)): (heads, L, L)
        attn_logits = torch.empty(self.num_heads * seq_len * seq_len, dtype=torch.float32)
        # attn_weights_float = utils_softmax(attn_weights, dim=-1, onnx_trace=self.onnx_trace)
        attn_weights_float = torch.empty(self.num_heads * seq_len * seq_len, dtype=torch.float32)
        del attn_logits
        attn = torch.empty(seq_len * EMBED_DIM, dtype=torch.float32)      # torch.bmm(attn_probs, v)
        if torch.is_grad_enabled():
            attn._saved = (attn_weights_float, v, q, k)
        attn = self.out_proj(attn)
        return attn, (attn_weights_float if need_head_weights else None)


class TransformerLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = MultiheadAttention(EMBED_DIM, NUM_HEADS)
        self.self_attn_layer_norm = LayerNorm(EMBED_DIM)
        self.fc1 = Linear(EMBED_DIM, FFN_DIM)
        self.fc2 = Linear(FFN_DIM, EMBED_DIM)
        self.final_layer_norm = LayerNorm(EMBED_DIM)

    def forward(self, x, seq_len, need_head_weights=False):
        residual = x
        h = self.self_attn_layer_norm(x)
        h, attn = self.self_attn(h, seq_len, need_head_weights=need_head_weights)
        x = torch.empty(residual.nbytes // 4, dtype=torch.float32)           # residual + h
        residual = x
        h = self.final_layer_norm(x)
        h = self.fc1(h)
        h = torch.empty(h.nbytes // 4, dtype=torch.float32)                 # gelu(h)
        h = self.fc2(h)
        x = torch.empty(residual.nbytes // 4, dtype=torch.float32)           # residual + h
        return x, attn


class ContactPredictionHead(nn.Module):
    def __init__(self, in_features):
        nn.Module.__init__(self)
        self.regression = Linear(in_features, 1)

    def forward(self, tokens_len, attentions):
        L = tokens_len - 2                                                   # drop BOS/EOS
        attentions = torch.empty(NUM_LAYERS * NUM_HEADS * L * L, dtype=torch.float32)
        return torch.empty(L * L, dtype=torch.float32)


class ESM2(nn.Module):
    """esm.model.esm2.ESM2 (esm2_t33_650M_UR50D)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * EMBED_DIM, dtype=torch.float32))
        self.layers = ModuleList([TransformerLayer() for _ in range(NUM_LAYERS)])
        self.emb_layer_norm_after = LayerNorm(EMBED_DIM)
        self.lm_head_dense = Linear(EMBED_DIM, EMBED_DIM)
        self.lm_head_norm = LayerNorm(EMBED_DIM)
        self.contact_head = ContactPredictionHead(NUM_LAYERS * NUM_HEADS)

    def forward(self, tokens_len, repr_layers=(), return_contacts=False):
        need_head_weights = return_contacts
        x = torch.empty(tokens_len * EMBED_DIM, dtype=torch.float32)          # self.embed_scale * embed_tokens(tokens)
        hidden_representations = {}
        if need_head_weights:
            attn_weights = []
        for layer_idx, layer in enumerate(self.layers):
            x, attn = layer(x, tokens_len, need_head_weights=need_head_weights)
            if (layer_idx + 1) in repr_layers:
                hidden_representations[layer_idx + 1] = x
            if need_head_weights:
                # (H x B x T x T) => (B x H x T x T)
                attn_weights.append(attn)
        x = self.emb_layer_norm_after(x)
        result = {"representations": hidden_representations}
        if need_head_weights:
            # attentions: B x L x H x T x T
            attentions = torch.empty(NUM_LAYERS * NUM_HEADS * tokens_len * tokens_len, dtype=torch.float32)
            del attn_weights
            result["attentions"] = attentions
            if return_contacts:
                result["contacts"] = self.contact_head(tokens_len, attentions)
        return result


class HostArray(object):
    """What .cpu().numpy() hands back: host memory only."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def read_fasta(path):
    """The benchmark set: PDB chains (CASP/CAMEO targets) and a few multidomain proteins."""
    lengths = [312, 587, 148, 903, 421, 256, 764, 198, 1104, 377, 512, 689, 233, 841, 455, 300, 620, 178,
               955, 402, 266, 731, 519, 344, 1012, 287, 468, 805, 221, 639, 390, 574, 167, 880, 436, 702,
               2398, 345, 611, 489]
    for i, n in enumerate(lengths):
        yield "chain_%03d" % i, n


def predict_contacts(model, fasta_path):
    contacts = {}
    for label, seq_len in read_fasta(fasta_path):
        tokens_len = seq_len + 2                                             # <cls> ... <eos>, no truncation
        with torch.no_grad():
            out = model(tokens_len, repr_layers=[33], return_contacts=True)
        contacts[label] = HostArray(out["contacts"].nbytes)                  # out["contacts"][0].cpu().numpy()
        del out
    return contacts


def main():
    model = ESM2()
    model = model.eval().cuda()
    contacts = predict_contacts(model, "dca_benchmark_full_length.fasta")
    print("contact maps:", len(contacts))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
