"""train_landcover.py -- land-cover segmentation (a U-Net with a ResNet-50 encoder, 32M parameters) on
13-band Sentinel-2 L2A tiles, 1024 x 1024 px, on one 24 GiB A10G.  Reading and normalising the
Cloud-Optimized GeoTIFFs with rasterio was the bottleneck, so the user memoised the decoded tiles in the
Dataset, "already on the GPU so the next epoch needs no copy either":

    class S2Tiles(Dataset):
        def __init__(self, paths): self.paths, self._cache = paths, {}
        def __getitem__(self, i):
            if i not in self._cache:
                x = read_cog(self.paths[i])                               # 13 x 1024 x 1024 float32
                self._cache[i] = torch.from_numpy(normalise(x)).cuda()  # 52 MiB each, kept forever
            return self._cache[i], self.labels[i]
    loader = DataLoader(S2Tiles(paths), batch_size=8, shuffle=True, num_workers=0)
    for x, y in loader:
        loss = dice_ce(model(x), y); loss.backward(); optimizer.step(); optimizer.zero_grad()

The training set has 2,400 tiles (122 GiB decoded); the first epoch adds 8 new tiles (416 MiB) to the
dict every step.  Weights, gradients and AdamW state are 0.5 GiB and a step's activations 5.5 GiB, the
same every step: what grows is the dict.  After about forty steps it holds ~16 GiB of tiles and the
forward pass of the next batch runs out.

An expert: keep the decoded tiles in host memory (pinned, or a memory-mapped cache on local disk) and
move one batch to the GPU at a time -- or, if they must stay on the GPU, bound the cache (LRU of a few
GiB).  Not a smaller batch, checkpointing or mixed precision (they would only postpone the same
failure), not empty_cache or expandable_segments: every cached tile is referenced.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

TILE = 13 * 1024 * 1024 * 4            # one decoded tile, float32


class S2Tiles(object):
    def __init__(self, n):
        self.n = n
        self._cache = {}

    def __getitem__(self, i):
        if i not in self._cache:
            self._cache[i] = torch.empty(TILE, device="cuda")     # read_cog(...).cuda()
        return self._cache[i]


class Stage(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))


class UNetR50(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.stages = [Stage(n * MiB) for n in (12, 14, 22, 32, 24, 16, 11)]
        for i, s in enumerate(self.stages):
            setattr(self, "s%d" % i, s)

    def forward(self, x):
        acts = (1200, 1000, 800, 600, 800, 1000, 232)          # MiB saved per stage, batch 8 at 1024 px
        y = x
        for i, a in enumerate(acts):
            z = torch.empty(a * MiB, device="cuda")
            z._saved = y
            z._params = (self.stages[i].weight,)
            y = z
        logits = torch.empty(8 * 10 * 1024 * 1024 * 4, device="cuda")
        logits._saved = y
        logits._params = tuple(self.parameters())
        return logits


def main():
    import random
    ds = S2Tiles(2400)
    model = UNetR50()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    order = list(range(ds.n))
    random.Random(0).shuffle(order)
    for step in range(len(order) // 8):
        idx = order[step * 8:(step + 1) * 8]
        tiles = [ds[i] for i in idx]
        x = torch.empty(8 * TILE, device="cuda")                  # default_collate: torch.stack(tiles)
        logits = model(x)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = logits._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, x, tiles


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
