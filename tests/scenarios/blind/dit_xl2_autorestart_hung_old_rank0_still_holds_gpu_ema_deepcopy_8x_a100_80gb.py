"""DiT-XL/2 (675M) pretrained from scratch on ImageNet-256 latents with facebookresearch/DiT's train.py (DDP,
8x A100 80GB, one node), relaunched by an auto-restart loop after a crash; the crashed run's rank-0 process is
still alive and still holds its GPU memory.

The real program: a sbatch script that runs
    until torchrun --nproc_per_node=8 train.py --model DiT-XL/2 --global-batch-size 2048 --resume auto; do
        sleep 60; done
train.py is DiT's, plus a --resume option: model = DiT_models[args.model](...).to(device); ema =
deepcopy(model); requires_grad(ema, False); model = DDP(model, device_ids=[rank]); the VAE
(sd-vae-ft-ema), AdamW(lr=1e-4, weight_decay=0); then the latest checkpoint is loaded with map_location="cpu".
After 3 days a NCCL watchdog timeout killed the job at 03:12; torchrun tore the group down, but old rank 0
(PID 2931877) was inside the checkpoint writer's write() to an NFS mount that had hung (uninterruptible sleep):
SIGTERM and SIGKILL do not take it until the I/O returns, so it still holds its CUDA context and caching-
allocator reservation, 75.5 GiB of GPU 0 (nvidia-smi lists it as "python").  The loop relaunched 60 s later.

What happens: new rank 0 builds the model on GPU 0 (2.54 GiB fp32 weights, fine), and `ema = deepcopy(model)`
dies with CUDA OOM 1.2 GiB into the EMA copy (a 15 MiB weight).  The run reached 400k steps with the same
script and config, and this process holds only ~4 GiB when it fails.

Arithmetic: 80 GiB card - 75.5 GiB (old process) - 0.5 GiB CUDA context of this process = 4.0 GiB free at
start; model 2.54 + EMA 2.54 = 5.07 GiB does not fit, let alone the DDP buckets (2.5), the VAE (0.3), AdamW
(5.0), gradients (2.5) and the activations (~35 GiB at 256 images per GPU) of a normal step.

What an expert says first: another process holds 75 GiB of this GPU: find it (nvidia-smi / nvidia-smi
--query-compute-apps, fuser /dev/nvidia*), kill it or wait for it, or have the restart loop wait until the
GPUs are free, then relaunch.  Wrong advice: EMA on CPU, smaller batch, gradient checkpointing, FSDP,
autocast, empty_cache/expandable_segments (this process holds almost nothing), a bigger card.
"""
import argparse
import os
from copy import deepcopy

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

scen_truth.note_every_empty(torch)


def fp32(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32))


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out, bias=True):
        super().__init__()
        self.weight = fp32(d_in * d_out)
        self.bias = fp32(d_out) if bias else None


class Attention(torch.nn.Module):
    def __init__(self, dim, num_heads):
        super().__init__()
        self.qkv = Linear(dim, 3 * dim)
        self.proj = Linear(dim, dim)
        self.num_heads = num_heads


class Mlp(torch.nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)


class DiTBlock(torch.nn.Module):
    def __init__(self, hidden_size, num_heads, mlp_ratio=4.0):
        super().__init__()
        self.attn = Attention(hidden_size, num_heads)
        self.mlp = Mlp(hidden_size, int(hidden_size * mlp_ratio))
        self.adaLN_modulation = Linear(hidden_size, 6 * hidden_size)


class TimestepEmbedder(torch.nn.Module):
    def __init__(self, hidden_size, frequency_embedding_size=256):
        super().__init__()
        self.mlp_0 = Linear(frequency_embedding_size, hidden_size)
        self.mlp_2 = Linear(hidden_size, hidden_size)


class LabelEmbedder(torch.nn.Module):
    def __init__(self, num_classes, hidden_size):
        super().__init__()
        self.embedding_table = fp32((num_classes + 1) * hidden_size)     # +1: the CFG null class


class PatchEmbed(torch.nn.Module):
    def __init__(self, patch_size, in_chans, embed_dim):
        super().__init__()
        self.proj = torch.nn.Conv2d(in_chans, embed_dim, patch_size, stride=patch_size)


class FinalLayer(torch.nn.Module):
    def __init__(self, hidden_size, patch_size, out_channels):
        super().__init__()
        self.adaLN_modulation = Linear(hidden_size, 2 * hidden_size)
        self.linear = Linear(hidden_size, patch_size * patch_size * out_channels)


class DiT(torch.nn.Module):
    def __init__(self, input_size=32, patch_size=2, in_channels=4, hidden_size=1152, depth=28, num_heads=16,
                 mlp_ratio=4.0, num_classes=1000, learn_sigma=True):
        super().__init__()
        self.out_channels = in_channels * 2 if learn_sigma else in_channels
        self.x_embedder = PatchEmbed(patch_size, in_channels, hidden_size)
        self.t_embedder = TimestepEmbedder(hidden_size)
        self.y_embedder = LabelEmbedder(num_classes, hidden_size)
        num_patches = (input_size // patch_size) ** 2
        # fixed sin-cos embedding
        self.pos_embed = torch.nn.Parameter(torch.empty(num_patches * hidden_size, dtype=torch.float32),
                                            requires_grad=False)
        self.blocks = [DiTBlock(hidden_size, num_heads, mlp_ratio=mlp_ratio) for _ in range(depth)]
        for i, block in enumerate(self.blocks):
            setattr(self, "blocks_%d" % i, block)
        self.final_layer = FinalLayer(hidden_size, patch_size, self.out_channels)


def DiT_XL_2(**kwargs):
    return DiT(depth=28, hidden_size=1152, patch_size=2, num_heads=16, **kwargs)


DiT_models = {"DiT-XL/2": DiT_XL_2}


def requires_grad(model, flag=True):
    for p in model.parameters():
        p.requires_grad = flag


def main(args):
    # dist.init_process_group("nccl")
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    assert args.global_batch_size % world_size == 0
    device = rank % torch.cuda.device_count()
    torch.cuda.set_device(device)
    print("Starting rank=%d, world_size=%d." % (rank, world_size))

    latent_size = args.image_size // 8
    model = DiT_models[args.model](input_size=latent_size, num_classes=args.num_classes).to(device)
    ema = deepcopy(model)            # Create an EMA of the model for use after training
    requires_grad(ema, False)
    model = DDP(model, device_ids=[rank])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0)

    if args.resume == "auto":
        ckpts = sorted(os.listdir(args.ckpt_dir)) if os.path.isdir(args.ckpt_dir) else []
        if ckpts:
            state = torch.load(os.path.join(args.ckpt_dir, ckpts[-1]), map_location="cpu")
            model.module.load_state_dict(state)
    print("DiT Parameters: %d" % (sum(p.nbytes for p in model.parameters()) // 4))


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--results-dir", type=str, default="results")
    parser.add_argument("--ckpt-dir", type=str, default="results/000-DiT-XL-2/checkpoints")
    parser.add_argument("--model", type=str, choices=list(DiT_models.keys()), default="DiT-XL/2")
    parser.add_argument("--image-size", type=int, choices=[256, 512], default=256)
    parser.add_argument("--num-classes", type=int, default=1000)
    parser.add_argument("--epochs", type=int, default=1400)
    parser.add_argument("--global-batch-size", type=int, default=2048)
    parser.add_argument("--global-seed", type=int, default=0)
    parser.add_argument("--vae", type=str, choices=["ema", "mse"], default="ema")
    parser.add_argument("--resume", type=str, default="auto")
    try:
        main(parser.parse_args())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
