"""train_itransformer.py -- a transportation lab trains one iTransformer (variates as tokens: each sensor's
96-step history is one token; d_model 512, 8 heads, 3 layers, d_ff 2048: 9.6M parameters) on the LargeST
California traffic-flow data (8,600 PeMS loop detectors, 5-minute flow, 96 steps in, 96 out), on the lab's
RTX 3090 (24 GB).  A sensor only attends to sensors of its own Caltrans district, so a batch is 16 windows of
one district, the district drawn at random, and the number of tokens changes from batch to batch, from 201
sensors (D5) to 2,352 (D4, the Bay Area):

    sampler = DistrictBatchSampler(dataset, batch_size=16, shuffle=True, seed=46)   # one district per batch
    for x, y, district in DataLoader(dataset, batch_sampler=sampler):
        out = model(x.cuda())                      # [16, 96, n_sensors(district)]
        loss = F.mse_loss(out, y.cuda())
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The attention maps are 16 x 8 x N x N float32: 21 MB for D5, 2.64 GiB for D4, and every layer keeps the softmax,
its dropout mask and the dropped-out probabilities for backward (the model uses the repository's eager
FullAttention).  The first D4 batch (step 15) runs: its step peaks at 22.8 GiB allocated, on a card that leaves
23.5 GiB after the CUDA context.  Nineteen steps later, after batches of D7, D8, D11, D12 and the small districts
(whose tensors were cut out of D4's cached segments, and some of whose own segments went back to the driver),
the next D4 batch fails in the attention of a layer, asking for 2.64 GiB with 0.71 GiB free on the device while
PyTorch holds 2.69 GiB reserved but unallocated, in pieces (the largest 1.98 GiB) left between this batch's own
live tensors.

An expert: the batch fits (it ran at step 15); the free memory is split between the device and holes in the
cache, none large enough: fragmentation from batches whose shapes change every step.  First
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow in place and freed pages can be given back, so
the holes and the free device memory add up), or max_split_size_mb to keep big blocks from being cut for small
tensors.  At 97% of the card even then, the next things to do are SDPA instead of the eager attention maps (most
of the memory) or a batch of 12 for D4, and a schedule that runs the largest district first.
Wrong advice: an 8-bit optimizer, LoRA or quantization (weights, gradients and AdamW state are 150 MB),
inference_mode (it trains), looking for other processes or restarting (there are none; a fresh process gets to
the same state), a bigger GPU as the fix for a batch that already ran on this one.
"""
import random
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API.  The stand-in torch computes nothing and its autograd engine only
# makes parameter gradients; here each op makes the tensors PyTorch's would (sizes in bytes), records what it saves
# for backward on a graph node, and torch.autograd.backward walks the nodes in reverse as PyTorch's engine does:
# each node's input gradients are made, then the tensors it saved are freed.  The ops are C functions in PyTorch
# (no Python frame of their own): compiled as part of torch's file so that the failing line stays the program's.
_OPS = """
class Node(object):
    def __init__(self, saved, grads, params=()):
        self.saved = list(saved)         # tensors kept for backward
        self.grads = list(grads)         # bytes of the input gradients backward makes, in order
        self.params = list(params)       # parameters whose .grad this node fills

def _record(out, saved, grads, params=()):
    if torch.is_grad_enabled():
        g = _tape()
        g.append(Node(saved, grads, params))
    return out

def linear(x, weight, bias, in_features, out_features):
    out = torch.empty(x.nbytes // 4 // in_features * out_features, dtype=torch.float32, device=x.device)
    return torch._derive(_record(out, [x], [x.nbytes], [weight, bias]), x)

def layer_norm(x, weight, bias):
    out = torch.empty(x.nbytes // 4, dtype=torch.float32, device=x.device)
    return torch._derive(_record(out, [x], [x.nbytes], [weight, bias]), x)

def attention_scores(q, k, n_elems):
    out = torch.empty(n_elems, dtype=torch.float32, device=q.device)
    return torch._derive(_record(out, [q, k], [q.nbytes, k.nbytes]), q, k)

def softmax(x, dim=-1):
    out = torch.empty(x.nbytes // 4, dtype=torch.float32, device=x.device)
    return torch._derive(_record(out, [out], [x.nbytes]), x)

def dropout(x, p=0.1, training=True):
    mask = torch.empty(x.nbytes // 4, dtype=torch.uint8, device=x.device)
    out = torch.empty(x.nbytes // 4, dtype=torch.float32, device=x.device)
    return torch._derive(_record(out, [mask], [x.nbytes]), x)

def attention_values(a, v, out_elems):
    out = torch.empty(out_elems, dtype=torch.float32, device=a.device)
    return torch._derive(_record(out, [a, v], [a.nbytes, v.nbytes]), a, v)

def mse_loss(input, target):
    out = torch.empty(1, dtype=torch.float32, device=input.device)
    return torch._derive(_record(out, [input], [input.nbytes]), input)

def backward(loss):
    tape = _tape()
    torch.autograd.backward(loss)          # the stand-in engine: checks the graph (no memory: see below)
    while tape:
        node = tape.pop()
        made = [torch.empty(n // 4, dtype=torch.float32, device=loss.device) for n in node.grads]
        for p in node.params:
            if p.grad is None:
                p.grad = torch.empty(p.nbytes // 4, dtype=torch.float32, device=p.device)
        node.saved = None
        del made
"""
_ns = {"torch": torch}
exec(compile(_OPS, torch.__file__, "exec"), _ns)
_TAPE = []
_ns["_tape"] = lambda: _TAPE
torch.softmax = _ns["softmax"]
F.dropout, F.mse_loss, F.linear, F.layer_norm = _ns["dropout"], _ns["mse_loss"], _ns["linear"], _ns["layer_norm"]
_attention_scores, _attention_values = _ns["attention_scores"], _ns["attention_values"]


def _engine_check_only(params, box, done):
    """The stand-in engine would make every parameter's .grad at once, before any saved tensor is freed;
    PyTorch makes each one when backward reaches its node (backward above).  Its graph check stays."""
    done.release()


torch.autograd._engine.run = _engine_check_only


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features * in_features, dtype=torch.float32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias, self.in_features, self.out_features)


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(d, dtype=torch.float32, device="cuda"))

    def forward(self, x):
        return F.layer_norm(x, self.weight, self.bias)


torch.nn.Linear, torch.nn.LayerNorm = Linear, LayerNorm
nn = torch.nn
backward = _ns["backward"]
# ----

SEQ_LEN = 96
PRED_LEN = 96
D_MODEL = 512
N_HEADS = 8
E_LAYERS = 3
D_FF = 2048
BATCH_SIZE = 16
# sensors per Caltrans district in the lab's LargeST split (8,600 in all; D4 = GBA, D11 = SD)
DISTRICT_SENSORS = {"D3": 661, "D4": 2352, "D5": 201, "D6": 372, "D7": 2011, "D8": 777, "D10": 464,
                    "D11": 716, "D12": 1046}
STEPS_PER_EPOCH = 400


class AttentionLayer(nn.Module):
    def __init__(self, d_model, n_heads):
        nn.Module.__init__(self)
        self.n_heads = n_heads
        self.query_projection = nn.Linear(d_model, d_model)
        self.key_projection = nn.Linear(d_model, d_model)
        self.value_projection = nn.Linear(d_model, d_model)
        self.out_projection = nn.Linear(d_model, d_model)

    def forward(self, x, B, N):
        queries = self.query_projection(x)
        keys = self.key_projection(x)
        values = self.value_projection(x)
        # FullAttention: scores = torch.einsum("blhe,bshe->bhls", queries, keys); A = dropout(softmax(scale*scores))
        scores = _attention_scores(queries, keys, B * self.n_heads * N * N)
        A = F.dropout(torch.softmax(scores, dim=-1), p=0.1)
        del scores
        V = _attention_values(A, values, B * N * D_MODEL)     # torch.einsum("bhls,bshd->blhd", A, values)
        return self.out_projection(V)


class EncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = AttentionLayer(D_MODEL, N_HEADS)
        self.conv1 = nn.Linear(D_MODEL, D_FF)
        self.conv2 = nn.Linear(D_FF, D_MODEL)
        self.norm1 = nn.LayerNorm(D_MODEL)
        self.norm2 = nn.LayerNorm(D_MODEL)

    def forward(self, x, B, N):
        new_x = self.attention(x, B, N)
        x = self.norm1(new_x)
        y = self.conv2(F.dropout(self.conv1(x)))
        return self.norm2(y)


class ITransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.enc_embedding = nn.Linear(SEQ_LEN, D_MODEL)         # DataEmbedding_inverted
        self.layers = []
        for i in range(E_LAYERS):
            layer = EncoderLayer()
            setattr(self, "encoder_layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = nn.LayerNorm(D_MODEL)
        self.projector = nn.Linear(D_MODEL, PRED_LEN)

    def forward(self, x_enc, B, N):
        enc_out = self.enc_embedding(x_enc)                     # [B, N, d_model]: variates as tokens
        for layer in self.layers:
            enc_out = layer(enc_out, B, N)
        return self.projector(self.norm(enc_out))


class DistrictBatchSampler(object):
    """Batches of BATCH_SIZE windows of one district, the district drawn at random."""

    def __init__(self, seed):
        self.rng = random.Random(seed)

    def __iter__(self):
        names = sorted(DISTRICT_SENSORS)
        for _ in range(STEPS_PER_EPOCH):
            yield self.rng.choice(names)


def main():
    model = ITransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    print("iTransformer: %.1fM parameters" % (sum(p.nbytes for p in model.parameters()) / 4e6))
    model.train()
    epoch = 0
    for step, district in enumerate(DistrictBatchSampler(seed=46)):
        N = DISTRICT_SENSORS[district]
        x = torch.empty(BATCH_SIZE * SEQ_LEN * N, dtype=torch.float32, device="cuda")
        y = torch.empty(BATCH_SIZE * PRED_LEN * N, dtype=torch.float32, device="cuda")
        _where[0] = (step, district, N)
        out = model(x, BATCH_SIZE, N)
        loss = F.mse_loss(out, y)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del x, y, out, loss
        if step % 5 == 0 or district == "D4":
            print("epoch %d step %d %s (%d sensors): reserved %.1f GiB" % (
                epoch, step, district, N, torch.cuda.memory_reserved() / 2.0 ** 30))


_where = [None]
try:
    main()
except torch.OutOfMemoryError:
    step, district, N = _where[0]
    print("OOM at step %d, %s (%d sensors)" % (step, district, N))
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
