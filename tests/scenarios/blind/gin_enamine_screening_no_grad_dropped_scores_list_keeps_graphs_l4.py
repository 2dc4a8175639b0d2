"""Virtual screening of an Enamine REAL shard with a trained GIN, without torch.no_grad(), on an L4.

The real code: a med-chem group trained an OGB-style GIN (5 layers, hidden 300, AtomEncoder /
BondEncoder, mean pooling; 1.9M parameters) to predict a kinase assay's pIC50.  Its training script
evaluated under @torch.no_grad().  For screening, a new script `screen.py` was written from the
model-loading cell of a notebook, run on a GCP g2-standard-8 (one L4, 22.5 GiB usable):

    model = GIN(num_layers=5, emb_dim=300).to(device)
    model.load_state_dict(torch.load("gin_kinase_best.pt", map_location="cpu"))
    model.eval()
    loader = DataLoader(SmilesShard("enamine_real_shard_017.smi"), batch_size=1024, num_workers=8)
    all_scores = []
    for batch in tqdm(loader):                 # ~5M molecules, 4,883 batches
        batch = batch.to(device)
        all_scores.append(model(batch))        # no torch.no_grad() / inference_mode() here
    scores = torch.cat(all_scores).cpu().numpy()

model.eval() only switches dropout and batch norm; autograd still records every forward.  Each
score tensor (1,024 floats) keeps its batch's whole graph alive through all_scores: every layer's
gathered neighbour features, messages, MLP activations and batch-norm inputs.

Sizes: a batch of 1,024 REAL molecules has ~28,260 heavy atoms and ~62,260 directed bonds.  Per GIN
layer the graph keeps the bond embeddings, the gathered x_j and the messages (3 x 62,260 x 300 x 4 B
= 224 MB), the aggregate, the (1+eps)x + aggr sum, the second linear's output, its batch norm and
ReLU (5 x 28,260 x 300 x 4 B = 170 MB), the first linear's output, its batch norm and ReLU
(3 x 28,260 x 600 x 4 B = 204 MB): ~0.6 GB a layer, ~2.83 GiB (3.04 GB) a batch with the atom
embeddings and the batch's index tensors.  The weights are 7.6 MB.  Seven batches held = 19.8 GiB + 0.5 GiB of context; the eighth batch's forward runs out in
its fourth GIN layer (the 71 MiB bond embedding), ~2 minutes into a screen that should take ~2 hours.

What an expert says first: an inference loop without torch.inference_mode() (or no_grad) that keeps
its outputs: wrap the loop in inference_mode and append scores.detach().cpu() (or write them out per
batch).  Either alone fixes it; with both, memory stays at one batch's forward (~0.7 GB).  Wrong
advice: a smaller batch (it only fails a few batches later), a bigger card, quantization or CPU
offload (the model is 7.6 MB), gradient checkpointing (nothing trains), empty_cache /
expandable_segments (the memory is held by live graphs, not cached).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

device = "cuda"
FLOAT = 4
INDEX = 8
EMB_DIM = 300
NUM_LAYERS = 5
BATCH_SIZE = 1024
MOLECULES_IN_SHARD = 5_000_000
ATOMS_PER_MOLECULE = 27.6           # heavy atoms, Enamine REAL average
BONDS_PER_MOLECULE = 30.4           # undirected; stored in both directions
ATOM_FEATURES = 9                   # OGB atom features (int64 each)
BOND_FEATURES = 3


def save_for_backward(out, *inputs):
    """What autograd keeps for backward when it records: nothing under no_grad / inference_mode."""
    if torch.is_grad_enabled():
        out._saved = inputs
    return out


class ModuleList(nn.Module):
    """torch.nn.ModuleList: the layers kept under "0".."n-1"."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class AtomEncoder(nn.Module):
    def __init__(self, emb_dim):
        nn.Module.__init__(self)
        self.emb_dim = emb_dim
        self.atom_embedding_list = nn.Parameter(torch.empty(173 * emb_dim * FLOAT, device=device))

    def forward(self, x, num_atoms):
        return save_for_backward(torch.empty(num_atoms * self.emb_dim * FLOAT, device=device), x)


class BondEncoder(nn.Module):
    def __init__(self, emb_dim):
        nn.Module.__init__(self)
        self.emb_dim = emb_dim
        self.bond_embedding_list = nn.Parameter(torch.empty(13 * emb_dim * FLOAT, device=device))

    def forward(self, edge_attr, num_edges):
        return save_for_backward(torch.empty(num_edges * self.emb_dim * FLOAT, device=device), edge_attr)


class GINConv(nn.Module):
    """ogb's GINConv: out = MLP((1 + eps) * x + sum_j relu(x_j + bond_emb))."""

    def __init__(self, emb_dim):
        nn.Module.__init__(self)
        self.emb_dim = emb_dim
        self.mlp_lin1 = nn.Parameter(torch.empty(emb_dim * 2 * emb_dim * FLOAT, device=device))
        self.mlp_bn = nn.Parameter(torch.empty(2 * 2 * emb_dim * FLOAT, device=device))
        self.mlp_lin2 = nn.Parameter(torch.empty(2 * emb_dim * emb_dim * FLOAT, device=device))
        self.eps = nn.Parameter(torch.empty(FLOAT, device=device))
        self.bond_encoder = BondEncoder(emb_dim)

    def forward(self, x, edge_index, edge_attr, num_atoms, num_edges):
        d = self.emb_dim
        edge_embedding = self.bond_encoder(edge_attr, num_edges)
        x_j = save_for_backward(torch.empty(num_edges * d * FLOAT, device=device), x, edge_index)
        msg = save_for_backward(torch.empty(num_edges * d * FLOAT, device=device), x_j, edge_embedding)
        aggr = save_for_backward(torch.empty(num_atoms * d * FLOAT, device=device), msg, edge_index)
        h = save_for_backward(torch.empty(num_atoms * d * FLOAT, device=device), x, aggr)
        h1 = save_for_backward(torch.empty(num_atoms * 2 * d * FLOAT, device=device), h)
        h1 = save_for_backward(torch.empty(num_atoms * 2 * d * FLOAT, device=device), h1)     # BatchNorm1d
        h1 = save_for_backward(torch.empty(num_atoms * 2 * d * FLOAT, device=device), h1)     # ReLU
        return save_for_backward(torch.empty(num_atoms * d * FLOAT, device=device), h1)


class GIN(nn.Module):
    def __init__(self, num_layers, emb_dim):
        nn.Module.__init__(self)
        self.emb_dim = emb_dim
        self.atom_encoder = AtomEncoder(emb_dim)
        self.convs = ModuleList([GINConv(emb_dim) for _ in range(num_layers)])
        self.batch_norms = nn.Parameter(torch.empty(num_layers * 2 * emb_dim * FLOAT, device=device))
        self.head = nn.Parameter(torch.empty(emb_dim * FLOAT, device=device))

    def forward(self, batch):
        d = self.emb_dim
        h = self.atom_encoder(batch.x, batch.num_atoms)
        for conv in self.convs:
            h = conv(h, batch.edge_index, batch.edge_attr, batch.num_atoms, batch.num_edges)
            h = save_for_backward(torch.empty(batch.num_atoms * d * FLOAT, device=device), h)   # BatchNorm1d
            h = save_for_backward(torch.empty(batch.num_atoms * d * FLOAT, device=device), h)   # ReLU
        pooled = save_for_backward(torch.empty(batch.num_graphs * d * FLOAT, device=device), h, batch.batch)
        return save_for_backward(torch.empty(batch.num_graphs * FLOAT, device=device), pooled)


class MoleculeBatch(object):
    """torch_geometric.data.Batch of featurised molecules (RDKit -> OGB features), on the CPU until .to()."""

    def __init__(self, num_graphs):
        self.num_graphs = num_graphs
        self.num_atoms = int(num_graphs * ATOMS_PER_MOLECULE)
        self.num_edges = int(num_graphs * BONDS_PER_MOLECULE) * 2

    def to(self, dev):
        self.x = torch.empty(self.num_atoms * ATOM_FEATURES * INDEX, device=dev)
        self.edge_index = torch.empty(2 * self.num_edges * INDEX, device=dev)
        self.edge_attr = torch.empty(self.num_edges * BOND_FEATURES * INDEX, device=dev)
        self.batch = torch.empty(self.num_atoms * INDEX, device=dev)
        return self


def smiles_loader(num_molecules, batch_size):
    """DataLoader(SmilesShard(...), batch_size=1024, num_workers=8): featurised on the CPU workers."""
    for _ in range(num_molecules // batch_size):
        yield MoleculeBatch(batch_size)


def load_model(path):
    model = GIN(num_layers=NUM_LAYERS, emb_dim=EMB_DIM)          # .to(device)
    # model.load_state_dict(torch.load(path, map_location="cpu")): copied into the GPU weights in place
    return model


def screen(model, loader):
    model.eval()
    all_scores = []
    for i, batch in enumerate(loader):
        batch = batch.to(device)
        all_scores.append(model(batch))
        if i % 100 == 0:
            print("screened %d molecules" % ((i + 1) * BATCH_SIZE), flush=True)
    return all_scores


def main():
    model = load_model("gin_kinase_best.pt")
    loader = smiles_loader(MOLECULES_IN_SHARD, BATCH_SIZE)
    all_scores = screen(model, loader)
    print("scored %d batches" % len(all_scores))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
