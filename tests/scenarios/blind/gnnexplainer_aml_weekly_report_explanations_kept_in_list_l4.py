"""explain_flags.py -- a bank's financial-crime analytics team scores its transfer graph every week with a
2-layer GraphSAGE (PyG 2.5, PyTorch 2.3; 600k accounts with 96 features each, 7.2M directed transfers,
~25k parameters) and, since the regulator asked for it, attaches a GNNExplainer explanation to every
account the model flags, for the compliance officers' PDF.  One NVIDIA L4 (24 GB, 22.5 GiB usable) in
the analytics VM:

    explainer = Explainer(model=model, algorithm=GNNExplainer(epochs=200), explanation_type="model",
                          node_mask_type="attributes", edge_mask_type="object",
                          model_config=dict(mode="multiclass_classification", task_level="node",
                                            return_type="log_probs"))
    reports = []
    for acct in flagged:                                   # 80 accounts flagged this week
        explanation = explainer(data.x, data.edge_index, index=acct)
        reports.append((acct, explanation))
    for acct, explanation in reports:                      # then the figures for the PDF
        explanation.visualize_feature_importance(f"out/{acct}_features.png", top_k=15)
        ...

Last quarter 9 accounts were flagged a week and it always ran.  This week's model update flags 80, and
the job dies with CUDA out of memory in the explainer's forward pass, at the 50th account (a 293 MiB
request; 21.2 GiB allocated, 12.3 GiB of it by the 49 explanations already made).

What holds the memory: GNNExplainer learns a mask the size of the whole input (node_mask_type=
"attributes": 600k x 96 floats, 230 MB) and one per edge (29 MB) over the full graph, and the Explanation
it returns carries them, plus the model's prediction and target for every node (4.8 MB each) -- 269 MB of
GPU tensors per account.  `reports` keeps every Explanation alive until the plotting loop, so each
account adds 269 MB; one explanation's own optimisation (200 forward/backward passes over all 7.2M
edges with explicit, masked messages: ~10 GiB at its peak) no longer fits after 49 of them.

An expert: the list of explanations on the GPU is the leak -- move each explanation off the GPU as soon
as it is made (explanation.cpu(), or keep only what the report needs: the top-k feature and edge
importances) and drop it; the explainer's own peak is fine.  Second: explain each account on its 2-hop
subgraph (k_hop_subgraph), which shrinks both the masks and the explainer's messages by orders of
magnitude.  Wrong advice: torch.inference_mode() / no_grad (GNNExplainer optimises its masks by
gradient descent: it cannot run without autograd, although the model is in eval mode), a smaller batch
(there is none), mixed precision, gradient checkpointing, quantization, empty_cache or
expandable_segments (the masks are live, referenced by the list), a bigger GPU (a busier week fails
again).
"""
import math
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

F32, I64 = 4, 8
NUM_NODES, NUM_FEATURES, NUM_EDGES, HIDDEN, CLASSES = 600_000, 96, 7_200_000, 128, 2
EPOCHS_SHOWN = 2          # GNNExplainer runs 200; every epoch allocates the same, two show the pattern


def _new(shape, *inputs, itemsize=F32):
    out = torch.empty(math.prod(shape) * itemsize, device="cuda")
    out.shape = tuple(shape)
    if torch.is_grad_enabled():                     # what autograd saves for backward
        out._saved = inputs
    return torch._derive(out, *inputs)


def _free_saved(root):
    """what autograd does after backward (retain_graph=False): the saved activations are released"""
    todo = [root]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved:
            t._saved = None
            todo.extend(s for s in saved if isinstance(s, torch.Tensor))


# ---- torch_geometric, as far as this job uses it ----
class Data(object):
    """torch_geometric.data.Data: attributes live in a storage mapping (data._store)"""

    def __init__(self, **kwargs):
        self.__dict__["_store"] = dict(kwargs)

    def __getattr__(self, key):
        try:
            return self.__dict__["_store"][key]
        except KeyError:
            raise AttributeError(key)

    def __setattr__(self, key, value):
        self.__dict__["_store"][key] = value


class Explanation(Data):
    pass


class SAGEConv(nn.Module):
    """mean aggregation; with masks set by an explainer, messages are built edge by edge and masked"""

    def __init__(self, c_in, c_out):
        nn.Module.__init__(self)
        self.c_in, self.c_out = c_in, c_out
        self.lin_l = nn.Parameter(torch.empty((c_in + 1) * c_out * F32, device="cuda"))
        self.lin_r = nn.Parameter(torch.empty(c_in * c_out * F32, device="cuda"))
        self._edge_mask = None

    def forward(self, x, edge_index):
        x_j = _new((NUM_EDGES, self.c_in), x, edge_index)                 # x.index_select(0, edge_index[0])
        if self._edge_mask is not None:
            x_j = _new(x_j.shape, x_j, self._edge_mask)                    # explain_message: * edge_mask.sigmoid()
        aggr = _new((NUM_NODES, self.c_in), x_j)                           # scatter mean
        out = _new((NUM_NODES, self.c_out), aggr, self.lin_l)
        return _new(out.shape, out, _new((NUM_NODES, self.c_out), x, self.lin_r))


class GraphSAGE(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv1 = SAGEConv(NUM_FEATURES, HIDDEN)
        self.conv2 = SAGEConv(HIDDEN, CLASSES)

    def forward(self, x, edge_index):
        h = _new((NUM_NODES, HIDDEN), self.conv1(x, edge_index))          # .relu()
        out = self.conv2(h, edge_index)
        return _new(out.shape, out)                                        # log_softmax


class Adam(torch.optim.AdamW):
    """torch.optim.Adam (the stand-in has AdamW, whose state is the same: two moments per parameter)"""


class GNNExplainer(object):
    def __init__(self, epochs=100, lr=0.01):
        self.epochs, self.lr = epochs, lr
        self.node_mask = self.edge_mask = self.hard_node_mask = self.hard_edge_mask = None

    def _initialize_masks(self, x, edge_index):
        self.node_mask = nn.Parameter(_new((NUM_NODES, NUM_FEATURES)))     # randn(N, F) * std
        self.node_mask.shape = (NUM_NODES, NUM_FEATURES)
        self.edge_mask = nn.Parameter(_new((NUM_EDGES,)))                  # randn(E) * std
        self.edge_mask.shape = (NUM_EDGES,)

    def _train(self, model, x, edge_index, target, index):
        self._initialize_masks(x, edge_index)
        for conv in (model.conv1, model.conv2):
            conv._edge_mask = self.edge_mask                                # set_masks(model, edge_mask, ...)
        optimizer = Adam([self.node_mask, self.edge_mask], lr=self.lr)
        for i in range(EPOCHS_SHOWN):
            optimizer.zero_grad()
            h = _new(x.shape, x, _new(self.node_mask.shape, self.node_mask))   # x * node_mask.sigmoid()
            y_hat = model(h, edge_index)
            loss = _new((1,), y_hat, self.node_mask, self.edge_mask)
            loss.backward()
            _free_saved(loss)
            optimizer.step()
            if i == 0:
                self.hard_node_mask = _new((NUM_NODES, NUM_FEATURES), itemsize=1)   # node_mask.grad != 0
                self.hard_edge_mask = _new((NUM_EDGES,), itemsize=1)
            del h, y_hat, loss
        for conv in (model.conv1, model.conv2):
            conv._edge_mask = None                                          # clear_masks(model)

    def __call__(self, model, x, edge_index, target, index):
        self._train(model, x, edge_index, target, index)
        with torch.no_grad():                                               # _post_process_mask: detach().sigmoid()
            node_mask = _new((NUM_NODES, NUM_FEATURES))
            edge_mask = _new((NUM_EDGES,))
        self.node_mask = self.edge_mask = self.hard_node_mask = self.hard_edge_mask = None   # _clean_model
        return Explanation(node_mask=node_mask, edge_mask=edge_mask)


class Explainer(object):
    def __init__(self, model, algorithm, **config):
        self.model, self.algorithm, self.config = model, algorithm, config

    def get_prediction(self, x, edge_index):
        self.model.eval()
        with torch.no_grad():
            return self.model(x, edge_index)

    def __call__(self, x, edge_index, index):
        prediction = self.get_prediction(x, edge_index)                     # N x 2 log-probs
        target = _new((NUM_NODES,), itemsize=I64)                           # prediction.argmax(-1)
        explanation = self.algorithm(self.model, x, edge_index, target=target, index=index)
        explanation.x, explanation.edge_index = x, edge_index
        explanation.prediction, explanation.target, explanation.index = prediction, target, index
        return explanation


# ---- the weekly job ----
x = _new((NUM_NODES, NUM_FEATURES))
edge_index = _new((2, NUM_EDGES), itemsize=I64)
data = Data(x=x, edge_index=edge_index)
del x, edge_index
model = GraphSAGE()                                                         # weights from last Sunday's training
model.eval()
flagged = [184_211 + 7_919 * i for i in range(80)]

explainer = Explainer(model=model, algorithm=GNNExplainer(epochs=200), explanation_type="model",
                      node_mask_type="attributes", edge_mask_type="object",
                      model_config=dict(mode="multiclass_classification", task_level="node",
                                        return_type="log_probs"))
reports = []
try:
    for n, acct in enumerate(flagged, 1):
        explanation = explainer(data.x, data.edge_index, index=acct)
        reports.append((acct, explanation))
        print("explained account %d (%d/%d), allocated %.2f GiB" % (acct, n, len(flagged),
                                                                 torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
for acct, explanation in reports:
    pass                                    # explanation.visualize_feature_importance(...), visualize_graph(...)
sys.exit(0)
