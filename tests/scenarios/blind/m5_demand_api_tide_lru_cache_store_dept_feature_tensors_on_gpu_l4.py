"""forecast_service.py -- a retailer's demand-planning API (FastAPI, one uvicorn worker on an NVIDIA L4, 24 GB)
serves 28-day forecasts from a global TiDE model (neuralforecast-style, hidden 512, 2 encoder / 2 decoder
layers, 364-day lookback: 23M parameters, 93 MB) trained on the M5 layout: 3,049 items x 10 stores = 30,490
series.  Planners ask for one store-department at a time (CA_3 / FOODS_3: 823 series).  Building a group's
features from the feature store (sales, prices, calendar and SNAP flags, lags, rolling and exponential means:
112 columns x 1,969 days per series) takes 4-6 s, so a developer memoized it:

    @functools.lru_cache(maxsize=None)
    def load_group(store_id: str, dept_id: str) -> torch.Tensor:
        frame = feature_store.get_frame(store_id, dept_id)             # [n_items * 1969, 112]
        return torch.tensor(frame.values, dtype=torch.float32, device="cuda")

    @app.post("/forecast")
    def forecast(req: ForecastRequest):
        feats = load_group(req.store_id, req.dept_id)
        with torch.inference_mode():
            y = model(feats[:, -LOOKBACK:, :], horizon=28)
        return {"forecast": y.cpu().tolist()}

Second requests for a group now return in 80 ms.  Every group that anybody has asked for stays on the GPU, as
a tensor of n_items x 1,969 x 112 float32 (882 KB per series: 726 MB for CA_3/FOODS_3), for the life of the
process.  On Monday morning, when the planners of all ten stores open their dashboards, the service dies on its
63rd distinct store-department (84th request): loading HOUSEHOLD_1 of CA_1 asks for 448 MiB with 316 MiB free;
the memo holds 62 groups, 21.5 GiB of the 22.5 GiB card; the model is 93 MB and a request's activations a few
tens of MB.

An expert: the memory is the memo, not the model or a request: lru_cache(maxsize=None) on a function that
returns GPU tensors keeps every group ever requested on the card, unbounded (all 70 groups are 25 GiB).
Bound it (maxsize=8 groups, or a size-aware LRU), or keep the cached frames in host memory (pinned) and move a
group to the GPU per request (0.7 GB at most, tens of ms over PCIe).
Wrong advice: a smaller batch (one request is one store-department; its forward pass needs tens of MB), torch.inference_mode (it
is on already), empty_cache / expandable_segments (nothing is cached by PyTorch or fragmented: every byte is a
live tensor held by the memo), restarting the service nightly (it fills again within a morning), mixed precision
or quantization of a 93 MB model, a bigger GPU (the memo grows with the catalogue, and next quarter's new
stores), killing other processes (there are none).
"""
import functools
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: torch.tensor (copies a host array to the device; a C function in
# PyTorch, compiled as part of torch's file so that the failing line stays the program's own), nn.Linear.
_TENSOR = """
def tensor(data, dtype=None, device=None):
    t = torch.empty(data.size, dtype=dtype, device=device)
    t.shape = data.shape
    return t
"""
if not hasattr(torch, "tensor"):
    _ns = {"torch": torch}
    exec(compile(_TENSOR, torch.__file__, "exec"), _ns)
    torch.tensor = _ns["tensor"]


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))

    def forward(self, x, rows):
        return torch.empty(rows * self.out_features, dtype=torch.float32, device="cuda")


torch.nn.Linear = Linear
nn = torch.nn


class _Values(object):
    """A pandas DataFrame's .values (float32 here: the feature store writes float32 columns)."""

    def __init__(self, rows, cols):
        self.shape = (rows, cols)
        self.size = rows * cols


class _Frame(object):
    def __init__(self, rows, cols):
        self.values = _Values(rows, cols)


class FeatureStore(object):
    def get_frame(self, store_id, dept_id):
        return _Frame(DEPT_ITEMS[dept_id] * N_DAYS, N_FEATURES)


feature_store = FeatureStore()
# ----

STORES = ["CA_1", "CA_2", "CA_3", "CA_4", "TX_1", "TX_2", "TX_3", "WI_1", "WI_2", "WI_3"]
DEPT_ITEMS = {"FOODS_1": 216, "FOODS_2": 398, "FOODS_3": 823, "HOBBIES_1": 416, "HOBBIES_2": 149,
              "HOUSEHOLD_1": 532, "HOUSEHOLD_2": 515}
N_DAYS = 1969
N_FEATURES = 112
LOOKBACK = 364
HORIZON = 28


class TiDE(nn.Module):
    """Time-series Dense Encoder: per-series flattened lookback and covariates -> residual MLP encoder/decoder."""

    def __init__(self, hidden=512):
        nn.Module.__init__(self)
        self.feature_projection = nn.Linear(N_FEATURES, 8)
        self.encoder0 = nn.Linear(LOOKBACK * 9 + (LOOKBACK + HORIZON) * 8, hidden)
        self.encoder1 = nn.Linear(hidden, hidden)
        self.decoder0 = nn.Linear(hidden, hidden)
        self.decoder1 = nn.Linear(hidden, HORIZON * 32)
        self.temporal_decoder = nn.Linear(32 + 8, 128)
        self.residual = nn.Linear(LOOKBACK, HORIZON)
        for i in range(18):    # the dense residual blocks' wider layers
            setattr(self, "block%d" % i, nn.Linear(hidden * 2, hidden * 2))

    def forward(self, feats, horizon):
        n = feats.shape[0] // N_DAYS
        projected = self.feature_projection(feats, n * (LOOKBACK + horizon))
        flat = torch.empty(n * (LOOKBACK * 9 + (LOOKBACK + horizon) * 8), dtype=torch.float32, device="cuda")
        h = self.encoder1(self.encoder0(flat, n), n)
        del projected, flat
        h = self.decoder1(self.decoder0(h, n), n)
        return self.temporal_decoder(h, n * horizon)


model = None


@functools.lru_cache(maxsize=None)
def load_group(store_id, dept_id):
    frame = feature_store.get_frame(store_id, dept_id)             # [n_items * 1969, 112]
    return torch.tensor(frame.values, dtype=torch.float32, device="cuda")


def forecast(store_id, dept_id):
    """POST /forecast {"store_id": ..., "dept_id": ...}"""
    feats = load_group(store_id, dept_id)
    with torch.inference_mode():
        y = model(feats, horizon=HORIZON)
    return y     # y.cpu().tolist()


def monday_morning_traffic():
    """The planners' dashboards, store by store, each opening its departments (repeats hit the memo)."""
    rng = random.Random(20251110)
    groups = [(s, d) for s in STORES for d in DEPT_ITEMS]
    rng.shuffle(groups)
    for i, g in enumerate(groups):
        yield g
        if i % 3 == 0:
            yield groups[rng.randrange(i + 1)]    # somebody refreshes a dashboard


def main():
    global model
    model = TiDE()
    # model.load_state_dict(torch.load("tide_m5.pt", map_location="cpu")); model.cuda().eval()
    model.eval()
    print("TiDE: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4e6))
    served = 0
    for store_id, dept_id in monday_morning_traffic():
        forecast(store_id, dept_id)
        served += 1
        info = load_group.cache_info()
        if info.currsize % 10 == 0 and info.misses == info.currsize:
            print("served %d requests, %d groups cached, %.1f GiB allocated" % (
                served, info.currsize, torch.cuda.memory_allocated() / 2.0 ** 30))
    print("all groups served")


try:
    main()
except torch.OutOfMemoryError:
    info = load_group.cache_info()
    print("OOM loading a new group: %d groups cached (%d hits, %d misses)" % (info.currsize, info.hits, info.misses))
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
