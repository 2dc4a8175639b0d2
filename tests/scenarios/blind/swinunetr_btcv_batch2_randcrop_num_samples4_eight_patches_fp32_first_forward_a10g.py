"""train_swinunetr_btcv.py -- a student's multi-organ CT segmentation training (BTCV, 13 organs + background)
with MONAI's SwinUNETR on a cloud A10G (24 GB), run with plain `LD_PRELOAD=liboomguard.so python train.py`.

The student merged two MONAI tutorials.  The transforms come from the BTCV tutorial:

    RandCropByPosNegLabeld(keys=["image", "label"], label_key="label", spatial_size=(96, 96, 96),
                           pos=1, neg=1, num_samples=4)       # FOUR 96^3 patches per CT volume
    ...
    train_loader = DataLoader(train_ds, batch_size=2, shuffle=True, num_workers=4,
                              collate_fn=list_data_collate)  # "a batch of 2 volumes"

    model = SwinUNETR(img_size=(96, 96, 96), in_channels=1, out_channels=14, feature_size=48,
                      use_checkpoint=False).cuda()            # the tutorial has use_checkpoint=True
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    for batch in train_loader:                                # AMP left off ("--noamp": NaNs once)
        logit_map = model(batch["image"].cuda())
        loss = DiceCELoss(to_onehot_y=True, softmax=True)(logit_map, batch["label"].cuda())
        loss.backward(); optimizer.step(); optimizer.zero_grad()

list_data_collate flattens the crops, so every step runs 2 volumes x 4 crops = EIGHT patches of 1 x 96^3,
not two.  In fp32 without activation checkpointing SwinUNETR (feature_size 48, 62 M parameters, 249 MB)
keeps about 7.2 GiB of activations per 96^3 patch: the Swin encoder ~2.5 GiB (stage 1 alone: 48^3 tokens in
343 windows of 7^3, 3 heads: 462 MiB of attention probabilities per block), the full-resolution conv blocks
encoder1 and decoder1 (48 channels x 96^3 x 4 B = 162 MiB per tensor, 8 to 11 of them each) ~3 GiB, the
rest ~1.7 GiB.  Eight patches want ~58 GiB; the card has 22.5 GiB.  The very first forward pass fails, in
encoder1 (the full-resolution residual block, right after the Swin encoder has taken ~20 GiB), before any
optimizer step.  Nothing leaks and nothing else is on the card.

What an expert says first: the real batch is 8 patches -- batch_size=1 and fewer crops, i.e. a smaller
batch (gradient accumulation if the effective batch matters); and/or turn on what the tutorial had: AMP
(bf16 autocast on this Ampere card, ~half the activations) and use_checkpoint=True (gradient checkpointing of
the Swin blocks).  Any one of the three is a right first line (in fp32, 1 volume x 2 crops = 2 patches, ~15 GiB,
fits; 1 x 4 crops fits with AMP and checkpointing, as the tutorial runs it).  Wrong: empty_cache /
expandable_segments (nothing is cached or fragmented: the need is 2.5 times the card),
inference_mode (it trains), stopping other processes (there are none), a bigger GPU first (cheap fixes exist).
"""
import sys

import torch
from torch import nn
from torch.autograd._graph import derive

import scen_truth

FP32 = 4


# --- the few tensor ops the model runs.  The stand-in torch computes nothing and its tensors have no shape:
# each op makes its output's memory (shape carried along as .shape) and saves its input as PyTorch's
# autograd does (out._saved), so the activations stay alive until backward, as in PyTorch.
def op(x, channels=None, spatial=None, scale=1.0):
    b, c, d, h, w = x.shape
    c = c if channels is None else channels
    if spatial is not None:
        d = h = w = spatial
    n = int(b * c * d * h * w * FP32 * scale)
    out = torch.empty(n, device="cuda")
    out.shape = (b, c, d, h, w)
    out._saved = x
    return derive(out, x)


def param(nparams):
    return nn.Parameter(torch.empty(nparams * FP32, device="cuda"))


class WindowAttention(nn.Module):
    """Window attention over 7^3 windows: q k^T, softmax (saved), @ v."""

    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.heads = heads
        self.qkv_weight = param(3 * dim * dim)
        self.proj_weight = param(dim * dim)

    def forward(self, x):
        b, c, d, h, w = x.shape
        padded = -(-d // 7) * 7                               # the token grid padded to whole windows
        windows = (padded // 7) ** 3
        qkv = op(x, channels=3 * c, spatial=padded)
        attn = torch.empty(b * windows * self.heads * 343 * 343 * FP32, device="cuda")   # softmax(q k^T + bias)
        attn.shape = (b, windows * self.heads, 343, 343, 1)
        attn._saved = qkv
        attn = derive(attn, qkv)
        out = op(x, channels=c, spatial=padded)
        out._saved = (attn, qkv)
        return op(out)                                        # proj


class SwinTransformerBlock(nn.Module):
    def __init__(self, dim, heads):
        nn.Module.__init__(self)
        self.attn = WindowAttention(dim, heads)
        self.fc1_weight = param(4 * dim * dim)
        self.fc2_weight = param(4 * dim * dim)

    def forward(self, x):
        shortcut = x
        x = op(x)                                             # norm1
        x = self.attn(x)
        x = op(x)                                             # + shortcut
        x._saved = (x._saved, shortcut)
        y = op(x)                                             # norm2
        y = op(y, channels=4 * x.shape[1])                    # fc1
        y = op(y)                                             # GELU
        return op(y, channels=x.shape[1])                     # fc2 (+ residual)


class BasicLayer(nn.Module):
    def __init__(self, dim, heads, depth=2):
        nn.Module.__init__(self)
        self.blocks = [SwinTransformerBlock(dim, heads) for _ in range(depth)]
        for i, blk in enumerate(self.blocks):
            setattr(self, "block%d" % i, blk)
        self.merge_weight = param(8 * dim * 2 * dim)

    def forward(self, x):
        for blk in self.blocks:
            x = blk(x)
        out = op(x)                                           # proj_out: the hidden state the decoder reads
        down = op(x, channels=2 * x.shape[1], spatial=x.shape[2] // 2)   # PatchMerging
        down = op(down)                                       # its LayerNorm
        return out, down


class SwinTransformer(nn.Module):
    def __init__(self, feature_size=48):
        nn.Module.__init__(self)
        self.patch_embed_weight = param(feature_size * 8)
        f = feature_size
        self.layers1 = BasicLayer(f, 3)
        self.layers2 = BasicLayer(2 * f, 6)
        self.layers3 = BasicLayer(4 * f, 12)
        self.layers4 = BasicLayer(8 * f, 24)

    def forward(self, x):
        x0 = op(x, channels=48, spatial=x.shape[2] // 2)      # patch embedding, stride 2: 48 x 48^3
        hs = [x0]
        x = x0
        for layer in (self.layers1, self.layers2, self.layers3, self.layers4):
            out, x = layer(x)
            hs.append(out)
        hs.append(x)
        return hs


class UnetrBasicBlock(nn.Module):
    """UnetResBlock: conv3 -> IN -> LReLU -> conv3 -> IN, 1x1 residual conv -> IN, add, LReLU."""

    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.conv1_weight = param(27 * cin * cout)
        self.conv2_weight = param(27 * cout * cout)
        self.conv3_weight = param(cin * cout)
        self.cout = cout

    def forward(self, x):
        y = op(x, channels=self.cout)                         # conv1
        y = op(y)                                             # norm1
        y = op(y)                                             # lrelu
        y = op(y)                                             # conv2
        y = op(y)                                             # norm2
        r = op(x, channels=self.cout)                         # conv3 (residual)
        r = op(r)                                             # norm3
        out = op(y)                                           # add + lrelu
        out._saved = (y, r)
        return out


class UnetrUpBlock(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.transp_weight = param(8 * cin * cout)
        self.conv_block = UnetrBasicBlock(2 * cout, cout)

    def forward(self, x, skip):
        up = op(x, channels=skip.shape[1], spatial=skip.shape[2])          # transposed conv, stride 2
        cat = op(up, channels=2 * skip.shape[1])                            # torch.cat((up, skip), dim=1)
        cat._saved = (up, skip)
        return self.conv_block(cat)


class SwinUNETR(nn.Module):
    def __init__(self, in_channels=1, out_channels=14, feature_size=48, use_checkpoint=False):
        nn.Module.__init__(self)
        f = feature_size
        self.use_checkpoint = use_checkpoint
        self.swinViT = SwinTransformer(f)
        self.encoder1 = UnetrBasicBlock(in_channels, f)
        self.encoder2 = UnetrBasicBlock(f, f)
        self.encoder3 = UnetrBasicBlock(2 * f, 2 * f)
        self.encoder4 = UnetrBasicBlock(4 * f, 4 * f)
        self.encoder10 = UnetrBasicBlock(16 * f, 16 * f)
        self.decoder5 = UnetrUpBlock(16 * f, 8 * f)
        self.decoder4 = UnetrUpBlock(8 * f, 4 * f)
        self.decoder3 = UnetrUpBlock(4 * f, 2 * f)
        self.decoder2 = UnetrUpBlock(2 * f, f)
        self.decoder1 = UnetrUpBlock(f, f)
        self.out_weight = param(f * out_channels)
        self.out_channels = out_channels

    def forward(self, x_in):
        hidden_states_out = self.swinViT(x_in)
        enc0 = self.encoder1(x_in)                            # full resolution, 48 channels: 162 MiB a tensor a patch
        enc1 = self.encoder2(hidden_states_out[0])
        enc2 = self.encoder3(hidden_states_out[1])
        enc3 = self.encoder4(hidden_states_out[2])
        dec4 = self.encoder10(hidden_states_out[4])
        dec3 = self.decoder5(dec4, hidden_states_out[3])
        dec2 = self.decoder4(dec3, enc3)
        dec1 = self.decoder3(dec2, enc2)
        dec0 = self.decoder2(dec1, enc1)
        out = self.decoder1(dec0, enc0)
        return op(out, channels=self.out_channels)


def dice_ce_loss(logits, label):
    probs = op(logits)                                        # softmax
    onehot = op(logits)                                       # one_hot(label)
    inter = op(probs)                                         # probs * onehot
    ce = op(logits)                                           # log_softmax for the CE term
    loss = torch.empty(512, device="cuda")
    loss._saved = (probs, onehot, inter, ce, label)
    return derive(loss, probs, ce)


def list_data_collate(volumes, num_samples):
    """MONAI's list_data_collate: every volume's num_samples crops become rows of one batch."""
    n = len(volumes) * num_samples
    image = torch.empty(n * 96 ** 3 * FP32, device="cuda")
    image.shape = (n, 1, 96, 96, 96)
    label = torch.empty(n * 96 ** 3, device="cuda")       # uint8 labels
    label.shape = (n, 1, 96, 96, 96)
    return {"image": image, "label": label}


def main():
    batch_size = 2          # DataLoader(batch_size=2): "two volumes a step"
    num_samples = 4         # RandCropByPosNegLabeld(num_samples=4), from the BTCV tutorial
    scen_truth.note_every_empty(torch)
    model = SwinUNETR(in_channels=1, out_channels=14, feature_size=48, use_checkpoint=False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    train_files = ["img%04d.nii.gz" % i for i in range(1, 25)]
    for epoch in range(600):
        for i in range(0, len(train_files), batch_size):
            batch = list_data_collate(train_files[i:i + batch_size], num_samples)   # 8 x 1 x 96^3
            try:
                logit_map = model(batch["image"])
                loss = dice_ce_loss(logit_map, batch["label"])
                scen_truth.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            except torch.OutOfMemoryError:
                scen_truth.torch_oom_mark()
                raise
            del logit_map, loss, batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
