"""train_schnet.py -- a PhD student trains a SchNet energy model (6 interactions, 256 filters, 6 A cutoff;
2.3M parameters) on GEOM-drugs conformers (the 3 lowest-energy conformers of each molecule: 850k
conformers, 44 atoms on average, GFN2-xTB energies), PyG 2.5 + PyTorch 2.3.

The dataset is a PyG InMemoryDataset.  Its process() ran once on the cluster's A100 80GB node, where
building the radius graphs on the GPU took 40 minutes instead of 9 hours:

    def process(self):
        data_list = []
        for mol in tqdm(read_geom_pickles(self.raw_paths)):
            pos = torch.tensor(mol.positions, device="cuda")
            edge_index = radius_graph(pos, r=6.0, max_num_neighbors=64)
            vec = pos[edge_index[0]] - pos[edge_index[1]]
            data_list.append(Data(z=z.cuda(), pos=pos, edge_index=edge_index, edge_vec=vec,
                                  edge_dist=vec.norm(dim=-1), energy=e.cuda()))
        self.save(data_list, self.processed_paths[0])        # collate + torch.save: tensors still on cuda:0

and the training script starts as the tutorials do:

    dataset = GeomConformers("data/geom_drugs_r6")            # InMemoryDataset.__init__ -> self.load(path)
    model = SchNet(hidden_channels=256, num_filters=256, num_interactions=6, cutoff=6.0).cuda()
    loader = DataLoader(dataset, batch_size=64, shuffle=True)

The processed file holds the collated tensors -- z, pos, 906M edges' index (14.5 GB), their vectors
(10.9 GB) and distances (3.6 GB) -- 29.8 GB in all, and torch.save recorded them as CUDA storages.
InMemoryDataset.load calls torch.load without map_location, so every storage is restored to the GPU it
was saved from: cuda:0.  On the cluster that was 30 of 80 GB and nobody noticed.  The student copied the
folder to the lab's workstation (one RTX A5000, 24 GB) and the script dies before the model exists, in the
dataset constructor: torch.load restoring edge_vec asks for 10.1 GiB with 9.3 GiB free, the edge index
(13.5 GiB) already on the GPU.

An expert: this is the loading phase, not training -- the whole dataset is being deserialized onto the
GPU because that is where it was saved.  Load it into CPU memory: torch.load(path, map_location="cpu")
(override load() or re-save the processed file from CPU tensors), keep the dataset in host memory and
let the DataLoader move one batch of 64 conformers at a time.  The training itself needs ~3 GiB.
Wrong first advice: a smaller batch, gradient checkpointing or mixed precision (no batch, no forward
pass yet), expandable_segments or empty_cache (nothing is cached), quantization or loading in bf16 (it is
data, not weights; int64 indices), CPU offload of the model, a bigger GPU (the data does not belong on
any GPU), inference_mode.
"""
import json
import os
import sys
import tempfile

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

F32, I64 = 4, 8
N_CONF, N_ATOMS, N_EDGES = 850_000, 37_740_000, 906_000_000


# The processed file as the cluster job wrote it (stand-in torch's checkpoint format: each entry's bytes).
root = tempfile.mkdtemp(prefix="geom_drugs_r6_")
os.makedirs(os.path.join(root, "processed"))
processed = os.path.join(root, "processed", "data.pt")
with open(processed, "w") as f:
    json.dump({"data.z": N_ATOMS * I64, "data.pos": N_ATOMS * 3 * F32,
               "data.edge_index": 2 * N_EDGES * I64, "data.edge_vec": N_EDGES * 3 * F32,
               "data.edge_dist": N_EDGES * F32, "data.energy": N_CONF * F32,
               "slices.z": (N_CONF + 1) * I64, "slices.pos": (N_CONF + 1) * I64,
               "slices.edge_index": (N_CONF + 1) * I64, "slices.edge_vec": (N_CONF + 1) * I64,
               "slices.edge_dist": (N_CONF + 1) * I64, "slices.energy": (N_CONF + 1) * I64}, f)


# ---- torch_geometric.data.InMemoryDataset, as far as it goes here ----
class InMemoryDataset(object):
    def __init__(self, root):
        self.root = root
        self.processed_paths = [os.path.join(root, "processed", "data.pt")]
        if not os.path.exists(self.processed_paths[0]):
            self.process()
        self.load(self.processed_paths[0])

    def load(self, path):
        """InMemoryDataset.load: out = fs.torch_load(path) -> torch.load(f, map_location=None)"""
        out = torch.load(path)
        self._data = {k[5:]: v for k, v in out.items() if k.startswith("data.")}
        self.slices = {k[7:]: v for k, v in out.items() if k.startswith("slices.")}

    def __len__(self):
        return N_CONF


class GeomConformers(InMemoryDataset):
    def process(self):
        raise RuntimeError("processed on the cluster")


class SchNet(nn.Module):
    def __init__(self, hidden_channels=128, num_filters=128, num_interactions=6, cutoff=10.0):
        nn.Module.__init__(self)
        self.embedding = nn.Parameter(torch.empty(100 * hidden_channels * F32, device="cuda"))
        self.interactions = nn.Parameter(torch.empty(num_interactions * 370_000 * F32, device="cuda"))


try:
    dataset = GeomConformers(root)
    model = SchNet(hidden_channels=256, num_filters=256, num_interactions=6, cutoff=6.0).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    print("dataset", len(dataset), "conformers; allocated %.1f GiB" % (torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
