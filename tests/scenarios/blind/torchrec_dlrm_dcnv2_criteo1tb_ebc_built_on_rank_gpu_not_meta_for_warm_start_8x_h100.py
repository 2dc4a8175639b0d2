"""dlrm_main.py -- a recommender team trains DLRM-DCNv2 (the MLPerf v3 recommendation benchmark model) on the
Criteo 1TB click logs with TorchRec, on one node of 8x H100 80GB, one rank per GPU (srun --ntasks-per-node=8
--gpus-per-task=1: every rank sees its own card as cuda:0, and the script picks cuda:{LOCAL_RANK % device_count}).  The model is TorchRec's examples/dlrm/dlrm_main.py:
26 embedding tables of dim 128 in float32 (five of them hashed to 40M rows), 97 GiB of tables in all, which
DistributedModelParallel shards across the 8 GPUs (about 12 GiB per rank) with the planner's plan.

This month they want to warm-start the tables from last month's checkpoint instead of from random init.
load_state_dict on the reference model fails ("Cannot copy out of meta tensor; no data!") because the example
builds the EmbeddingBagCollection on the meta device, so they changed one line to build it where the data is:

    eb_configs = [EmbeddingBagConfig(name=f"t_{feature_name}", embedding_dim=args.embedding_dim,
                                     num_embeddings=args.num_embeddings_per_feature[feature_idx],
                                     feature_names=[feature_name])
                  for feature_idx, feature_name in enumerate(DEFAULT_CAT_NAMES)]
    dlrm_model = DLRM_DCN(
        embedding_bag_collection=EmbeddingBagCollection(tables=eb_configs, device=device),   # was torch.device("meta")
        dense_in_features=len(DEFAULT_INT_NAMES), ..., dense_device=device)
    dlrm_model.sparse_arch.embedding_bag_collection.load_state_dict(torch.load(args.warm_start, map_location="cpu"))
    model = DistributedModelParallel(module=DLRMTrain(dlrm_model), device=device, plan=plan)

Every rank now allocates all 26 tables on its own GPU before DistributedModelParallel ever runs.  On rank 0 the
four 40M-row tables before t_cat_21 (19.07 GiB each) and the smaller ones fill 78 GiB of the 79.6 GiB; t_cat_21
asks for another 19.07 GiB and the job dies in EmbeddingBagCollection.__init__, on every rank alike (the log is
rank 0's).

An expert: the tables are 97 GiB unsharded; no single H100 holds them, and no rank needs to.  Keep the
EmbeddingBagCollection on the meta device (or the CPU) and let DistributedModelParallel materialize each rank's
shard; warm-start after sharding (load the checkpoint into the sharded model's state_dict, or through the
tables' init_fn / a torch.distributed.checkpoint load), so each GPU only ever holds its 12 GiB share.
Wrong advice: a smaller batch, gradient checkpointing or mixed precision (the job dies building the model: no
batch has been read), expandable_segments / empty_cache (nothing is cached; one table is 19 GiB), a bigger GPU
(a 141 GB card would hold the whole model on all 8 ranks just to throw 7/8 of it away), fewer hash buckets or a
smaller embedding dim (changes the benchmark model for a loading mistake), CPU/UVM offload of the tables (slows
every step to fix a build-order mistake), FSDP/ZeRO (the model is already sharded by TorchRec's planner; the
problem is materializing it before the sharder runs), quantization or LoRA.
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: torch.device, torch.distributed (a process group of one rank's view:
# NCCL is initialised lazily, at the first collective, which this job never reaches), nn.ModuleDict,
# nn.EmbeddingBag, nn.Linear.


class device(object):
    def __init__(self, spec, index=None):
        if ":" in spec:
            spec, index = spec.split(":")[0], int(spec.split(":")[1])
        self.type, self.index = spec, index

    def __str__(self):
        return self.type if self.index is None else "%s:%d" % (self.type, self.index)


torch.device = device


class _Distributed(object):
    def init_process_group(self, backend="nccl", **kw):
        self.backend = backend

    def get_rank(self):
        return int(os.environ.get("RANK", "0"))

    def get_world_size(self):
        return int(os.environ.get("WORLD_SIZE", "1"))

    def is_initialized(self):
        return hasattr(self, "backend")


if not hasattr(torch, "distributed"):
    torch.distributed = _Distributed()
dist = torch.distributed


class ModuleDict(torch.nn.Module):
    def __init__(self, modules=None):
        torch.nn.Module.__init__(self)
        for k, m in (modules or {}).items():
            self[k] = m

    def __setitem__(self, key, module):
        self._modules[key] = module

    def __getitem__(self, key):
        return self._modules[key]


def _where(dev):
    """Where a module's tensors go: the meta device allocates nothing."""
    return None if dev is not None and str(dev) == "meta" else ("cuda" if dev is None else str(dev))


class EmbeddingBag(torch.nn.Module):
    def __init__(self, num_embeddings, embedding_dim, mode="sum", include_last_offset=False, device=None):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim, self.mode = num_embeddings, embedding_dim, mode
        if _where(device) is not None:
            self.weight = torch.nn.Parameter(torch.empty(num_embeddings * embedding_dim, dtype=torch.float32,
                                                         device=_where(device)))


class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features, bias=True, device=None):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32,
                                                     device=_where(device)))
        self.bias = torch.nn.Parameter(torch.empty(out_features, dtype=torch.float32, device=_where(device)))


torch.nn.ModuleDict, torch.nn.EmbeddingBag, torch.nn.Linear = ModuleDict, EmbeddingBag, Linear
nn = torch.nn


# ---- torchrec, as far as the script uses it (torchrec.modules.embedding_configs / embedding_modules,
# torchrec.models.dlrm)
class EmbeddingBagConfig(object):
    def __init__(self, num_embeddings, embedding_dim, name="", feature_names=None, data_type="fp32"):
        self.num_embeddings, self.embedding_dim, self.name = num_embeddings, embedding_dim, name
        self.feature_names = feature_names or []
        self.data_type = data_type


class EmbeddingBagCollection(nn.Module):
    """torchrec.EmbeddingBagCollection: one nn.EmbeddingBag per table, in embedding_bags, on `device`."""

    def __init__(self, tables, is_weighted=False, device=None):
        nn.Module.__init__(self)
        self._embedding_bag_configs = tables
        self.embedding_bags = nn.ModuleDict()
        for config in tables:
            self.embedding_bags[config.name] = nn.EmbeddingBag(num_embeddings=config.num_embeddings,
                                                               embedding_dim=config.embedding_dim, mode="sum",
                                                               include_last_offset=True, device=device)


class SparseArch(nn.Module):
    def __init__(self, embedding_bag_collection):
        nn.Module.__init__(self)
        self.embedding_bag_collection = embedding_bag_collection


class DenseArch(nn.Module):
    def __init__(self, in_features, layer_sizes, device=None):
        nn.Module.__init__(self)
        for i, (a, b) in enumerate(zip([in_features] + layer_sizes[:-1], layer_sizes)):
            setattr(self, "mlp%d" % i, nn.Linear(a, b, device=device))


class LowRankCrossNet(nn.Module):
    def __init__(self, in_features, num_layers, low_rank, device=None):
        nn.Module.__init__(self)
        for i in range(num_layers):
            setattr(self, "W%d" % i, nn.Linear(in_features, low_rank, bias=False, device=device))
            setattr(self, "V%d" % i, nn.Linear(low_rank, in_features, device=device))


class DLRM_DCN(nn.Module):
    def __init__(self, embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, over_arch_layer_sizes,
                 dcn_num_layers, dcn_low_rank_dim, dense_device=None):
        nn.Module.__init__(self)
        d = embedding_bag_collection._embedding_bag_configs[0].embedding_dim
        self.sparse_arch = SparseArch(embedding_bag_collection)
        self.dense_arch = DenseArch(dense_in_features, dense_arch_layer_sizes, device=dense_device)
        n = len(embedding_bag_collection._embedding_bag_configs)
        self.inter_arch = LowRankCrossNet((n + 1) * d, dcn_num_layers, dcn_low_rank_dim, device=dense_device)
        self.over_arch = DenseArch((n + 1) * d, over_arch_layer_sizes, device=dense_device)
# ----


DEFAULT_INT_NAMES = ["int_%d" % i for i in range(13)]
DEFAULT_CAT_NAMES = ["cat_%d" % i for i in range(26)]
# MLPerf DLRM-DCNv2, Criteo 1TB multi-hot: --num_embeddings_per_feature
NUM_EMBEDDINGS_PER_FEATURE = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282,
                              10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36]


class Args(object):
    embedding_dim = 128
    num_embeddings_per_feature = NUM_EMBEDDINGS_PER_FEATURE
    dense_arch_layer_sizes = [512, 256, 128]
    over_arch_layer_sizes = [1024, 1024, 512, 256, 1]
    dcn_num_layers = 3
    dcn_low_rank_dim = 512
    batch_size = 16384
    warm_start = "/lustre/recsys/dlrm_dcnv2/2025-10/ebc_state_dict.pt"


def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    # srun --gpus-per-task=1: each task sees one GPU (the example's cuda:{LOCAL_RANK} assumed torchrun)
    dev = torch.device("cuda:%d" % (rank % torch.cuda.device_count()))
    torch.cuda.set_device(dev)
    dist.init_process_group(backend="nccl")
    if dist.get_rank() == 0:
        total = sum(args.num_embeddings_per_feature) * args.embedding_dim * 4
        print("world size %d, %d tables, %.1f GiB of embeddings" % (dist.get_world_size(), len(DEFAULT_CAT_NAMES),
                                                                    total / 2.0 ** 30))

    eb_configs = [EmbeddingBagConfig(name="t_%s" % feature_name, embedding_dim=args.embedding_dim,
                                     num_embeddings=args.num_embeddings_per_feature[feature_idx],
                                     feature_names=[feature_name])
                  for feature_idx, feature_name in enumerate(DEFAULT_CAT_NAMES)]
    dlrm_model = DLRM_DCN(
        embedding_bag_collection=EmbeddingBagCollection(tables=eb_configs, device=dev),  # was torch.device("meta")
        dense_in_features=len(DEFAULT_INT_NAMES),
        dense_arch_layer_sizes=args.dense_arch_layer_sizes,
        over_arch_layer_sizes=args.over_arch_layer_sizes,
        dcn_num_layers=args.dcn_num_layers,
        dcn_low_rank_dim=args.dcn_low_rank_dim,
        dense_device=dev,
    )
    # warm start from last month's tables, then shard (never reached)
    # dlrm_model.sparse_arch.embedding_bag_collection.load_state_dict(torch.load(args.warm_start, map_location="cpu"))
    # model = DistributedModelParallel(module=DLRMTrain(dlrm_model), device=dev, plan=plan)
    return dlrm_model


try:
    main(Args())
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
