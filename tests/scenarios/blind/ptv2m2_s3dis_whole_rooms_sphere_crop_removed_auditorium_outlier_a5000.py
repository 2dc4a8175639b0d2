"""Point Transformer V2 (Pointcept, semseg-pt-v2m2-0-base) semantic segmentation on S3DIS, trained on whole
rooms: the SphereCrop that bounds every sample was taken out of the recipe, and one room of Area 2 is six
times the size of the others.

The real program is Pointcept's tools/train.py with a config derived from
configs/s3dis/semseg-pt-v2m2-0-base.py, run on one RTX A5000 (24 GB) of a lab workstation:

    data = dict(train=dict(type="S3DISDataset", split=("Area_1", "Area_2", "Area_3", "Area_4", "Area_6"),
                           transform=[..., dict(type="GridSample", grid_size=0.04, hash_type="fnv",
                                                mode="train", return_grid_coord=True),
                                      # dict(type="SphereCrop", point_max=80000, mode="random"),   <- removed
                                      ...]))
    batch_size = 4          # offset-concatenated batch: 4 rooms, any number of points each
    enable_amp = False      # turned off while chasing a NaN, never turned back on
    model = dict(type="PT-v2m2", in_channels=6, num_classes=13, patch_embed_channels=48,
                 enc_channels=(96, 192, 384, 512), enc_depth=(2, 2, 6, 2), enc_groups=(12, 24, 48, 64),
                 enc_neighbours=(16,)*4, grid_sizes=(0.15, 0.375, 0.9375, 2.34), ...)
    optimizer = AdamW(lr=0.005, weight_decay=0.02)

The user wanted "whole-room context" and went from the recipe's GridSample(0.02) + SphereCrop(80k) to a coarser
GridSample(0.04) with no crop.  At 4 cm the offices, conference rooms, WCs and hallways of S3DIS are 19k to 72k
points, so a batch of four rooms is 100k-180k points.  PTv2's grouped vector attention gathers K=16 neighbours
for every point, and each block saves about eight N x 16 x C fp32 tensors for backward (grouped keys and
values, the q-k relation, the positional-encoding MLP's outputs, value + pe): ~25 KB per point for a
48-channel block at full resolution, and ~56 KB per input point over the whole U-Net (patch embedding and the
last decoder stage at full resolution, encoder stages at 1/7, 1/49, 1/294 of the points after GridPool).  A
normal batch therefore peaks at 7-10 GB on the card (the weights, ~15 M parameters, and AdamW's state are
~0.2 GB), and the first iterations run.

Area_2/auditorium_1 is an auditorium of ~9.5 M raw points; at 4 cm it is still 431k points, six times the
largest other room.  The batch that contains it (431k + three ordinary rooms = 520k points) needs ~29 GB of
saved activations; the auditorium alone would need ~24 GB, which with the CUDA context does not fit in 24 GB
either.  The job dies near the end of the forward pass, in the last decoder stage (back at full resolution,
GroupedVectorAttention over 520k x 16 x 48 fp32 = 1.5 GB per tensor), with ~23 GB allocated by PyTorch and the
allocator's free cache already handed back: live memory fills the card and the 1.5 GB request does not fit in
the ~1 GB left.

What an expert says first: this is an input-size outlier, not a batch-size problem: put the cap back
(SphereCrop point_max=80000..120000 in the train transform, or GridSample + a per-sample point limit), so that
no room's points can exceed a bound; a point budget per batch (pack rooms up to a total number of points) is
the companion fix.  batch_size=1 does not help (the auditorium alone does not fit); expandable_segments or
empty_cache do nothing (the cache is already released, the live tensors are the problem); flash-attention does
not apply (PTv2's attention is a grouped vector attention over kNN neighbours, no softmax(QK^T) matrix); a
bigger card only moves the limit to the next larger room.  Gradient checkpointing (Pointcept's
enable_checkpoint) or AMP would shrink every batch, but leave the per-sample size unbounded.
"""
import random

import torch
import torch.nn.functional as F
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

FP32 = 4

CFG = dict(
    seed=38873305,
    batch_size=4,
    epochs=3000,
    num_classes=13,
    grid_size=0.04,
    sphere_crop=None,          # was dict(type="SphereCrop", point_max=80000, mode="random")
    enable_amp=False,
    patch_embed_channels=48,
    enc_channels=(96, 192, 384, 512),
    enc_depth=(2, 2, 6, 2),
    enc_groups=(12, 24, 48, 64),
    dec_channels=(48, 96, 192, 384),
    dec_depth=(1, 1, 1, 1),
    neighbours=16,
    # points kept by each GridPool, relative to its input (S3DIS at 5 cm, measured on Area_1)
    pool_ratio=(1 / 7.0, 1 / 7.0, 1 / 6.0, 1 / 6.0),
)


# ----------------------------------------------------------------------------------------------------------
# layers (the stand-in torch has no nn.Linear / nn.BatchNorm1d: these are their shapes, sizes in bytes)

class Linear(nn.Module):
    """torch.nn.Linear(in_features, out_features) applied to (..., in_features) rows."""

    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features * FP32))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features * FP32))

    def forward(self, x):
        return linear(x, self.weight, self.in_features, self.out_features)


class PointBatchNorm(nn.Module):
    """Pointcept's PointBatchNorm (BatchNorm1d over points, or over points x neighbours), ReLU in place."""

    def __init__(self, channels):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(channels * FP32))
        self.bias = nn.Parameter(torch.empty(channels * FP32))

    def forward(self, x):
        return batch_norm_relu(x, self.weight, self.bias)


def linear(x, weight, in_features, out_features):
    """F.linear: (..., out_features), saving x for the weight's gradient."""
    out = torch.empty(x.nbytes // in_features * out_features)
    out._saved = x
    return out


def batch_norm_relu(x, weight, bias):
    """F.batch_norm then F.relu(inplace=True): one tensor the size of x, x saved."""
    out = torch.empty(x.nbytes)
    out._saved = x
    return out


def pointops_grouping(idx, feat, n, k, c, with_xyz=False):
    """pointops.grouping(reference_index, feat, coord, with_xyz): (n, k, c[+3]) gathered neighbour features."""
    out = torch.empty(n * k * (c + (3 if with_xyz else 0)) * FP32)
    out._saved = feat
    return out


def pointops_knn_query(k, n):
    """pointops.knn_query: (n, k) int32 neighbour indices (no grad)."""
    return torch.empty(n * k * 4, dtype=torch.uint8)


def elementwise(a, b):
    """a + b / a - b on (n, k, c): a new tensor the size of a."""
    out = torch.empty(a.nbytes)
    out._saved = a
    return out


# ----------------------------------------------------------------------------------------------------------
# Point Transformer V2 (pointcept/models/point_transformer_v2/point_transformer_v2m2_base.py)

class GroupedVectorAttention(nn.Module):
    def __init__(self, embed_channels, groups, neighbours):
        nn.Module.__init__(self)
        self.c, self.groups, self.k = embed_channels, groups, neighbours
        self.linear_q = Linear(embed_channels, embed_channels)
        self.norm_q = PointBatchNorm(embed_channels)
        self.linear_k = Linear(embed_channels, embed_channels)
        self.norm_k = PointBatchNorm(embed_channels)
        self.linear_v = Linear(embed_channels, embed_channels)
        self.linear_p_bias = Linear(3, embed_channels)
        self.norm_p = PointBatchNorm(embed_channels)
        self.linear_p_bias2 = Linear(embed_channels, embed_channels)
        self.weight_encoding = Linear(embed_channels, groups)
        self.norm_w = PointBatchNorm(groups)
        self.weight_encoding2 = Linear(groups, groups)

    def forward(self, feat, coord, reference_index, n):
        c, k = self.c, self.k
        query = self.norm_q(self.linear_q(feat))
        key = self.norm_k(self.linear_k(feat))
        value = self.linear_v(feat)
        key = pointops_grouping(reference_index, key, n, k, c, with_xyz=True)
        value = pointops_grouping(reference_index, value, n, k, c)
        pos = torch.empty(n * k * 3 * FP32)
        pos._saved = key
        relation_qk = elementwise(value, key)                    # key - query.unsqueeze(1)
        peb = self.linear_p_bias2(self.norm_p(self.linear_p_bias(pos)))
        relation_qk = elementwise(relation_qk, peb)              # relation_qk + peb
        value = elementwise(value, relation_qk)                  # value + peb
        weight = self.weight_encoding2(self.norm_w(self.weight_encoding(relation_qk)))
        weight = elementwise(weight, value)                      # softmax(dim=1) * mask
        out = torch.empty(n * c * FP32)                           # einsum("n s g i, n s g -> n g i")
        out._saved = weight
        return out


class Block(nn.Module):
    def __init__(self, embed_channels, groups, neighbours):
        nn.Module.__init__(self)
        self.attn = GroupedVectorAttention(embed_channels, groups, neighbours)
        self.fc1 = Linear(embed_channels, embed_channels)
        self.fc3 = Linear(embed_channels, embed_channels)
        self.norm1 = PointBatchNorm(embed_channels)
        self.norm2 = PointBatchNorm(embed_channels)
        self.norm3 = PointBatchNorm(embed_channels)

    def forward(self, points, reference_index):
        coord, feat, n = points
        identity = feat
        feat = self.norm1(self.fc1(feat))
        feat = self.attn(feat, coord, reference_index, n)
        feat = self.norm2(feat)
        feat = self.norm3(self.fc3(feat))
        feat = elementwise(feat, identity)                       # identity + drop_path(feat)
        return coord, feat, n


class BlockSequence(nn.Module):
    def __init__(self, depth, embed_channels, groups, neighbours):
        nn.Module.__init__(self)
        self.neighbours = neighbours
        self.blocks = []
        for i in range(depth):
            b = Block(embed_channels, groups, neighbours)
            setattr(self, "block%d" % i, b)
            self.blocks.append(b)

    def forward(self, points):
        reference_index = pointops_knn_query(self.neighbours, points[2])
        for block in self.blocks:
            points = block(points, reference_index)
        return points


class GridPool(nn.Module):
    def __init__(self, in_channels, out_channels, ratio):
        nn.Module.__init__(self)
        self.ratio = ratio
        self.fc = Linear(in_channels, out_channels, bias=False)
        self.norm = PointBatchNorm(out_channels)
        self.out_channels = out_channels

    def forward(self, points):
        coord, feat, n = points
        feat = self.norm(self.fc(feat))
        m = max(1, int(n * self.ratio))
        pooled = torch.empty(m * self.out_channels * FP32)     # segment_csr(feat[idx], reduce="max")
        pooled._saved = feat
        return (torch.empty(m * 3 * FP32), pooled, m), (coord, n)


class UnpoolWithSkip(nn.Module):
    def __init__(self, in_channels, skip_channels, out_channels):
        nn.Module.__init__(self)
        self.proj = Linear(in_channels, out_channels)
        self.proj_norm = PointBatchNorm(out_channels)
        self.proj_skip = Linear(skip_channels, out_channels)
        self.skip_norm = PointBatchNorm(out_channels)
        self.out_channels = out_channels

    def forward(self, points, skip_points):
        coord, feat, n = skip_points
        up = self.proj_norm(self.proj(points[1]))
        up_full = torch.empty(n * self.out_channels * FP32)    # feat[cluster]
        up_full._saved = up
        skip = self.skip_norm(self.proj_skip(feat))
        out = elementwise(up_full, skip)
        return coord, out, n


class PointTransformerV2(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        c0 = cfg["patch_embed_channels"]
        self.embed_proj = Linear(6, c0, bias=False)
        self.embed_norm = PointBatchNorm(c0)
        self.patch_embed = BlockSequence(1, c0, 6, cfg["neighbours"])
        self.enc_pool, self.enc_blocks, self.dec_unpool, self.dec_blocks = [], [], [], []
        prev = c0
        for i, (c, d, g) in enumerate(zip(cfg["enc_channels"], cfg["enc_depth"], cfg["enc_groups"])):
            pool = GridPool(prev, c, cfg["pool_ratio"][i])
            blocks = BlockSequence(d, c, g, cfg["neighbours"])
            setattr(self, "enc%d_down" % i, pool)
            setattr(self, "enc%d_blocks" % i, blocks)
            self.enc_pool.append(pool)
            self.enc_blocks.append(blocks)
            prev = c
        skip_channels = (c0,) + tuple(cfg["enc_channels"][:-1])
        for i in reversed(range(4)):
            dc = cfg["dec_channels"][i]
            up = UnpoolWithSkip(prev, skip_channels[i], dc)
            blocks = BlockSequence(cfg["dec_depth"][i], dc, max(dc // 16, 1), cfg["neighbours"])
            setattr(self, "dec%d_up" % i, up)
            setattr(self, "dec%d_blocks" % i, blocks)
            self.dec_unpool.append(up)
            self.dec_blocks.append(blocks)
            prev = dc
        self.seg_head = Linear(c0, cfg["num_classes"])

    def forward(self, data_dict):
        n = data_dict["num_points"]
        feat = self.embed_norm(self.embed_proj(data_dict["feat"]))
        points = self.patch_embed((data_dict["coord"], feat, n))
        skips = [points]
        for pool, blocks in zip(self.enc_pool, self.enc_blocks):
            points, _ = pool(points)
            points = blocks(points)
            skips.append(points)
        skips.pop()
        for up, blocks in zip(self.dec_unpool, self.dec_blocks):
            points = up(points, skips.pop())
            points = blocks(points)
        return self.seg_head(points[1])


# ----------------------------------------------------------------------------------------------------------
# data: S3DIS rooms after GridSample(0.05), no SphereCrop

def s3dis_room_sizes(areas):
    """The number of points of each room after GridSample(grid_size=0.05) (the dataset's cached lengths,
    data/s3dis/<area>/<room>/coord.npy after the transform)."""
    rng = random.Random(2019)
    kinds = [("office", 0.46, 19000, 42000), ("conferenceRoom", 0.06, 31000, 53000), ("hallway", 0.22, 22000, 72000),
             ("WC", 0.04, 19000, 27000), ("storage", 0.08, 19000, 34000), ("lounge", 0.02, 37000, 59000),
             ("pantry", 0.02, 20000, 30000), ("copyRoom", 0.02, 19000, 25000), ("openspace", 0.08, 31000, 69000)]
    rooms = []
    per_area = {"Area_1": 44, "Area_2": 40, "Area_3": 23, "Area_4": 49, "Area_6": 48}
    for area in areas:
        counts = {}
        for i in range(per_area[area]):
            x = rng.random()
            for kind, p, lo, hi in kinds:
                if x < p:
                    break
                x -= p
            counts[kind] = counts.get(kind, 0) + 1
            rooms.append(("%s/%s_%d" % (area, kind, counts[kind]), rng.randint(lo, hi)))
        if area == "Area_2":
            rooms.append(("Area_2/auditorium_1", 431120))
            rooms.append(("Area_2/auditorium_2", 69317))
    return rooms


class S3DISDataset(object):
    def __init__(self, split, loop=30):
        self.rooms = s3dis_room_sizes(split)
        self.loop = loop

    def __len__(self):
        return len(self.rooms) * self.loop

    def __getitem__(self, i):
        name, n = self.rooms[i % len(self.rooms)]
        return {"name": name, "num_points": n}


def point_collate_fn(samples):
    """Pointcept's collate: rooms concatenated, offsets mark their ends; the batch goes to the GPU whole."""
    n = sum(s["num_points"] for s in samples)
    return {"names": [s["name"] for s in samples], "num_points": n,
            "coord": torch.empty(n * 3 * FP32), "grid_coord": torch.empty(n * 3 * 4),
            "feat": torch.empty(n * 6 * FP32), "segment": torch.empty(n * 8),
            "offset": torch.empty(len(samples) * 8)}


def train_loader(dataset, batch_size, seed):
    order = list(range(len(dataset)))
    random.Random(seed).shuffle(order)
    for i in range(0, len(order) - batch_size + 1, batch_size):
        yield point_collate_fn([dataset[j] for j in order[i:i + batch_size]])


class Trainer(object):
    def __init__(self, cfg):
        self.cfg = cfg
        self.model = PointTransformerV2(cfg).cuda()
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=0.005, weight_decay=0.02)
        self.train_data = S3DISDataset(("Area_1", "Area_2", "Area_3", "Area_4", "Area_6"))

    def run_step(self, input_dict):
        seg_logits = self.model(input_dict)
        loss = F.cross_entropy(seg_logits, input_dict["segment"])
        self.optimizer.zero_grad()
        scen_truth.backward(loss)
        self.optimizer.step()

    def train(self):
        self.model.train()
        for epoch in range(self.cfg["epochs"]):
            for it, input_dict in enumerate(train_loader(self.train_data, self.cfg["batch_size"],
                                                         self.cfg["seed"] + epoch)):
                self.run_step(input_dict)
                if it % 50 == 0:
                    print("Train: [%d/%d][%d] points %d" % (epoch + 1, self.cfg["epochs"], it,
                                                          input_dict["num_points"]))


def main():
    torch.cuda.set_device(0)
    Trainer(CFG).train()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
