"""A credit-risk analyst tries the tabular foundation model TabPFN v2 on the whole loan book: 100,000
training rows and 20,000 rows to score, 300 numeric features, on the team's L4 (24 GB, 22.5 GiB usable).

The real code (tabpfn 2.x):

    from tabpfn import TabPFNClassifier
    clf = TabPFNClassifier(device="cuda", n_estimators=4,
                           ignore_pretraining_limits=True,   # "Number of samples 100000 > 10000" error otherwise
                           memory_saving_mode=False,         # copied from a "make it faster" tip
                           inference_precision="autocast")
    clf.fit(X_train, y_train)                  # 100_000 x 300: preprocessing and the 28 MB checkpoint only
    proba = clf.predict_proba(X_test)          # 20_000 x 300  -> torch.cuda.OutOfMemoryError

TabPFN learns nothing at fit(): predict runs one forward pass of its 12-layer per-feature transformer over
the training rows AND the test rows together (in-context learning: the test rows attend to the training
rows).  Every cell of the table becomes a 192-wide token: features are grouped in pairs (150 groups) plus
one target column, so the residual stream of one ensemble member is

    rows x groups x emsize x fp16 = 120,000 x 151 x 192 x 2 B = 6.96 GB (6.48 GiB)

Each attention of a layer first projects that stream to q, k, v at once (an einsum with w_qkv), a tensor
three times its size: 19.44 GiB.  The first layer's attention between features asks for it while the card
holds the CUDA context (0.5 GiB), the input (120,000 x 300 fp32, 0.13 GiB), the 7M weights and the stream
(6.48 GiB): about 15.3 GiB is free, the 19.44 GiB request fails before layer 0 has done anything.
Nothing is trained (inference_mode, autocast fp16 already on); nothing leaks; nothing else is on the card.

What an expert says: the in-context "sequence" is the number of rows.  TabPFN v2 was pretrained on at
most 10,000 samples (the error the user silenced says so): subsample the training rows to ~10k (or use
the subsample/ensemble extension), and turn memory_saving_mode back on so the test rows and the
projections are computed in chunks (10,000 + 2,000 rows: 0.65 GiB stream, 1.9 GiB qkv).  Wrong advice:
gradient checkpointing, 8-bit optimizers, LoRA, ZeRO (there is no training), inference_mode or mixed
precision (both already in force), flash-attention (the items attention already runs through SDPA;
what does not fit is the linear qkv projection of every cell), quantizing the 28 MB of weights,
expandable_segments/empty_cache (no cache to speak of: a 19.4 GiB request against 15.3 GiB free).
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402

EMSIZE = 192
NLAYERS = 12
NHEAD = 6
FEATURES_PER_GROUP = 2
MLP_HIDDEN = 4 * EMSIZE


def _op_output(n_elems, dtype):
    """The tensor an operation of the forward pass writes (the stand-in computes nothing)."""
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"),
                                   requires_grad=False)


class ModuleList(nn.Module):
    def __init__(self, modules):
        super().__init__()
        for i, m in enumerate(modules):
            setattr(self, str(i), m)
        object.__setattr__(self, "_list", list(modules))

    def __iter__(self):
        return iter(self._list)


class MultiHeadAttention(nn.Module):
    """tabpfn/model/multi_head_attention.py: one w_qkv, q/k/v computed together, then SDPA."""

    def __init__(self, emsize, nhead):
        super().__init__()
        self.w_qkv = nn.Parameter(torch.empty(3 * emsize * emsize, dtype=torch.float32, device="cuda"),
                                  requires_grad=False)
        self.w_out = nn.Parameter(torch.empty(emsize * emsize, dtype=torch.float32, device="cuda"),
                                  requires_grad=False)

    def compute_qkv(self, x, cells):
        # qkv = torch.einsum("... s, j h d s -> ... j h d", x, self._w_qkv)
        return _op_output(3 * cells * EMSIZE, torch.float16)

    def forward(self, x, cells):
        qkv = self.compute_qkv(x, cells)
        attn = _op_output(cells * EMSIZE, torch.float16)      # F.scaled_dot_product_attention(q, k, v)
        del qkv
        return _op_output(cells * EMSIZE, torch.float16)      # out projection


class MLP(nn.Module):
    def __init__(self, emsize, hidden):
        super().__init__()
        self.linear1 = Linear(emsize, hidden)
        self.linear2 = Linear(hidden, emsize)

    def forward(self, x, cells):
        h = _op_output(cells * MLP_HIDDEN, torch.float16)
        return _op_output(cells * EMSIZE, torch.float16)


class PerFeatureEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn_between_features = MultiHeadAttention(EMSIZE, NHEAD)
        self.self_attn_between_items = MultiHeadAttention(EMSIZE, NHEAD)
        self.mlp = MLP(EMSIZE, MLP_HIDDEN)

    def forward(self, state, cells):
        state = self.self_attn_between_features(state, cells)   # residual added in place
        state = self.self_attn_between_items(state, cells)      # test rows attend to the train rows
        state = self.mlp(state, cells)
        return state


class PerFeatureTransformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = Linear(FEATURES_PER_GROUP, EMSIZE)
        self.y_encoder = Linear(1, EMSIZE)
        self.transformer_encoder = ModuleList([PerFeatureEncoderLayer() for _ in range(NLAYERS)])
        self.decoder_dict = Linear(EMSIZE, 10)

    def forward(self, x, y, n_rows, n_features, single_eval_pos):
        groups = (n_features + FEATURES_PER_GROUP - 1) // FEATURES_PER_GROUP + 1   # + the target column
        cells = n_rows * groups
        emb_x = _op_output(n_rows * (groups - 1) * EMSIZE, torch.float16)
        emb_y = _op_output(n_rows * EMSIZE, torch.float16)
        state = _op_output(cells * EMSIZE, torch.float16)       # torch.cat((emb_x, emb_y), dim=-2)
        del emb_x, emb_y
        for layer in self.transformer_encoder:
            state = layer(state, cells)
        return _op_output((n_rows - single_eval_pos) * 10, torch.float32)


class TabPFNClassifier(object):
    def __init__(self, device="cuda", n_estimators=4, ignore_pretraining_limits=False, memory_saving_mode="auto",
                 inference_precision="auto"):
        self.device = device
        self.n_estimators = n_estimators
        self.ignore_pretraining_limits = ignore_pretraining_limits
        self.memory_saving_mode = memory_saving_mode
        self.model_ = None

    def fit(self, X_shape, y_shape):
        n, f = X_shape
        if n > 10000 and not self.ignore_pretraining_limits:
            raise ValueError("Number of samples %d in the input data is greater than the maximum number of "
                             "samples 10000 officially supported by TabPFN." % n)
        self.model_ = PerFeatureTransformer().eval()           # tabpfn-v2-classifier.ckpt, 7M parameters
        self.n_train_, self.n_features_ = n, f
        return self

    def predict_proba(self, X_test_shape):
        n_test, f = X_test_shape
        n_rows = self.n_train_ + n_test
        probas = []
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            for estimator in range(self.n_estimators):
                X_full = torch.empty(n_rows * f, dtype=torch.float32, device="cuda")   # train rows then test rows
                y_train = torch.empty(self.n_train_, dtype=torch.float32, device="cuda")
                out = self.model_(X_full, y_train, n_rows, f, single_eval_pos=self.n_train_)
                probas.append(out)
                del X_full, y_train
        return probas


def main():
    n_train, n_test, n_features = 100_000, 20_000, 300     # loan book: 100k labelled loans, 20k applications
    clf = TabPFNClassifier(device="cuda", n_estimators=4, ignore_pretraining_limits=True,
                           memory_saving_mode=False, inference_precision="autocast")
    clf.fit((n_train, n_features), (n_train,))
    proba = clf.predict_proba((n_test, n_features))
    print("scored", n_test, "applications", len(proba))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
