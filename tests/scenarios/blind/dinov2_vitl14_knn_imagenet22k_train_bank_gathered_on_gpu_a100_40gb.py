"""dinov2/eval/knn.py -- a lab reproduces the k-NN numbers of its own DINOv2 ViT-L/14 pretraining run.  The
evaluation node is one A100-SXM4-40GB (39.59 GiB as PyTorch reports it), launched as a single rank:

    torchrun --nproc_per_node=1 dinov2/eval/knn.py \\
        --config-file runs/vitl14_lvd/config.yaml \\
        --pretrained-weights runs/vitl14_lvd/eval/training_249999/teacher_checkpoint.pth \\
        --output-dir runs/vitl14_lvd/eval/training_249999/knn_in22k \\
        --train-dataset ImageNet22k:root=/datasets/imagenet22k:extra=/datasets/imagenet22k/extra \\
        --val-dataset ImageNet:split=VAL:root=/datasets/imagenet:extra=/datasets/imagenet/extra \\
        --nb_knn 10 20 100 200 --batch-size 256

The same command with `--train-dataset ImageNet:split=TRAIN` has run after every checkpoint for months
(1,281,167 x 1024 float32 = 5.2 GB of train features: nobody ever looked at the memory).  For the paper's
table the team switches the train set to ImageNet-22k (fall11, 14,197,122 images).  DINOv2's feature extraction,
as written (dinov2/eval/utils.py):

    @torch.inference_mode()
    def extract_features_with_dataloader(model, data_loader, sample_count, gather_on_cpu=False):
        gather_device = torch.device("cpu") if gather_on_cpu else torch.device("cuda")
        ...
        for samples, (index, labels_rank) in metric_logger.log_every(data_loader, 10):
            samples = samples.cuda(non_blocking=True)
            ...
            features_rank = model(samples).float()
            # init storage feature matrix
            if features is None:
                features = torch.zeros(sample_count, features_rank.shape[-1], device=gather_device)

`--gather-on-cpu` is off by default.  The model (304M parameters, 1.2 GB in float32) loads, the first batch of
256 images runs through it, and the next line asks for the whole train-feature bank on the GPU at once:
[14,197,122, 1024] float32 = 54.2 GiB, on a card with 37.6 GiB free.  The batch has nothing to do with it: the
bank is sized by the train set (x the embedding width).

An expert: the request is the k-NN train-feature bank, sized by the data set, not the model or the batch.  Keep
it in host memory (`--gather-on-cpu`, whose help text names ImageNet-22k for exactly this), and because
KnnModule then moves each rank's chunk of the bank to its GPU (`train_features.chunk(world_size)[rank].T.cuda()`)
and multiplies a whole test batch against it, run the evaluation on the node's 8 GPUs (6.8 GiB of bank per rank),
or subsample the train set / keep the bank off the GPU in a CPU index.
Wrong first advice: a smaller batch (256 -> 32 leaves the 54 GiB request as it is), mixed precision /
autocast (already on; the bank is float32 by `.float()`, and a float16 bank of 27 GiB would fit only to fail
at the [256 x 14.2M] similarity matrix of the first test batch), inference_mode (already on), gradient
checkpointing (no training), quantizing or offloading the 1.2 GB model, expandable_segments / empty_cache
(nothing is cached or fragmented: one request larger than the card), a bigger GPU first (an 80 GB card holds
this bank and fails on the next data set; the flag exists).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.zeros / torch.full (C functions in PyTorch, no Python frame of their own), compiled
# as part of torch's file so the failing line stays the program's own.
_GAPS = """
def zeros(*size, dtype=None, device=None, requires_grad=False):
    shape = size[0] if len(size) == 1 and isinstance(size[0], (list, tuple)) else size
    n = 1
    for s in shape:
        n *= int(s)
    if str(device) == "cpu":
        return serialization._HostTensor(n * _ITEMSIZE[dtype or get_default_dtype()])
    return empty(n, dtype=dtype or get_default_dtype(), device=str(device))

def full(size, fill_value, dtype=None, device=None):
    n = 1
    for s in size:
        n *= int(s)
    if str(device) == "cpu":
        return serialization._HostTensor(8 * n)
    return empty(8 * n, device=str(device))      # int64 (the stand-in sizes it in bytes)
"""
if not hasattr(torch, "zeros"):
    _ns = vars(torch)
    exec(compile(_GAPS, torch.__file__, "exec"), _ns)
# ----

MiB = 1 << 20


class device(object):
    """torch.device, as far as this script uses it."""

    def __init__(self, kind):
        self.type = kind

    def __str__(self):
        return self.type


def _param(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.float32, device="cuda"))


class NestedTensorBlock(torch.nn.Module):
    """dinov2.layers.block.NestedTensorBlock: LayerNorm, MemEffAttention (xFormers), LayerScale, Mlp."""

    def __init__(self, dim, mlp_ratio=4):
        torch.nn.Module.__init__(self)
        self.norm1 = _param(2 * dim)
        self.qkv = _param(3 * dim * dim + 3 * dim)
        self.proj = _param(dim * dim + dim)
        self.ls1 = _param(dim)
        self.norm2 = _param(2 * dim)
        self.fc1 = _param(dim * dim * mlp_ratio + dim * mlp_ratio)
        self.fc2 = _param(dim * mlp_ratio * dim + dim)
        self.ls2 = _param(dim)
        self.dim = dim
        self.mlp_ratio = mlp_ratio

    def forward(self, x, tokens):
        b = x.nbytes // (tokens * self.dim * 2)
        # under autocast (float16): temporaries of one block, freed as the next line runs
        qkv = torch.empty(b * tokens * 3 * self.dim, dtype=torch.float16, device="cuda")
        attn = torch.empty(b * tokens * self.dim, dtype=torch.float16, device="cuda")   # memory-efficient attention
        del qkv
        x = torch.empty(b * tokens * self.dim, dtype=torch.float16, device="cuda")
        del attn
        hidden = torch.empty(b * tokens * self.dim * self.mlp_ratio, dtype=torch.float16, device="cuda")
        out = torch.empty(b * tokens * self.dim, dtype=torch.float16, device="cuda")
        del hidden, x
        return out


class DinoVisionTransformer(torch.nn.Module):
    """dinov2.models.vision_transformer.vit_large(patch_size=14, img_size=518, block_chunks=0,
    init_values=1e-5, ffn_layer='mlp'): 24 blocks of width 1024, 16 heads; 304M parameters."""

    def __init__(self, patch_size=14, embed_dim=1024, depth=24, img_size=518):
        torch.nn.Module.__init__(self)
        self.patch_size = patch_size
        self.embed_dim = embed_dim
        self.patch_embed = _param(3 * patch_size * patch_size * embed_dim + embed_dim)
        self.cls_token = _param(embed_dim)
        self.pos_embed = _param((img_size // patch_size) ** 2 * embed_dim + embed_dim)
        self.mask_token = _param(embed_dim)
        for i in range(depth):
            setattr(self, "blocks_%d" % i, NestedTensorBlock(embed_dim))
        self.norm = _param(2 * embed_dim)
        self.depth = depth

    def forward(self, x, img=224):
        b = x.nbytes // (3 * img * img * 4)
        tokens = (img // self.patch_size) ** 2 + 1
        h = torch.empty(b * tokens * self.embed_dim, dtype=torch.float16, device="cuda")
        for i in range(self.depth):
            h = getattr(self, "blocks_%d" % i)(h, tokens)
        cls = torch.empty(b * self.embed_dim, dtype=torch.float16, device="cuda")   # x_norm_clstoken
        return cls


class ModelWithNormalize(torch.nn.Module):
    def __init__(self, model):
        torch.nn.Module.__init__(self)
        self.model = model

    def forward(self, samples):
        out = self.model(samples)
        return torch.empty(out.nbytes // 2, dtype=torch.float16, device="cuda")   # F.normalize(..., dim=1, p=2)


def _float(t):
    """Tensor.float()."""
    return torch.empty(t.nbytes // torch._ITEMSIZE[t.dtype], dtype=torch.float32, device="cuda")


class ImageNet22k(object):
    """dinov2.data.datasets.ImageNet22k (fall11): 14,197,122 images, 21,841 classes."""

    def __len__(self):
        return 14_197_122


class ImageNet(object):
    def __init__(self, split):
        self.split = split

    def __len__(self):
        return {"TRAIN": 1_281_167, "VAL": 50_000}[self.split]


class DataLoader(object):
    """make_data_loader(dataset, batch_size=256, num_workers=10, sampler_type=SamplerType.DISTRIBUTED, ...):
    samples arrive in pinned host memory; (index, label) with them."""

    def __init__(self, dataset, batch_size):
        self.dataset, self.batch_size = dataset, batch_size

    def __iter__(self):
        for start in range(0, len(self.dataset), self.batch_size):
            yield ("host", start, min(self.batch_size, len(self.dataset) - start))


def _to_cuda(batch_images, img=224):
    """samples.cuda(non_blocking=True): the normalized float32 batch."""
    return torch.empty(batch_images * 3 * img * img, dtype=torch.float32, device="cuda")


def extract_features_with_dataloader(model, data_loader, sample_count, gather_on_cpu=False):
    gather_device = device("cpu") if gather_on_cpu else device("cuda")
    features, all_labels = None, None
    seen = 0
    with torch.inference_mode():
        for _, start, n in data_loader:
            samples = _to_cuda(n)
            labels_rank = torch.empty(8 * n, device="cuda")       # int64 (the stand-in sizes it in bytes)
            index = torch.empty(8 * n, device="cuda")             # int64
            with torch.autocast("cuda", dtype=torch.float16):
                features_rank = _float(model(samples))

            # init storage feature matrix
            if features is None:
                features = torch.zeros(sample_count, model.model.embed_dim, device=gather_device)
                all_labels = torch.full([sample_count], fill_value=-1, device=gather_device)
                print("Storing features into tensor of shape (%d, %d)" % (sample_count, model.model.embed_dim))

            # share indexes, features and labels between processes (one rank: all_gather of itself)
            # features.index_copy_(0, index_all, features_all_ranks) ...
            seen += n
            if seen >= 4 * data_loader.batch_size:
                break
    return features, all_labels


def main():
    args = {"batch_size": 256, "gather_on_cpu": False, "nb_knn": [10, 20, 100, 200], "temperature": 0.07}
    torch.cuda.set_device(0)
    backbone = DinoVisionTransformer()
    # setup_and_build_model: teacher weights loaded on the CPU-built model, then .cuda(), .eval()
    backbone.eval()
    n_params = sum(p.nbytes for p in backbone.parameters()) // 4
    print("vit_large (patch 14): %.1fM parameters; autocast float16" % (n_params / 1e6))
    model = ModelWithNormalize(backbone)

    train_dataset = ImageNet22k()
    val_dataset = ImageNet("VAL")
    print("Train dataset: %d images; val dataset: %d images" % (len(train_dataset), len(val_dataset)))
    print("Extracting features for train set...")
    train_loader = DataLoader(train_dataset, args["batch_size"])
    train_features, train_labels = extract_features_with_dataloader(
        model, train_loader, len(train_dataset), gather_on_cpu=args["gather_on_cpu"])
    print("Train features created, shape (%d, %d)" % (len(train_dataset), backbone.embed_dim))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
