"""A Pairformer-style antibody-antigen docking model trained with all four recycling iterations under autograd.

The real program: a lab's own PyTorch 2.2 re-implementation of an AF3-like trunk (single + pair
representation, 16 Pairformer blocks, c_z = 128, c_s = 384, OpenFold's layer code copied in) fine-tuned
on SAbDab antibody-antigen complexes, one complex a step (crop 256 residues), fp32, on one
A100-SXM4-80GB.  The training step is

    outputs = model(batch)                      # model.forward recycles 3 times, as at inference
    loss = distogram_loss(outputs, batch) + fape_loss(outputs, batch)
    loss.backward(); optimizer.step(); optimizer.zero_grad()

and model.forward is

    s_prev, z_prev = zeros, zeros
    for cycle in range(self.num_recycles + 1):          # 4 passes through the trunk
        s, z = self.recycling_embedder(s_init, z_init, s_prev, z_prev)
        s, z = self.pairformer(s, z, mask)
        s_prev, z_prev = s, z                           # no detach, grad enabled every cycle

AlphaFold / OpenFold run every cycle but the last under torch.no_grad() (set_grad_enabled(is_final_iter))
and detach the recycled s/z; this re-implementation does not, so autograd keeps the activations of all
four trunk passes for one backward.  Activation checkpointing of the blocks is off (not implemented).

Sizes, N = 256, fp32: a pair tensor N^2 x 128 x 4 B = 32 MiB; a triangle attention's probabilities
4 heads x N^3 x 4 B = 256 MiB.  A Pairformer block keeps ~ 2.3 GiB for backward (two triangle
multiplications ~ 10 pair tensors each, two triangle attentions 256 MiB of probabilities + ~8 pair
tensors each, the pair transition's 4x-wide hidden, the residual sums), so one trunk pass is ~ 36 GiB
and fits the 80 GiB card beside 40 M parameters (0.15 GiB) with room for the backward.  Four passes
need ~ 145 GiB: the first step fails in the third cycle (cycle 2), in its third block, asking for one
256 MiB attention-probability tensor with ~ 79 GiB of saved activations alive.  Batch is 1.

What an expert says first: run the first three cycles under torch.no_grad() and detach s_prev/z_prev
(the recycling as AlphaFold trains it; also the random number of cycles per step): autograd then keeps
one trunk pass, ~ 36 GiB, a quarter.  Second: activation checkpointing of the Pairformer blocks
(OpenFold's checkpoint_blocks, blocks_per_ckpt=1) keeps only the block inputs, ~ 0.1 GiB a block, and
would make even this fit; bf16 autocast halves the rest.
Wrong advice: a smaller batch (it is 1 complex), empty_cache or expandable_segments (every byte is a
live saved activation of this step), ZeRO/FSDP or several GPUs (40 M parameters; optimizer state is
nothing here), inference_mode (it trains), a leak across steps (it is the first step).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F
import scen_truth

scen_truth.note_every_empty(torch)

C_Z = 128
C_S = 384
N_HEADS_PAIR = 4
N_HEADS_SINGLE = 16
NO_BLOCKS = 16
CROP = 256


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


def _new(numel, *saved):
    """A new fp32 activation of numel values; `saved` is what autograd keeps for its backward."""
    t = torch.empty(numel, dtype=torch.float32)
    if torch.is_grad_enabled():
        t._saved = saved
    return t


class Linear(nn.Module):
    def __init__(self, in_dim, out_dim, bias=True):
        nn.Module.__init__(self)
        self.in_dim, self.out_dim = in_dim, out_dim
        self.weight = nn.Parameter(torch.empty(in_dim * out_dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_dim, dtype=torch.float32)) if bias else None

    def forward(self, x):
        rows = x.nbytes // (4 * self.in_dim)
        return _new(rows * self.out_dim, x, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float32))

    def forward(self, x):
        return _new(x.nbytes // 4, x, self.weight)


def sigmoid_gate(x, g):
    return _new(x.nbytes // 4, x, g)


def residual_add(x, y):
    return _new(x.nbytes // 4, x, y)


class TriangleMultiplicativeUpdate(nn.Module):
    """openfold.model.triangular_multiplicative_update (outgoing or incoming edges)."""

    def __init__(self, c_z, c_hidden, outgoing=True):
        nn.Module.__init__(self)
        self.outgoing = outgoing
        self.layer_norm_in = LayerNorm(c_z)
        self.linear_a_p = Linear(c_z, c_hidden)
        self.linear_a_g = Linear(c_z, c_hidden)
        self.linear_b_p = Linear(c_z, c_hidden)
        self.linear_b_g = Linear(c_z, c_hidden)
        self.layer_norm_out = LayerNorm(c_hidden)
        self.linear_z = Linear(c_hidden, c_z)
        self.linear_g = Linear(c_z, c_z)

    def forward(self, z):
        z = self.layer_norm_in(z)
        a = sigmoid_gate(self.linear_a_p(z), self.linear_a_g(z))
        b = sigmoid_gate(self.linear_b_p(z), self.linear_b_g(z))
        x = _new(a.nbytes // 4, a, b)                      # einsum("bikc,bjkc->bijc") (or "bkic,bkjc")
        x = self.linear_z(self.layer_norm_out(x))
        return sigmoid_gate(x, self.linear_g(z))


class TriangleAttention(nn.Module):
    """openfold.model.triangular_attention: row-wise attention over the pair map with a triangle bias."""

    def __init__(self, c_z, c_hidden, no_heads, starting=True):
        nn.Module.__init__(self)
        self.no_heads, self.starting = no_heads, starting
        self.layer_norm = LayerNorm(c_z)
        self.linear = Linear(c_z, no_heads, bias=False)    # the triangle bias
        self.linear_q = Linear(c_z, c_hidden * no_heads, bias=False)
        self.linear_k = Linear(c_z, c_hidden * no_heads, bias=False)
        self.linear_v = Linear(c_z, c_hidden * no_heads, bias=False)
        self.linear_g = Linear(c_z, c_hidden * no_heads)
        self.linear_o = Linear(c_hidden * no_heads, c_z)

    def forward(self, z, n_res):
        z = self.layer_norm(z)
        triangle_bias = self.linear(z)
        q, k, v = self.linear_q(z), self.linear_k(z), self.linear_v(z)
        # a = softmax(q @ k^T / sqrt(c) + mask_bias + triangle_bias): [N, H, N, N], no chunking (training)
        logits = _new(self.no_heads * n_res ** 3, q, k, triangle_bias)
        a = _new(self.no_heads * n_res ** 3, q, k, triangle_bias)
        del logits
        o = _new(v.nbytes // 4, a, v)                      # a @ v
        o = sigmoid_gate(o, self.linear_g(z))
        return self.linear_o(o)


class PairTransition(nn.Module):
    def __init__(self, c_z, n=4):
        nn.Module.__init__(self)
        self.layer_norm = LayerNorm(c_z)
        self.linear_1 = Linear(c_z, n * c_z)
        self.linear_2 = Linear(n * c_z, c_z)

    def forward(self, z):
        h = self.linear_1(self.layer_norm(z))
        h = _new(h.nbytes // 4, h)                         # relu
        return self.linear_2(h)


class AttentionPairBias(nn.Module):
    """Single-representation attention biased by the pair representation (AF3 Algorithm 24)."""

    def __init__(self, c_s, c_z, no_heads):
        nn.Module.__init__(self)
        self.no_heads = no_heads
        self.layer_norm_s = LayerNorm(c_s)
        self.layer_norm_z = LayerNorm(c_z)
        self.linear_b = Linear(c_z, no_heads, bias=False)
        self.linear_q = Linear(c_s, c_s)
        self.linear_k = Linear(c_s, c_s, bias=False)
        self.linear_v = Linear(c_s, c_s, bias=False)
        self.linear_g = Linear(c_s, c_s, bias=False)
        self.linear_o = Linear(c_s, c_s, bias=False)

    def forward(self, s, z, n_res):
        s = self.layer_norm_s(s)
        b = self.linear_b(self.layer_norm_z(z))
        q, k, v = self.linear_q(s), self.linear_k(s), self.linear_v(s)
        a = _new(self.no_heads * n_res * n_res, q, k, b)
        o = sigmoid_gate(_new(s.nbytes // 4, a, v), self.linear_g(s))
        return self.linear_o(o)


class SingleTransition(nn.Module):
    def __init__(self, c_s, n=4):
        nn.Module.__init__(self)
        self.layer_norm = LayerNorm(c_s)
        self.linear_1 = Linear(c_s, n * c_s)
        self.linear_2 = Linear(n * c_s, c_s)

    def forward(self, s):
        return self.linear_2(_new(s.nbytes * 4 // 4, self.linear_1(self.layer_norm(s))))


class PairformerBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.tri_mul_out = TriangleMultiplicativeUpdate(C_Z, C_Z, outgoing=True)
        self.tri_mul_in = TriangleMultiplicativeUpdate(C_Z, C_Z, outgoing=False)
        self.tri_att_start = TriangleAttention(C_Z, 32, N_HEADS_PAIR, starting=True)
        self.tri_att_end = TriangleAttention(C_Z, 32, N_HEADS_PAIR, starting=False)
        self.pair_transition = PairTransition(C_Z)
        self.attention_pair_bias = AttentionPairBias(C_S, C_Z, N_HEADS_SINGLE)
        self.single_transition = SingleTransition(C_S)

    def forward(self, s, z, n_res):
        z = residual_add(z, self.tri_mul_out(z))
        z = residual_add(z, self.tri_mul_in(z))
        z = residual_add(z, self.tri_att_start(z, n_res))
        z = residual_add(z, self.tri_att_end(z, n_res))
        z = residual_add(z, self.pair_transition(z))
        s = residual_add(s, self.attention_pair_bias(s, z, n_res))
        s = residual_add(s, self.single_transition(s))
        return s, z


class PairformerStack(nn.Module):
    def __init__(self, no_blocks):
        nn.Module.__init__(self)
        self.blocks = ModuleList([PairformerBlock() for _ in range(no_blocks)])

    def forward(self, s, z, n_res):
        for block in self.blocks:
            s, z = block(s, z, n_res)
        return s, z


class InputEmbedder(nn.Module):
    def __init__(self, tf_dim=22):
        nn.Module.__init__(self)
        self.linear_tf_s = Linear(tf_dim, C_S)
        self.linear_tf_z_i = Linear(tf_dim, C_Z)
        self.linear_tf_z_j = Linear(tf_dim, C_Z)
        self.linear_relpos = Linear(2 * 32 + 2 + 1, C_Z)   # relative position + chain (antibody / antigen)

    def forward(self, target_feat, relpos_feat):
        s = self.linear_tf_s(target_feat)
        zi, zj = self.linear_tf_z_i(target_feat), self.linear_tf_z_j(target_feat)
        z = residual_add(self.linear_relpos(relpos_feat), zi)   # outer sum zi[:, None] + zj[None, :] + relpos
        return s, _new(z.nbytes // 4, z, zj)


class RecyclingEmbedder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layer_norm_s = LayerNorm(C_S)
        self.layer_norm_z = LayerNorm(C_Z)
        self.linear_z = Linear(C_Z, C_Z, bias=False)
        self.linear_s = Linear(C_S, C_S, bias=False)

    def forward(self, s_init, z_init, s_prev, z_prev):
        z = residual_add(z_init, self.linear_z(self.layer_norm_z(z_prev)))
        s = residual_add(s_init, self.linear_s(self.layer_norm_s(s_prev)))
        return s, z


class DistogramHead(nn.Module):
    def __init__(self, no_bins=64):
        nn.Module.__init__(self)
        self.linear = Linear(C_Z, no_bins)

    def forward(self, z):
        return self.linear(z)


class StructureModule(nn.Module):
    """IPA structure module (8 shared layers), small next to the trunk at this size."""

    def __init__(self):
        nn.Module.__init__(self)
        self.linear_in = Linear(C_S, C_S)
        self.linear_b = Linear(C_Z, 12)
        self.ipa_linear_q = Linear(C_S, 12 * 16 * 3)
        self.ipa_linear_kv = Linear(C_S, 2 * 12 * 16 * 3)
        self.linear_out = Linear(C_S, 7)

    def forward(self, s, z, n_res):
        s = self.linear_in(s)
        b = self.linear_b(z)
        for _ in range(8):
            s = residual_add(s, self.ipa_linear_q(s))
        return self.linear_out(s)


class DockingModel(nn.Module):
    def __init__(self, num_recycles=3):
        nn.Module.__init__(self)
        self.num_recycles = num_recycles
        self.input_embedder = InputEmbedder()
        self.recycling_embedder = RecyclingEmbedder()
        self.pairformer = PairformerStack(NO_BLOCKS)
        self.distogram_head = DistogramHead()
        self.structure_module = StructureModule()

    def forward(self, batch):
        n_res = batch["n_res"]
        s_init, z_init = self.input_embedder(batch["target_feat"], batch["relpos_feat"])
        s_prev = torch.empty(n_res * C_S, dtype=torch.float32)      # zeros
        z_prev = torch.empty(n_res * n_res * C_Z, dtype=torch.float32)
        for cycle in range(self.num_recycles + 1):
            s, z = self.recycling_embedder(s_init, z_init, s_prev, z_prev)
            s, z = self.pairformer(s, z, n_res)
            s_prev, z_prev = s, z
        return {"distogram_logits": self.distogram_head(z), "frames": self.structure_module(s, z, n_res)}


def distogram_loss(outputs, batch):
    return F.cross_entropy(outputs["distogram_logits"], batch["distogram_bins"])


class SAbDabCrops(object):
    """Antibody-antigen complexes from SAbDab, spatially cropped to 256 residues around the interface."""

    def __init__(self, n):
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"n_res": CROP,
                   "target_feat": torch.empty(CROP * 22, dtype=torch.float32),
                   "relpos_feat": torch.empty(CROP * CROP * 67, dtype=torch.float32),
                   "distogram_bins": torch.empty(CROP * CROP, dtype=torch.int8)}


def train(model, optimizer, loader, epochs=1):
    model.train()
    for epoch in range(epochs):
        for step, batch in enumerate(loader):
            outputs = model(batch)
            loss = distogram_loss(outputs, batch)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()


def main():
    model = DockingModel(num_recycles=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    train(model, optimizer, SAbDabCrops(2400))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
