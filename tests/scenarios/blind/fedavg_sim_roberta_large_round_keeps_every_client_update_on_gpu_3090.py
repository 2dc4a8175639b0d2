"""fedavg_sim.py -- a federated-learning paper's simulation on a lab workstation's RTX 3090 (24 GB): 100
clients hold non-IID shards of AG News (Dirichlet alpha=0.5); each round the server samples 20 clients, each
fine-tunes a copy of the global roberta-large (355M parameters, fp32: 1.32 GiB) for one local epoch with AdamW
(batch 16 x 256 tokens), and the server aggregates the clients' updates, FedOpt-style (the update is the
client's weights minus the global ones; a server optimizer applies their weighted mean):

    for cid in selected:
        local = copy.deepcopy(global_model)
        opt = torch.optim.AdamW(local.parameters(), lr=2e-5)
        train_one_epoch(local, opt, client_loader(cid))
        with torch.no_grad():
            local_state = local.state_dict()
            update = {k: local_state[k] - global_state[k] for k in global_state}
        client_updates.append((n_samples[cid], update))
        del local, opt
        gc.collect(); torch.cuda.empty_cache()
    server_step(global_model, client_updates)

One client's training fits easily (global 1.3 + local 1.3 + grads 1.3 + AdamW 2.6 + 10.9 GiB of activations =
17.5 GiB), and the del / empty_cache at the end really frees the local model and optimizer.  But each client's
update is a full model-sized set of tensors on the GPU (1.32 GiB) kept in client_updates until the round ends:
the round needs 20 of them (26 GiB) on a 24 GB card.  Round 1 never finishes: with the updates of four clients
held (5.3 GiB), the 5th client's first backward pass fails making a 16 MiB gradient; 1.7 GiB more are cached
by the allocator in pieces between the updates.

An expert: the memory is the list of client updates, not the training of one client: aggregate as each client
finishes (a running weighted sum, `agg[k].add_(update[k], alpha=n_k / n_total)`, one model-sized buffer for
the round), or move each update to the CPU as it is made (`.cpu()`; the server step can run there or bring
them back one at a time).  Wrong first advice: a smaller batch, mixed precision or gradient checkpointing
(they shrink one client's activations and let the round reach client 9 to 13 before the same failure), an
8-bit optimizer or LoRA (changes the method and still keeps 20 updates), empty_cache (called already; the
updates are live) or expandable_segments (the 1.7 GiB of pieces are one more client), a bigger GPU (a round
of 40 clients fails again).
"""
import collections
import copy
import gc
import math
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30

# --- what the stand-in torch lacks: shapes and a - b (a new tensor) ---------------------------------------------


def new_tensor(shape, dtype=torch.float32):
    t = torch.empty(math.prod(shape), dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


torch.Tensor.__sub__ = lambda self, other: torch._derive(torch.empty_like(self), self, other)

# --- a slim transformers.RobertaForSequenceClassification (roberta-large) ------------------------------------
HIDDEN, HEADS, FFN, LAYERS, VOCAB = 1024, 16, 4096, 24, 50265


class RobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty((4 * HIDDEN * HIDDEN + 4 * HIDDEN) * 4, device="cuda"))
        self.intermediate = torch.nn.Parameter(torch.empty((HIDDEN * FFN + FFN) * 4, device="cuda"))
        self.output = torch.nn.Parameter(torch.empty((FFN * HIDDEN + 3 * HIDDEN) * 4, device="cuda"))

    def forward(self, hidden_states, B, L):
        made = [new_tensor((B, L, HIDDEN)) for _ in range(4)]                # query, key, value, context
        made += [new_tensor((B, HEADS, L, L)) for _ in range(3)]             # scores, softmax, dropout
        made.append(new_tensor((B, HEADS, L, L), torch.uint8))               # dropout mask
        made += [new_tensor((B, L, HIDDEN)) for _ in range(2)]               # attention output, LayerNorm
        made += [new_tensor((B, L, FFN)) for _ in range(2)]                  # intermediate, GELU
        made += [new_tensor((B, L, HIDDEN)) for _ in range(2)]               # output, LayerNorm
        prev = hidden_states
        for t in made:                      # each op saves its input for backward: the layer's chain
            t._saved = prev
            prev = t
        return prev


class SequenceClassifierOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class RobertaForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty((VOCAB + 514 + 1) * HIDDEN * 4, device="cuda"))
        self.layers = [RobertaLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = torch.nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN * num_labels) * 4,
                                                         device="cuda"))

    @classmethod
    def from_pretrained(cls, name, num_labels=2):
        return cls(num_labels)

    def state_dict(self):
        """As PyTorch's: every parameter under its full name, detached (sharing its storage)."""
        out = collections.OrderedDict()
        out["roberta.embeddings.weight"] = self.embeddings.detach()
        for i, layer in enumerate(self.layers):
            for name, p in layer._parameters.items():
                out["roberta.encoder.layer.%d.%s.weight" % (i, name)] = p.detach()
        out["classifier.weight"] = self.classifier.detach()
        return out

    def forward(self, input_ids=None, attention_mask=None, labels=None):
        B, L = input_ids
        hidden = new_tensor((B, L, HIDDEN))
        for layer in self.layers:
            hidden = layer(hidden, B, L)
        logits = new_tensor((B, 4))
        logits._saved = hidden
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return SequenceClassifierOutput(loss, logits)


# --- the simulation ------------------------------------------------------------------------------------------
NUM_CLIENTS, CLIENTS_PER_ROUND, ROUNDS, BATCH, MAX_LEN = 100, 20, 50, 16, 256
rng = random.Random(0)
# 30,000 AG News training examples split over 100 clients, Dirichlet(0.5) over the 4 labels: sizes only
n_samples = [max(64, int(rng.expovariate(1 / 300.0))) for _ in range(NUM_CLIENTS)]


def client_loader(cid):
    for _ in range(math.ceil(n_samples[cid] / BATCH)):
        yield {"input_ids": (BATCH, MAX_LEN), "attention_mask": (BATCH, MAX_LEN), "labels": None}


def train_one_epoch(model, opt, loader):
    model.train()
    for batch in loader:
        out = model(**batch)
        scen_truth.backward(out.loss)
        opt.step()
        opt.zero_grad(set_to_none=True)


def server_step(global_model, client_updates, server_lr=1.0):
    total = sum(n for n, _ in client_updates)
    with torch.no_grad():
        for k, p in global_model.state_dict().items():
            pass        # p.add_(sum(n / total * u[k] for n, u in client_updates), alpha=server_lr)


global_model = RobertaForSequenceClassification.from_pretrained("roberta-large", num_labels=4).cuda()
print("global model: %.2f GiB" % (torch.cuda.memory_allocated() / GiB))

try:
    for rnd in range(ROUNDS):
        selected = rng.sample(range(NUM_CLIENTS), CLIENTS_PER_ROUND)
        global_state = global_model.state_dict()
        client_updates = []
        for i, cid in enumerate(selected):
            local = copy.deepcopy(global_model)
            opt = torch.optim.AdamW(local.parameters(), lr=2e-5)
            train_one_epoch(local, opt, client_loader(cid))
            with torch.no_grad():
                local_state = local.state_dict()
                update = {k: local_state[k] - global_state[k] for k in global_state}
            client_updates.append((n_samples[cid], update))
            del local, opt, local_state
            gc.collect()
            torch.cuda.empty_cache()
            print("round %d client %2d/%d (id %2d, %4d samples) done, allocated %.1f GiB" % (
                rnd, i + 1, CLIENTS_PER_ROUND, cid, n_samples[cid], torch.cuda.memory_allocated() / GiB))
        server_step(global_model, client_updates)
        del client_updates
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
