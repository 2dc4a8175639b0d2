"""fold_complex.py -- predicting the structure of a 2,000-residue antibody-antigen complex (chains
joined by a poly-G linker) with ESMFold on one 24 GB card, following the Hugging Face notebook
half-way:

    model = EsmForProteinFolding.from_pretrained("facebook/esmfold_v1").cuda()
    model.esm = model.esm.half()              # the 3B-parameter language model in fp16 (5.2 GiB)
    # model.trunk.set_chunk_size(64)          # <- the notebook's next line, skipped
    with torch.no_grad():
        output = model(**tokenizer([sequence], return_tensors="pt", add_special_tokens=False))

Proteins of 300-600 residues folded fine.  At L = 2,000 the pair representation is L x L x 128 fp32
(1.9 GiB per tensor); the first folding block's triangle attention computes, without chunking, its
scores for every row at once: L x 4 heads x L x L fp32 = 119 GiB in one request, on a card with
about 6 GiB free.  It runs under torch.no_grad(), one sequence.

An expert: chunk the trunk (model.trunk.set_chunk_size(64), or smaller): the triangle updates and
attention then run over slices of rows and the pair representation (a few GiB) is what must fit.
No card holds the unchunked request.  Not a smaller batch (one sequence), not inference mode or
gradient checkpointing (no autograd already), not quantization / 8-bit / CPU offload of the weights
(7.8 GiB of weights are not the problem), not mixed precision (half of 119 GiB still does not fit),
not the cache or fragmentation.
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
ESM_LAYERS, ESM_DIM, ESM_HEADS = 36, 2560, 40
C_S, C_Z, TRI_HEADS, TRI_DIM, TRUNK_BLOCKS = 1024, 128, 4, 32, 48


def param(nbytes, dtype=None):
    return nn.Parameter(torch.empty(nbytes, dtype=dtype, device="cuda"), requires_grad=False)


class EsmLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = param(4 * ESM_DIM * ESM_DIM * 4)        # fp32 until .half()
        self.ffn = param(8 * ESM_DIM * ESM_DIM * 4)

    def half(self):
        self.attention = param(4 * ESM_DIM * ESM_DIM, dtype=torch.float16)
        self.ffn = param(8 * ESM_DIM * ESM_DIM, dtype=torch.float16)
        return self

    def forward(self, h, seq):
        scores = torch.empty(ESM_HEADS * seq * seq, dtype=torch.float16, device="cuda")
        out = torch.empty(seq * ESM_DIM, dtype=torch.float16, device="cuda")
        del scores
        return out


class EsmModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layers = [EsmLayer() for _ in range(ESM_LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer_%d" % i, l)

    def half(self):
        for l in self.layers:
            l.half()
        return self

    def forward(self, input_ids):
        seq = len(input_ids)
        h = torch.empty(seq * ESM_DIM, dtype=torch.float16, device="cuda")
        hidden_states = [h]
        for layer in self.layers:
            h = layer(h, seq)
            hidden_states.append(h)
        return hidden_states


class TriangleMultiplicativeUpdate(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linear_ab = param(C_Z * 4 * C_Z * 4)

    def forward(self, z, seq):
        pair = seq * seq * C_Z * 4
        z_ln = torch.empty(pair, device="cuda")
        a = torch.empty(pair, device="cuda")
        b = torch.empty(pair, device="cuda")
        out = torch.empty(pair, device="cuda")
        del z_ln, a, b
        return out


class TriangleAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linear_qkv = param(C_Z * 3 * TRI_HEADS * TRI_DIM * 4)
        self.chunk_size = None

    def forward(self, z, seq):
        pair = seq * seq * C_Z * 4
        z_ln = torch.empty(pair, device="cuda")
        q = torch.empty(seq * seq * TRI_HEADS * TRI_DIM * 4, device="cuda")
        k = torch.empty(seq * seq * TRI_HEADS * TRI_DIM * 4, device="cuda")
        v = torch.empty(seq * seq * TRI_HEADS * TRI_DIM * 4, device="cuda")
        triangle_bias = torch.empty(seq * seq * TRI_HEADS * 4, device="cuda")
        rows = seq if self.chunk_size is None else self.chunk_size
        scores = torch.empty(rows * TRI_HEADS * seq * seq * 4, device="cuda")     # [I, H, J, K]
        out = torch.empty(pair, device="cuda")
        del scores
        return out


class FoldingTrunkBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.seq_attention = param(4 * C_S * C_S * 4)
        self.seq_transition = param(8 * C_S * C_S * 4)
        self.tri_mul_out = TriangleMultiplicativeUpdate()
        self.tri_mul_in = TriangleMultiplicativeUpdate()
        self.tri_att_start = TriangleAttention()
        self.tri_att_end = TriangleAttention()

    def forward(self, s, z, seq):
        upd = self.tri_mul_out(z, seq)
        del upd
        upd = self.tri_mul_in(z, seq)
        del upd
        upd = self.tri_att_start(z, seq)
        del upd
        upd = self.tri_att_end(z, seq)
        del upd
        return s, z


class FoldingTrunk(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.blocks = [FoldingTrunkBlock() for _ in range(TRUNK_BLOCKS)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block_%d" % i, b)
        self.structure_module = param(200 * MiB)

    def set_chunk_size(self, chunk_size):
        for b in self.blocks:
            b.tri_att_start.chunk_size = b.tri_att_end.chunk_size = chunk_size

    def forward(self, s_s_0, s_z_0, seq):
        s, z = s_s_0, s_z_0
        for block in self.blocks:
            s, z = block(s, z, seq)
        return s, z


class EsmForProteinFolding(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.esm = EsmModel()
        self.esm_s_combine = param(ESM_LAYERS * 4)
        self.trunk = FoldingTrunk()

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def cuda(self, device=None):
        return self

    def forward(self, input_ids):
        seq = len(input_ids)
        esm_hidden = self.esm(input_ids)
        esm_s = torch.empty((ESM_LAYERS + 1) * seq * ESM_DIM, dtype=torch.float16, device="cuda")
        del esm_hidden
        s_s_0 = torch.empty(seq * C_S * 4, device="cuda")
        s_z_0 = torch.empty(seq * seq * C_Z * 4, device="cuda")
        structure = self.trunk(s_s_0, s_z_0, seq)
        return structure


def tokenizer(seqs):
    return {"input_ids": [[5 + "ACDEFGHIKLMNPQRSTVWY".index(c) for c in s] for s in seqs]}


def main():
    heavy = "EVQLVESGGGLVQPGGSLRLSCAAS" * 9
    light = "DIQMTQSPSSLSASVGDRVTITC" * 9
    antigen = "MKTAYIAKQRQISFVKSHFSRQ" * 70
    linker = "G" * 25
    complex_seq = (heavy + linker + light + linker + antigen)[:2000]
    model = EsmForProteinFolding.from_pretrained("facebook/esmfold_v1").cuda()
    model.esm = model.esm.half()
    model.eval()
    with torch.no_grad():
        output = model(tokenizer([complex_seq])["input_ids"][0])
    return output


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
