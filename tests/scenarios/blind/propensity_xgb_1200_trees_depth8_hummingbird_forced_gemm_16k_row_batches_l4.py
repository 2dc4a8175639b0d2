"""Nightly propensity scoring: an XGBoost model converted to PyTorch with Hummingbird, GEMM strategy forced,
scored on 16,384-row record batches of the feature-store export, on one NVIDIA L4 (22.03 GiB as PyTorch sees it).

The real job (score_nightly.py, run by Airflow on a GCP g2-standard-16, one L4):

    import pyarrow.parquet as pq, xgboost as xgb
    from hummingbird.ml import convert

    clf = xgb.XGBClassifier(); clf.load_model("models/propensity_v7.json")
    hb_model = convert(clf, "torch", device="cuda", extra_config={"tree_implementation": "gemm"})
    for path in export_files:                       # 96 parquet files, ~500k customers each, 380 float features
        pf = pq.ParquetFile(path)
        for rb in pf.iter_batches(batch_size=16384, columns=FEATURES):
            proba = hb_model.predict_proba(rb.to_pandas().to_numpy(np.float32))[:, 1]
            writer.write_batch(...)

"tree_implementation": "gemm" was pinned a year ago, when the model had 400 trees of depth 6, because the
Hummingbird paper and a benchmark notebook said GEMM is the fastest strategy on a GPU. Hummingbird's GEMM
strategy turns every tree into three dense matrices padded to the largest tree (internal nodes I, leaves L) and
its forward is

    x = x.t()
    x = torch.mm(self.weight_1, x) < self.bias_1          # (trees*I, rows) float32, then a bool of it
    x = x.view(self.n_trees, self.hidden_one_size, -1)
    x = x.float()                                          # (trees, I, rows) float32 again
    x = torch.matmul(self.weight_2, x)                     # (trees, L, rows) float32
    x = x.view(self.n_trees * self.hidden_two_size, -1) == self.bias_2
    ...

so the memory of one batch is trees x 2^depth x rows, and it is all temporaries of one forward under
torch.no_grad() (Hummingbird's executor runs it there).  Last week the data-science team shipped
propensity_v8: 1200 trees, max_depth 8 (some trees are full: I = 255, L = 256).  Nothing else changed; the
first record batch of the first file now fails.

Sizes (rows = 16,384, 380 features):
  weights on the GPU: weight_1 1200*255 x 380 fp32 = 465 MB, weight_2 1200 x 256 x 255 = 313 MB, biases and
    weight_3 ~4 MB: 0.73 GiB in all (+ 0.5 GiB CUDA context); the input batch 16,384 x 380 x 4 = 25 MB
  torch.mm(weight_1, x): 1200*255 x 16,384 x 4 B = 18.68 GiB -> fits (19.9 GiB in use, 2.1 GiB free)
  "< self.bias_1": a bool tensor of the same shape, 4.67 GiB, while the 18.68 GiB product is still alive
    -> torch.cuda.OutOfMemoryError: Tried to allocate 4.67 GiB, 2.1 GiB free.  (Case 1 of the article.)
  Had it gone on: x.float() 18.68 GiB + matmul(weight_2, x) 18.75 GiB live together: ~39 GiB for the pass, so
  the 2.6 GiB shortfall at the failing line is a small part of what the batch needs.

What an expert says first: the batch does not fit because GEMM scoring costs trees x 2^depth floats per row
(2.3 MB/row here, 12x the old model's).  Score in chunks of 2-4k rows (4,096 rows peak at ~10.6 GiB), or drop
the pinned "gemm" and let Hummingbird pick perf_tree_trav for depth-8 trees (its own heuristic: GEMM only up to
depth 3), which needs trees x a few int64 per row (~0.5 GB for 16,384 rows) and is about as fast.
Wrong advice: empty_cache / expandable_segments (nothing is cached, one fresh pass), inference_mode (already
under no_grad: there is no graph), fp16 autocast (halves a little but the one-hot feature selection and the
threshold compares in fp16 change the split decisions -- balances above 65,504 become inf -- so the scores are
wrong, and it still would not fit), quantization / CPU offload (the weights are 0.73 GiB), anything for
training (checkpointing, ZeRO, 8-bit optimizers).
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_PATH = "models/propensity_v8.json"
EXPORT_DIR = "/mnt/feature-export/customer_daily/dt=2025-06-02"
N_FEATURES = 380
HB_EXTRA_CONFIG = {"tree_implementation": "gemm"}   # pinned in 2024 for the 400-tree depth-6 model


# ---------------------------------------------------------------------------------------------------------
# What hummingbird.ml.convert(clf, "torch", device="cuda", extra_config=...) builds, reduced to its tensors
# (hummingbird/ml/operator_converters/_tree_implementations.py, _executor.py, containers/sklearn).
# ---------------------------------------------------------------------------------------------------------
class GEMMGBDTImpl(nn.Module):
    """GEMM strategy for a binary GBDT: every tree as dense matrices padded to the largest tree."""

    def __init__(self, n_trees, hidden_one_size, hidden_two_size, n_features, device):
        super().__init__()
        self.n_trees = n_trees
        self.hidden_one_size = hidden_one_size          # internal nodes of the largest tree
        self.hidden_two_size = hidden_two_size          # leaves of the largest tree
        self.hidden_three_size = 1                      # one output per tree (binary GBDT)
        self.n_features = n_features
        f32 = torch.float32
        self.weight_1 = nn.Parameter(torch.empty(n_trees * hidden_one_size * n_features, dtype=f32, device=device),
                                     requires_grad=False)
        self.bias_1 = nn.Parameter(torch.empty(n_trees * hidden_one_size, dtype=f32, device=device),
                                   requires_grad=False)
        self.weight_2 = nn.Parameter(torch.empty(n_trees * hidden_two_size * hidden_one_size, dtype=f32,
                                                 device=device), requires_grad=False)
        self.bias_2 = nn.Parameter(torch.empty(n_trees * hidden_two_size, dtype=f32, device=device),
                                   requires_grad=False)
        self.weight_3 = nn.Parameter(torch.empty(n_trees * hidden_two_size, dtype=f32, device=device),
                                     requires_grad=False)
        self.base_prediction = nn.Parameter(torch.empty(1, dtype=f32, device=device), requires_grad=False)

    def forward(self, x):
        rows = x.nbytes // (4 * self.n_features)                    # x.shape[0]
        x = x.view(self.n_features, rows)                           # x.t()
        # x = torch.mm(self.weight_1, x) < self.bias_1: the product, then a bool of its shape while it lives
        prod = torch.empty(self.n_trees * self.hidden_one_size * rows, dtype=torch.float32)
        x = torch.empty(self.n_trees * self.hidden_one_size * rows, dtype=torch.uint8)   # torch.bool
        del prod
        x = x.view(self.n_trees, self.hidden_one_size, -1)
        x = torch.empty(self.n_trees * self.hidden_one_size * rows, dtype=torch.float32)  # x.float()
        x = torch.empty(self.n_trees * self.hidden_two_size * rows, dtype=torch.float32)  # torch.matmul(self.weight_2, x)
        x = torch.empty(self.n_trees * self.hidden_two_size * rows, dtype=torch.uint8)    # x.view(...) == self.bias_2
        x = torch.empty(self.n_trees * self.hidden_two_size * rows, dtype=torch.float32)  # x.float()
        x = torch.empty(self.n_trees * rows, dtype=torch.float32)                         # torch.matmul(self.weight_3, x)
        x = torch.empty(rows, dtype=torch.float32)                  # self.aggregation(x) + self.base_prediction
        proba = torch.empty(2 * rows, dtype=torch.float32)          # calibration: cat([1 - sigmoid, sigmoid])
        label = torch.empty(rows, dtype=torch.float32)              # torch.argmax(proba, dim=1)
        return label, proba


class Executor(nn.Module):
    """hummingbird.ml._executor.Executor: moves the inputs to the model's device and runs the operators,
    under torch.no_grad()."""

    def __init__(self, operator, device):
        super().__init__()
        self.tree_op = operator
        self.device = device

    def forward(self, *inputs):
        with torch.no_grad():
            tensors = []
            for batch in inputs:
                # torch.from_numpy(batch).to(self.device): rows x features float32
                tensors.append(torch.empty(batch.num_rows * batch.num_columns, dtype=torch.float32))
            return self.tree_op(*tensors)


class PyTorchSklearnContainerClassification(object):
    """hummingbird's container: predict_proba(X) -> self.model.forward(X)[1].cpu().numpy()."""

    def __init__(self, model, extra_config):
        self.model = model
        self._extra_config = dict(extra_config)

    def predict_proba(self, X):
        label, proba = self.model.forward(X)
        return HostArray(proba.nbytes)                  # .cpu().numpy(): the GPU tensors go with this frame


def convert(booster, backend, device="cpu", extra_config=None):
    """hummingbird.ml.convert for an XGBClassifier: the GEMM strategy when extra_config says so (its own
    heuristic picks gemm for max_depth <= 3, perf_tree_trav up to 10)."""
    assert backend == "torch" and extra_config.get("tree_implementation") == "gemm"
    op = GEMMGBDTImpl(booster.n_trees, booster.max_internal_nodes, booster.max_leaves, booster.n_features, device)
    return PyTorchSklearnContainerClassification(Executor(op, device), extra_config)


# ---------------------------------------------------------------------------------------------------------
# Host-side stand-ins for what xgboost and pyarrow hand the job (no GPU memory).
# ---------------------------------------------------------------------------------------------------------
class XGBBooster(object):
    """xgb.XGBClassifier().load_model(MODEL_PATH): propensity_v8, 1200 trees, max_depth 8."""

    def __init__(self, path):
        self.path = path
        self.n_trees = 1200
        self.max_depth = 8
        self.max_internal_nodes = 2 ** self.max_depth - 1        # 255: some trees grew full
        self.max_leaves = 2 ** self.max_depth                    # 256
        self.n_features = N_FEATURES


class RecordBatch(object):
    """pyarrow.RecordBatch of the export, converted to a float32 numpy array (host memory)."""

    def __init__(self, num_rows, num_columns):
        self.num_rows = num_rows
        self.num_columns = num_columns


class HostArray(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes


class ParquetFile(object):
    """pq.ParquetFile(path): iter_batches yields record batches of batch_size rows."""

    def __init__(self, path, num_rows):
        self.path = path
        self.num_rows = num_rows

    def iter_batches(self, batch_size, columns):
        done = 0
        while done < self.num_rows:
            n = min(batch_size, self.num_rows - done)
            done += n
            yield RecordBatch(n, len(columns))


class ScoreWriter(object):
    def __init__(self, path):
        self.path = path
        self.rows = 0

    def write_batch(self, ids, scores):
        self.rows += ids


FEATURES = ["f_%03d" % i for i in range(N_FEATURES)]


def export_files():
    return ["%s/part-%05d.parquet" % (EXPORT_DIR, i) for i in range(96)]


def load_scorer():
    clf = XGBBooster(MODEL_PATH)
    hb_model = convert(clf, "torch", device="cuda", extra_config=HB_EXTRA_CONFIG)
    return hb_model


def score_export(hb_model, writer):
    batch_size = 16384                          # rows per record batch; sized for propensity_v7
    for path in export_files():
        pf = ParquetFile(path, num_rows=500000)
        for rb in pf.iter_batches(batch_size=batch_size, columns=FEATURES):
            proba = hb_model.predict_proba(rb)
            writer.write_batch(rb.num_rows, proba)


def main():
    hb_model = load_scorer()
    writer = ScoreWriter("/mnt/scores/propensity/dt=2025-06-02/scores.parquet")
    score_export(hb_model, writer)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
