"""main_pretrain.py -- facebookresearch/mae, ViT-B/16 MAE pretraining on a single RTX 3090 (24 GB; 23.69 GiB as
PyTorch reports it) for a domain-adaptation project (1.1M unlabeled satellite tiles):

    python main_pretrain.py --model mae_vit_base_patch16 --batch_size 128 --accum_iter 1 \\
        --mask_ratio 0.75 --norm_pix_loss --blr 1.5e-4 --weight_decay 0.05 --epochs 400 \\
        --data_path /data/tiles --output_dir runs/mae_b16_tiles

The runs had been fine for weeks: 9.6 GiB reserved at the peak (AMP, 49 visible tokens per image in the
encoder, the 8-block 512-wide decoder on all 197).  Then the student adds a reconstruction preview for wandb: at the end of
each epoch, a grid of 8 images, their masked versions and the reconstructions.  In engine_pretrain.py's
train_one_epoch:

        with torch.cuda.amp.autocast():
            loss, pred, mask = model(samples, mask_ratio=args.mask_ratio)
        ...
        loss_scaler(loss, optimizer, parameters=model.parameters(), update_grad=(data_iter_step + 1) % accum_iter == 0)
        ...
        # keep a few samples for the epoch-end reconstruction grid
        preview.append((samples[:8], pred[:8], mask[:8]))

`samples[:8]` and `pred[:8]` are views: each keeps the whole batch alive (the float32 input batch, 77 MB, and
the float16 predictions [128, 196, 768], 38.5 MB), every step.  The student meant "keep 8 images once" and
wrote "keep the whole batch, every step": +116 MB per iteration, and the run dies about a hundred steps into
the first epoch (of 8,628), when a backward pass makes the gradients again -- not at the first step, and not
with a new batch size.

An expert: memory rises by a batch's worth every step and is held by a Python list (`preview`), not by the
model, the optimizer or the activations.  Keep only what the grid needs, off the GPU and out of the graph, once:
`if data_iter_step == 0: preview = (samples[:8].detach().cpu(), pred[:8].detach().float().cpu(), mask[:8].cpu())`
(a slice is a view of the whole storage; `.clone()` or `.cpu()` copies only the 8 rows).
Wrong first advice: a smaller batch or gradient checkpointing (the step itself fits with 13 GB to spare: they
only delay the failure by some dozens of steps), mixed precision (already under autocast), expandable_segments
/ empty_cache (nothing is fragmented or cached: live tensors fill the card), an 8-bit optimizer, flash
attention, a bigger GPU (a 48 GB card dies a few hundred steps later), inference_mode (this is training).
"""
import argparse
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: Tensor.__getitem__ for a leading-dimension slice (a view: same
# storage, fewer rows), Tensor.__itruediv__, and what Tensor.backward does in PyTorch after the gradients are made (retain_graph=False:
# the graph's saved tensors are freed; the outputs themselves stay while referenced).  Compiled into torch's
# file so the failing Python line stays the program's.
_GAPS = """
def _getitem(self, idx):
    rows = getattr(self, "_rows", None)
    if not isinstance(idx, slice) or not rows:
        raise NotImplementedError("stand-in: only t[a:b] on the leading dimension")
    k = len(range(*idx.indices(rows)))
    v = self.view()
    v.nbytes = self.nbytes * k // rows
    v._rows = k
    return v


def _free_saved(root):
    todo, seen = [root], set()
    while todo:
        t = todo.pop()
        if id(t) in seen or not isinstance(t, Tensor):
            continue
        seen.add(id(t))
        s = t.__dict__.get("_saved")
        if isinstance(s, (tuple, list)):
            todo.extend(s)
        elif s is not None:
            todo.append(s)
        if "_saved" in t.__dict__:
            t._saved = None
        if t._base is not None:
            todo.append(t._base)


def _itruediv(self, other):
    return self          # loss /= accum_iter: in place, no new memory


_plain_backward = Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        _free_saved(self)
        for t in getattr(self, "_pass_outputs", ()):
            _free_saved(t)
"""
_ns = vars(torch)
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.__getitem__ = _ns["_getitem"]
torch.Tensor.backward = _ns["_backward"]
torch.Tensor.__itruediv__ = _ns["_itruediv"]
# ----

MiB = 1 << 20
F16 = torch.float16
F32 = torch.float32


def _param(numel, requires_grad=True):
    return nn.Parameter(torch.empty(numel, dtype=F32, device="cuda"), requires_grad)


def _act(numel, dtype, saved, rows):
    """An activation of this forward (autocast: float16 out of a Linear, float32 out of a LayerNorm or a residual
    add), in the graph of what it was computed from (saved for backward)."""
    t = torch.empty(numel, dtype=dtype, device="cuda")
    t._saved = saved
    t._rows = rows
    return torch._derive(t, *[s for s in (saved if isinstance(saved, tuple) else (saved,)) if s is not None])


class Block(nn.Module):
    """timm.models.vision_transformer.Block(dim, num_heads, mlp_ratio=4, qkv_bias=True, norm_layer=LayerNorm).
    (The stand-in keeps a block's weights in two tensors, attention and MLP, and its saved activations in five:
    the same bytes as PyTorch's, in fewer pieces.)"""

    def __init__(self, dim, num_heads, mlp_ratio=4.0):
        nn.Module.__init__(self)
        hidden = int(dim * mlp_ratio)
        self.attn = _param(2 * dim + 3 * dim * dim + 3 * dim + dim * dim + dim)      # norm1, qkv, proj
        self.mlp = _param(2 * dim + dim * hidden + hidden + hidden * dim + dim)      # norm2, fc1, fc2
        self.dim, self.heads, self.hidden = dim, num_heads, hidden

    def forward(self, x, b, n):
        d, h = self.dim, self.heads
        qkv = _act(b * n * 4 * d, F16, x, b)                    # norm1 output cast for the Linear, qkv
        attn = _act(b * h * n * n * 2, F16, qkv, b)             # q @ k^T * scale, softmax
        x1 = _act(b * n * 4 * d, F16, (attn, qkv, x), b)        # attn @ v, x + proj(...) (float32), norm2 cast
        hid = _act(b * n * 2 * self.hidden, F16, x1, b)         # fc1, GELU
        return _act(b * n * d, F32, (hid, x1), b)               # x + fc2(...)


class MaskedAutoencoderViT(nn.Module):
    """models_mae.mae_vit_base_patch16_dec512d8b: ViT-B/16 encoder (768, 12 blocks, 12 heads), decoder 512 wide,
    8 blocks, 16 heads; 111.9M parameters; fixed sin-cos position embeddings."""

    def __init__(self, img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12, decoder_embed_dim=512,
                 decoder_depth=8, decoder_num_heads=16, norm_pix_loss=False):
        nn.Module.__init__(self)
        self.num_patches = (img_size // patch_size) ** 2
        self.patch_dim = patch_size * patch_size * 3
        self.img_size = img_size
        self.patch_embed = _param(self.patch_dim * embed_dim + embed_dim)
        self.cls_token = _param(embed_dim)
        self.pos_embed = _param((self.num_patches + 1) * embed_dim, requires_grad=False)
        self.blocks = nn.Module()
        for i in range(depth):
            setattr(self.blocks, str(i), Block(embed_dim, num_heads))
        self.norm = _param(2 * embed_dim)
        self.decoder_embed = _param(embed_dim * decoder_embed_dim + decoder_embed_dim)
        self.mask_token = _param(decoder_embed_dim)
        self.decoder_pos_embed = _param((self.num_patches + 1) * decoder_embed_dim, requires_grad=False)
        self.decoder_blocks = nn.Module()
        for i in range(decoder_depth):
            setattr(self.decoder_blocks, str(i), Block(decoder_embed_dim, decoder_num_heads))
        self.decoder_norm = _param(2 * decoder_embed_dim)
        self.decoder_pred = _param(decoder_embed_dim * self.patch_dim + self.patch_dim)
        self.embed_dim, self.dec_dim = embed_dim, decoder_embed_dim
        self.depth, self.decoder_depth = depth, decoder_depth
        self.norm_pix_loss = norm_pix_loss

    def forward_encoder(self, imgs, b, mask_ratio):
        L, D = self.num_patches, self.embed_dim
        x = _act(b * L * D, F16, imgs, b)                        # patch_embed (conv 16x16/16)
        x = _act(b * L * D, F32, x, b)                           # + pos_embed
        len_keep = int(L * (1 - mask_ratio))
        noise = _act(b * L, F32, None, b)                        # torch.rand(N, L)
        ids_restore = _act(b * L * 8, torch.uint8, None, b)      # argsort(argsort(noise)), int64
        x = _act(b * len_keep * D, F32, x, b)                    # gather of the kept tokens
        mask = _act(b * L, F32, None, b)
        x = _act(b * (len_keep + 1) * D, F32, x, b)              # cat cls token
        for i in range(self.depth):
            x = getattr(self.blocks, str(i))(x, b, len_keep + 1)
        x = _act(b * (len_keep + 1) * D, F32, x, b)              # norm
        return x, mask, ids_restore, len_keep

    def forward_decoder(self, x, ids_restore, b, len_keep):
        L, D = self.num_patches, self.dec_dim
        x = _act(b * (len_keep + 1) * D, F16, x, b)              # decoder_embed
        x = _act(b * (L + 1) * D, F32, (x, ids_restore), b)       # append mask tokens, unshuffle, + pos
        for i in range(self.decoder_depth):
            x = getattr(self.decoder_blocks, str(i))(x, b, L + 1)
        x = _act(b * (L + 1) * D, F32, x, b)                     # decoder_norm
        x = _act(b * (L + 1) * self.patch_dim, F16, x, b)        # decoder_pred
        pred = x.view()                                          # x[:, 1:, :] (remove cls token): a view
        pred.nbytes = b * L * self.patch_dim * 2
        pred._rows = b
        return pred

    def forward_loss(self, imgs, pred, mask, b):
        L = self.num_patches
        target = _act(b * L * self.patch_dim, F32, imgs, b)      # patchify (norm_pix_loss: per-patch mean/var)
        diff = _act(b * L * self.patch_dim, F32, (pred, target), b)    # (pred - target) ** 2
        loss = _act(b * L, F32, diff, b)                         # .mean(dim=-1)
        loss = _act(128, F32, (loss, mask), 1)                   # (loss * mask).sum() / mask.sum()
        return loss

    def forward(self, imgs, mask_ratio=0.75):
        b = imgs._rows
        latent, mask, ids_restore, len_keep = self.forward_encoder(imgs, b, mask_ratio)
        pred = self.forward_decoder(latent, ids_restore, b, len_keep)   # [N, L, p*p*3]
        loss = self.forward_loss(imgs, pred, mask, b)
        loss._pass_outputs = (pred, mask)
        return loss, pred, mask


class NativeScalerWithGradNormCount(object):
    """util.misc.NativeScalerWithGradNormCount: GradScaler, backward, unscale, clip, step."""
    state_dict_key = "amp_scaler"

    def __init__(self):
        self._scaler = torch.cuda.amp.GradScaler()

    def __call__(self, loss, optimizer, clip_grad=None, parameters=None, create_graph=False, update_grad=True):
        self._scaler.scale(loss).backward(create_graph=create_graph)
        if update_grad:
            self._scaler.unscale_(optimizer)
            self._scaler.step(optimizer)
            self._scaler.update()


class TileDataLoader(object):
    """DataLoader over ImageFolder(/data/tiles, RandomResizedCrop(224, scale=(0.2, 1.0)), flip, normalize):
    1,104,384 tiles; batch 128, pinned."""

    def __init__(self, batch_size, num_tiles=1_104_384):
        self.batch_size, self.n = batch_size, num_tiles

    def __len__(self):
        return self.n // self.batch_size

    def __iter__(self):
        for _ in range(len(self)):
            yield "host batch", None


def _to_device(batch_size, img=224):
    """samples.to(device, non_blocking=True): float32 [128, 3, 224, 224]."""
    t = torch.empty(batch_size * 3 * img * img, dtype=F32, device="cuda")
    t._rows = batch_size
    return t


def train_one_epoch(model, data_loader, optimizer, device, epoch, loss_scaler, log_writer=None, args=None):
    model.train(True)
    accum_iter = args.accum_iter
    optimizer.zero_grad()
    preview = []   # (samples, pred, mask) for the epoch-end reconstruction grid
    for data_iter_step, (samples, _) in enumerate(data_loader):
        # we use a per iteration (instead of per epoch) lr scheduler
        samples = _to_device(args.batch_size)

        with torch.cuda.amp.autocast():
            loss, pred, mask = model(samples, mask_ratio=args.mask_ratio)

        loss /= accum_iter
        loss_scaler(loss, optimizer, parameters=model.parameters(),
                    update_grad=(data_iter_step + 1) % accum_iter == 0)
        if (data_iter_step + 1) % accum_iter == 0:
            optimizer.zero_grad()

        # keep a few samples for the epoch-end reconstruction grid
        preview.append((samples[:8], pred[:8], mask[:8]))

        if data_iter_step % 20 == 0:
            print("Epoch: [%d]  [%4d/%d]  reserved %.2f GiB" % (
                epoch, data_iter_step, len(data_loader), torch.cuda.memory_reserved() / 2 ** 30))
    return preview


def main():
    parser = argparse.ArgumentParser("MAE pre-training")
    parser.add_argument("--batch_size", default=128, type=int)
    parser.add_argument("--epochs", default=400, type=int)
    parser.add_argument("--accum_iter", default=1, type=int)
    parser.add_argument("--model", default="mae_vit_base_patch16")
    parser.add_argument("--mask_ratio", default=0.75, type=float)
    parser.add_argument("--norm_pix_loss", action="store_true", default=True)
    parser.add_argument("--weight_decay", type=float, default=0.05)
    parser.add_argument("--blr", type=float, default=1.5e-4)
    args = parser.parse_args()
    eff_batch_size = args.batch_size * args.accum_iter
    lr = args.blr * eff_batch_size / 256

    model = MaskedAutoencoderViT(norm_pix_loss=args.norm_pix_loss)
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("Model = %s (%.1fM parameters); effective batch size %d; lr %.2e" % (args.model, n_params / 1e6,
                                                                             eff_batch_size, lr))
    # param_groups = optim_factory.add_weight_decay(model_without_ddp, args.weight_decay): decay / no_decay groups
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, betas=(0.9, 0.95))
    loss_scaler = NativeScalerWithGradNormCount()
    data_loader_train = TileDataLoader(args.batch_size)
    for epoch in range(args.epochs):
        train_one_epoch(model, data_loader_train, optimizer, "cuda", epoch, loss_scaler, args=args)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
