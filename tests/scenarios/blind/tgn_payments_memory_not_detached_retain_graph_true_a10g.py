"""TGN-style temporal link prediction on a payment stream, memory never detached, on an A10G.

The real code: a fraud team's port of PyG's examples/tgn.py to their own event stream (2.1M
accounts, 48M timestamped payments with 128-d event features, kept on the CPU and moved a batch at a
time), with a hand-written memory module ("PaymentMemory", because they needed per-currency message
functions) in place of torch_geometric.nn.TGNMemory.  Run as `python train_tgn.py` on an AWS
g5.2xlarge (one A10G, 22.5 GiB usable):

    for batch in loader:                                   # 5,000 events a batch, in time order
        optimizer.zero_grad()
        n_id, edge_index, e_id = neighbor_loader(torch.cat([src, dst, neg_dst]).unique())
        mem, last_update = memory(n_id)
        z = gnn(mem, last_update, edge_index, t[e_id], msg[e_id])
        loss = criterion(link_pred(z[src], z[dst]), ones) + criterion(link_pred(z[src], z[neg]), zeros)
        memory.update_state(src, dst, t, msg)              # GRU update of the touched accounts' memory
        neighbor_loader.insert(src, dst)
        loss.backward(retain_graph=True)
        optimizer.step()
        # memory.detach()      <- PyG's TGNMemory has it; PaymentMemory has no such method, nobody called it

The memory is updated out of place (self.memory = self.memory.index_copy(0, n_id, new_rows)) with
autograd on, so each batch's new memory hangs off the previous batch's GRU update.  The second
batch's backward raised "Trying to backward through the graph a second time"; the user added
retain_graph=True (the first search hit), and training ran.  Now every batch's GRU update stays
alive through the chain: the gathered previous rows, the messages (memory of src and dst, event
features, time encoding), the gates and the new rows.

Sizes: memory 2.1M x 100 x 4 B = 840 MB (two copies while index_copy runs), the last-neighbor
loader's tables 2 x 2.1M x 10 x 8 B = 336 MB, the models < 1 MB.  Per batch (10,000 messages:
src->dst and dst->src) the chain keeps 4 MB of gathered rows + 10,000 x 428 x 4 B = 17.1 MB of
messages + 4 MB of time encodings + 12 MB of gates + 4 MB of new rows + the batch's 2.6 MB of event
features = ~44 MB; the embedding's own ~0.5 GB per batch is freed with its loss.  ~19.5 GiB free /
44 MB = some 440 batches, under 5% of the first epoch (9,600 batches), about 20 minutes in: here it
dies in memory.update_state of batch ~435, when index_copy asks for the next 801 MiB copy of the
memory and the cache's free blocks have been carved up by the chained tensors.

What an expert says first: the memory carries the autograd graph from batch to batch; detach it
after each optimizer step (memory.detach() / self.memory = self.memory.detach()), and remove
retain_graph=True, which only hid the symptom.  Wrong advice: a smaller batch, a bigger card
(both only move the failure later in the epoch), gradient checkpointing or autocast (the per-batch
activations are small; the problem is that they are never freed), empty_cache /
expandable_segments (the memory is live, not cached).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda"
FLOAT = 4
INDEX = 8
NUM_ACCOUNTS = 2_100_000
NUM_EVENTS = 48_000_000
RAW_MSG_DIM = 128
MEMORY_DIM = 100
TIME_DIM = 100
EMBEDDING_DIM = 100
BATCH_SIZE = 5_000
NUM_NEIGHBORS = 10


class TimeEncoder(nn.Module):
    def __init__(self, out_channels):
        nn.Module.__init__(self)
        self.out_channels = out_channels
        self.lin = nn.Parameter(torch.empty(out_channels * 2 * FLOAT, device=device))

    def forward(self, t, n):
        out = torch.empty(n * self.out_channels * FLOAT, device=device)      # cos(lin(t))
        out._saved = t
        return out


class GRUCell(nn.Module):
    def __init__(self, input_size, hidden_size):
        nn.Module.__init__(self)
        self.hidden_size = hidden_size
        self.weight_ih = nn.Parameter(torch.empty(3 * hidden_size * input_size * FLOAT, device=device))
        self.weight_hh = nn.Parameter(torch.empty(3 * hidden_size * hidden_size * FLOAT, device=device))
        self.bias_ih = nn.Parameter(torch.empty(3 * hidden_size * FLOAT, device=device))
        self.bias_hh = nn.Parameter(torch.empty(3 * hidden_size * FLOAT, device=device))

    def forward(self, x, h, n):
        gates = torch.empty(3 * n * self.hidden_size * FLOAT, device=device)
        gates._saved = (x, h)
        h_new = torch.empty(n * self.hidden_size * FLOAT, device=device)
        h_new._saved = gates
        return h_new


class PaymentMemory(nn.Module):
    """The team's TGNMemory: one memory row per account, updated by a GRU from the messages of the
    events an account takes part in (identity message function, last-message aggregator)."""

    def __init__(self, num_nodes, raw_msg_dim, memory_dim, time_dim):
        nn.Module.__init__(self)
        self.num_nodes = num_nodes
        self.memory_dim = memory_dim
        self.msg_dim = 2 * memory_dim + raw_msg_dim + time_dim
        self.time_enc = TimeEncoder(time_dim)
        self.gru = GRUCell(self.msg_dim, memory_dim)
        self.register_buffer("memory", torch.empty(num_nodes * memory_dim * FLOAT, device=device))
        self.register_buffer("last_update", torch.empty(num_nodes * INDEX, device=device))

    def forward(self, n_id, n):
        rows = torch.empty(n * self.memory_dim * FLOAT, device=device)           # self.memory[n_id]
        rows._saved = getattr(self.memory, "_saved", None)                        # its graph: the last update
        last = torch.empty(n * INDEX, device=device)
        return rows, last

    def update_state(self, src, dst, t, raw_msg, n_events):
        n = 2 * n_events                                                           # src->dst and dst->src
        prev = torch.empty(n * self.memory_dim * FLOAT, device=device)             # memory[src], memory[dst]
        prev._saved = getattr(self.memory, "_saved", None)
        t_enc = self.time_enc(t, n)
        msg = torch.empty(n * self.msg_dim * FLOAT, device=device)                 # cat([mem_src, mem_dst, raw, t_enc])
        msg._saved = (prev, raw_msg, t_enc)
        new_rows = self.gru(msg, prev, n)
        new_memory = torch.empty(self.num_nodes * self.memory_dim * FLOAT, device=device)  # memory.index_copy(0, idx, new_rows)
        new_memory._saved = new_rows
        self.memory = new_memory


class TransformerEmbedding(nn.Module):
    """GraphAttentionEmbedding: a TransformerConv over the last-neighbor edges with time encodings."""

    def __init__(self, in_channels, out_channels, msg_dim, time_enc):
        nn.Module.__init__(self)
        self.time_enc = time_enc
        self.out_channels = out_channels
        self.edge_dim = msg_dim + time_enc.out_channels
        self.lin_qkvs = nn.Parameter(torch.empty(4 * in_channels * out_channels * FLOAT, device=device))
        self.lin_edge = nn.Parameter(torch.empty(self.edge_dim * out_channels * FLOAT, device=device))

    def forward(self, x, last_update, edge_index, t, msg, n_nodes, n_edges):
        rel_t_enc = self.time_enc(t, n_edges)
        edge_attr = torch.empty(n_edges * self.edge_dim * FLOAT, device=device)
        edge_attr._saved = (rel_t_enc, msg)
        qkv = torch.empty(3 * n_edges * self.out_channels * FLOAT, device=device)
        qkv._saved = (x, edge_attr, edge_index)
        alpha = torch.empty(n_edges * 2 * FLOAT, device=device)
        alpha._saved = qkv
        z = torch.empty(n_nodes * self.out_channels * FLOAT, device=device)
        z._saved = (qkv, alpha)
        return z


class LinkPredictor(nn.Module):
    def __init__(self, in_channels):
        nn.Module.__init__(self)
        self.lin_src = nn.Parameter(torch.empty(in_channels * in_channels * FLOAT, device=device))
        self.lin_dst = nn.Parameter(torch.empty(in_channels * in_channels * FLOAT, device=device))
        self.lin_final = nn.Parameter(torch.empty(in_channels * FLOAT, device=device))

    def forward(self, z, n):
        h = torch.empty(n * EMBEDDING_DIM * FLOAT, device=device)
        h._saved = z
        out = torch.empty(n * FLOAT, device=device)
        out._saved = h
        return out


class LastNeighborLoader(object):
    def __init__(self, num_nodes, size):
        self.size = size
        self.neighbors = torch.empty(num_nodes * size * INDEX, device=device)
        self.e_id = torch.empty(num_nodes * size * INDEX, device=device)

    def __call__(self, n_id, n):
        n_edges = n * self.size
        edge_index = torch.empty(2 * n_edges * INDEX, device=device)
        e_id = torch.empty(n_edges * INDEX, device=device)
        return n * (self.size + 1) // 2, edge_index, e_id, n_edges

    def insert(self, src, dst):
        pass


class EventBatch(object):
    def __init__(self, n):
        self.n = n

    def to(self, dev):
        self.src = torch.empty(self.n * INDEX, device=dev)
        self.dst = torch.empty(self.n * INDEX, device=dev)
        self.t = torch.empty(self.n * INDEX, device=dev)
        self.msg = torch.empty(self.n * RAW_MSG_DIM * FLOAT, device=dev)
        return self


def event_loader(num_events, batch_size):
    """TemporalDataLoader over the CPU-side event store."""
    for _ in range(num_events // batch_size):
        yield EventBatch(batch_size)


def train_epoch(memory, gnn, link_pred, neighbor_loader, optimizer, epoch):
    memory.train()
    gnn.train()
    link_pred.train()
    for step, batch in enumerate(event_loader(NUM_EVENTS, BATCH_SIZE)):
        batch = batch.to(device)
        optimizer.zero_grad()
        n = batch.n
        neg_dst = torch.empty(n * INDEX, device=device)
        all_ids = torch.empty(3 * n * INDEX, device=device)                         # cat([src, dst, neg]).unique()
        n_nodes, edge_index, e_id, n_edges = neighbor_loader(all_ids, 3 * n)
        mem, last_update = memory(all_ids, n_nodes)
        t_edges = torch.empty(n_edges * INDEX, device=device)
        msg_edges = torch.empty(n_edges * RAW_MSG_DIM * FLOAT, device=device)
        z = gnn(mem, last_update, edge_index, t_edges, msg_edges, n_nodes, n_edges)
        pos_out = link_pred(z, n)
        neg_out = link_pred(z, n)
        loss = torch.nn.functional.nll_loss(pos_out, None)        # BCE(pos_out, 1) + BCE(neg_out, 0)
        memory.update_state(batch.src, batch.dst, batch.t, batch.msg, n)
        neighbor_loader.insert(batch.src, batch.dst)
        loss.backward(retain_graph=True)
        optimizer.step()
        if step % 200 == 0:
            print("epoch %d batch %d" % (epoch, step), flush=True)


def main():
    memory = PaymentMemory(NUM_ACCOUNTS, RAW_MSG_DIM, MEMORY_DIM, TIME_DIM)
    gnn = TransformerEmbedding(MEMORY_DIM, EMBEDDING_DIM, RAW_MSG_DIM, memory.time_enc)
    link_pred = LinkPredictor(EMBEDDING_DIM)
    neighbor_loader = LastNeighborLoader(NUM_ACCOUNTS, NUM_NEIGHBORS)
    params = list(memory.parameters()) + list(gnn.parameters()) + list(link_pred.parameters())
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=0.0)
    for epoch in range(1, 11):
        train_epoch(memory, gnn, link_pred, neighbor_loader, optimizer, epoch)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
