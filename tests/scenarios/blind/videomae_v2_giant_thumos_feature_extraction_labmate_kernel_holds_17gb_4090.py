"""VideoMAE V2-g (ViT-giant, 1 B parameters) feature extraction for temporal action detection on THUMOS14, on the
lab's shared RTX 4090 workstation, while a labmate's idle Jupyter kernel still holds 17.2 GiB of the card: the
first batch of clips dies in the first transformer block.

The real program is VideoMAEv2's extract_tad_feature.py, modified by the user to batch clips and run in fp16:

    python extract_tad_feature.py --data_set THUMOS14 --data_path data/thumos14/videos \
        --save_path features/th14_vit_g_16_4 --model vit_giant_patch14_224 \
        --ckpt_path vit_g_hybrid_pt_1200e_k710_ft.pth --batch_size 16

    model = create_model("vit_giant_patch14_224", img_size=224, pretrained=False, num_classes=710,
                         all_frames=16, tubelet_size=2, drop_path_rate=0.3, use_mean_pooling=True)
    model.load_state_dict(ckpt); model.half().cuda().eval()
    for vid in videos:
        frames = decord.VideoReader(vid)                          # 16-frame clips, stride 4, 224x224
        for clips in batched(sliding_windows(frames), args.batch_size):
            with torch.no_grad():
                feats = model.forward_features(clips.half().cuda())     # (16, 1408) per batch
            ...

The workstation: a desktop session (Xorg 412 MiB, gnome-shell 186 MiB) and, since yesterday, a labmate's
Jupyter kernel (pid 48213, the sam2 conda env) that ran SAM 2's video predictor over a long clip and was left
open: PyTorch's cache in that kernel keeps 17.2 GiB of the 24 GiB.  nvidia-smi shows it; nothing in the user's
process does.

Sizes.  ViT-g/14 with tubelet 2: 40 blocks of width 1408, 16 heads, MLP 6144; 1.01 B parameters, 2.0 GB in fp16.
A 16x224x224 clip is 8 x 16 x 16 = 2048 tokens.  The attention here is the plain (q @ k^T) of VideoMAE's
Attention class: per clip a 16 x 2048 x 2048 fp16 score matrix, 128 MiB, and its softmax as much.  A batch of 16
clips: scores 2 GiB + softmax 2 GiB, plus ~0.3 GB of hidden states and qkv: the extraction peaks at ~6.5 GB
with the weights (no autograd: nothing is kept between blocks).  The card has 24 GiB; free for this process are
24 - 17.2 - 0.6 - 0.5 (its own CUDA context) = ~5.7 GiB.  The weights load (1.9 GiB), the patch embedding and
the first qkv run, the first block's 2 GiB score matrix still fits, and its 2 GiB softmax fails with 4.4 GiB
allocated by PyTorch and 1.2 GiB free: this process holds a fifth of the card, another process holds 70%.

What an expert says first: look at nvidia-smi: another process (the labmate's idle Jupyter kernel, 17.2 GiB)
holds most of the GPU; ask them to shut the kernel down (or restart it) and rerun: the job needs ~6.5 GB of
a 24 GB card.  Wrong advice: quantization, CPU offload, a bigger GPU, gradient checkpointing or mixed precision
(already fp16, no training), expandable_segments / empty_cache (this process caches nothing; the memory is
another process's), inference_mode (it already runs under no_grad).  A smaller batch (4 clips) would squeeze it
into what is left, but is a workaround for memory the job should have.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)


class Args(object):
    data_set = "THUMOS14"
    data_path = "data/thumos14/videos"
    save_path = "features/th14_vit_g_16_4"
    model = "vit_giant_patch14_224"
    ckpt_path = "vit_g_hybrid_pt_1200e_k710_ft.pth"
    batch_size = 16
    num_frames = 16
    stride = 4


def new_tensor(shape, dtype=torch.float16):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype)
    t.shape = tuple(shape)
    return t


def half_param(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float16))


# ---------------------------------------------------------------------------------------------------------
# VideoMAEv2 models/modeling_finetune.py (nn.Linear / nn.LayerNorm shaped here), weights in fp16 (.half())

class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.out_features = out_features
        self.weight = half_param(in_features * out_features)
        if bias:
            self.bias = half_param(out_features)

    def forward(self, x):
        return new_tensor(x.shape[:-1] + (self.out_features,))


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = half_param(dim)
        self.bias = half_param(dim)

    def forward(self, x):
        return new_tensor(x.shape)


class Attention(nn.Module):
    def __init__(self, dim, num_heads):
        nn.Module.__init__(self)
        self.num_heads = num_heads
        self.qkv = Linear(dim, dim * 3, bias=False)
        self.q_bias = half_param(dim)
        self.v_bias = half_param(dim)
        self.proj = Linear(dim, dim)

    def forward(self, x):
        B, N, C = x.shape
        qkv = self.qkv(x)                                                # F.linear(x, qkv.weight, qkv_bias)
        attn = new_tensor((B, self.num_heads, N, N))                     # (q * scale) @ k.transpose(-2, -1)
        attn = new_tensor((B, self.num_heads, N, N))                     # attn.softmax(dim=-1)
        x = new_tensor((B, N, C))                                        # (attn @ v).transpose(1, 2).reshape
        return self.proj(x)


class Mlp(nn.Module):
    def __init__(self, dim, hidden):
        nn.Module.__init__(self)
        self.fc1 = Linear(dim, hidden)
        self.fc2 = Linear(hidden, dim)

    def forward(self, x):
        h = self.fc1(x)
        h = new_tensor(h.shape)                                          # GELU
        return self.fc2(h)


class Block(nn.Module):
    def __init__(self, dim, num_heads, mlp_ratio):
        nn.Module.__init__(self)
        self.norm1 = LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = LayerNorm(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))

    def forward(self, x):
        a = self.attn(self.norm1(x))
        x = new_tensor(x.shape)                                          # x + drop_path(attn)
        m = self.mlp(self.norm2(x))
        return new_tensor(x.shape)                                       # x + drop_path(mlp)


class PatchEmbed(nn.Module):
    """Conv3d(3, 1408, kernel_size=(2, 14, 14), stride=(2, 14, 14))."""

    def __init__(self, img_size=224, patch_size=14, num_frames=16, tubelet_size=2, embed_dim=1408):
        nn.Module.__init__(self)
        self.num_patches = (img_size // patch_size) ** 2 * (num_frames // tubelet_size)
        self.embed_dim = embed_dim
        self.weight = half_param(embed_dim * 3 * tubelet_size * patch_size * patch_size)
        self.bias = half_param(embed_dim)

    def forward(self, x):
        return new_tensor((x.shape[0], self.num_patches, self.embed_dim))   # proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self, embed_dim=1408, depth=40, num_heads=16, mlp_ratio=48 / 11, num_classes=710):
        nn.Module.__init__(self)
        self.patch_embed = PatchEmbed(embed_dim=embed_dim)
        self.blocks = []
        for i in range(depth):
            blk = Block(embed_dim, num_heads, mlp_ratio)
            setattr(self, "blocks_%d" % i, blk)
            self.blocks.append(blk)
        self.fc_norm = LayerNorm(embed_dim)
        self.head = Linear(embed_dim, num_classes)
        self.register_buffer("pos_embed", torch.empty(self.patch_embed.num_patches * embed_dim, dtype=torch.float16))

    def forward_features(self, x):
        x = self.patch_embed(x)
        x = new_tensor(x.shape)                                          # + pos_embed
        for blk in self.blocks:
            x = blk(x)
        return self.fc_norm(new_tensor((x.shape[0], x.shape[2])))       # x.mean(1)


def create_model(name, **kw):
    assert name == "vit_giant_patch14_224"
    return VisionTransformer()


# ---------------------------------------------------------------------------------------------------------
# the extraction loop

THUMOS14_VIDEOS = [("video_validation_%07d" % i, 1800 + 37 * i) for i in (51, 33, 42, 55, 58, 69, 70, 85)]


def sliding_windows(num_frames, clip_len, stride):
    return list(range(0, max(num_frames - clip_len, 0) + 1, stride))


def extract_feature(args):
    model = create_model(args.model, img_size=224, all_frames=args.num_frames, tubelet_size=2)
    model.eval()
    for vid_name, num_frames in THUMOS14_VIDEOS:
        starts = sliding_windows(num_frames, args.num_frames, args.stride)
        feature_list = []
        for i in range(0, len(starts), args.batch_size):
            n = len(starts[i:i + args.batch_size])
            clips = new_tensor((n, 3, args.num_frames, 224, 224))          # decoded, normalised, .half().cuda()
            with torch.no_grad():
                feature = model.forward_features(clips)
            feature_list.append(feature)
        print("%s: %d clips" % (vid_name, len(starts)))


def main():
    extract_feature(Args())


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
