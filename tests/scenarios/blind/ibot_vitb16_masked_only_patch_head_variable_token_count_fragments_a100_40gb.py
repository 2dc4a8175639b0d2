"""main_ibot.py -- bytedance/ibot, ViT-B/16 pretraining (2 global crops at 224, 10 local crops at 96, shared head,
out_dim 8192 / patch_out_dim 8192, fp16) on 1.4M histopathology tiles, one rank per A100-SXM4-40GB (39.59 GiB):

    python -m torch.distributed.launch --nproc_per_node=8 main_ibot.py --arch vit_base --patch_size 16 \
        --batch_size_per_gpu 112 --local_crops_number 10 --out_dim 8192 --patch_out_dim 8192 --shared_head true \
        --pred_ratio 0.3 --pred_ratio_var 0.2 --use_fp16 true --data_path /data/tcga_tiles

iBOT's loss computes the patch logits of every token of both global crops, [2 x B, 196, 8192], and masks the
loss afterwards.  To save that memory, the team's fork (following DINOv2's idea) runs the patch head and the
patch loss on the masked tokens only:

        masks_flat = torch.cat([m.flatten(1) for m in masks[:2]])           # [2B, 196] bool
        student_patch = student_patch_tokens[masks_flat]                   # [n_masked, 768]
        teacher_patch = teacher_patch_tokens[masks_flat]
        ... head(student_patch) -> [n_masked, 8192]; log_softmax; softmax of the teacher's; products

That saved about 3.5 GB, and the team spent it on a larger batch: 96 -> 112 per GPU, 37.3 GiB at the peak on a
card that leaves the process 39.1 GiB.  But n_masked is different at every step: iBOT draws a prediction ratio
per image (0.3 +- 0.2, block-wise masks), so 224 images give 12,000 to 14,300 masked tokens, and with them the
[n_masked, 8192] tensors of the head and the loss (190-470 MB each) change size every step.  DINOv2 pads them
to a fixed upper bound for exactly this reason; the fork does not.  PyTorch's caching allocator keeps the
blocks of earlier steps and splits them for the smaller requests; at step 37 the product -t * log_softmax of
one crop (211 MiB) finds no free block large enough and only 208 MiB free on the device, with 1.9 GB cached
in smaller pieces ("1911.17 MiB is reserved by PyTorch but unallocated").  The step itself needs less than
the earlier steps did: the crash comes at a seemingly random step, never the first.

An expert: fragmentation: the request is smaller than what PyTorch holds cached and unused, but no single free
block fits.  Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (PyTorch 2.1+; the run is on 2.1.2) so
segments grow in place instead of stranding blocks of every size; or make the shapes static again by padding
the masked-token tensors to a fixed upper bound (DINOv2's `upperbound`).
Wrong first advice: a smaller batch or fewer local crops (the step fits: it ran dozens of steps; it changes
the recipe), gradient checkpointing, mixed precision (already fp16), empty_cache (the allocator already
returned every wholly free segment before failing; calling it each step costs time and leaves the split
ones), a bigger GPU, an 8-bit optimizer, stopping other processes (there are none), inference_mode.
"""
import argparse
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

F16 = torch.float16
F32 = torch.float32


# ---- stand-in gap, named as the real API: what Tensor.backward does in PyTorch after the gradients are made
# (retain_graph=False: the graph's saved tensors are freed).  Compiled into torch's file.
_GAPS = """
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


_plain_backward = Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        _free_saved(self)
"""
_ns = vars(torch)
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["_backward"]
# ----


def _param(numel):
    return nn.Parameter(torch.empty(numel, dtype=F32, device="cuda"))


def _act(numel, dtype, saved, record=True):
    """An activation; saved for backward (kept alive by its output) only when autograd records the op (the
    teacher's parameters do not require grad: its intermediates go as soon as they are used)."""
    t = torch.empty(int(numel), dtype=dtype, device="cuda")
    ins = [s for s in (saved if isinstance(saved, tuple) else (saved,)) if s is not None]
    if record and torch.is_grad_enabled():
        t._saved = saved
    return torch._derive(t, *ins)


class Block(nn.Module):
    """models.vision_transformer.Block(dim=768, num_heads=12, mlp_ratio=4, qkv_bias=True)."""

    def __init__(self, dim, num_heads, mlp_ratio=4):
        nn.Module.__init__(self)
        self.norm1 = _param(2 * dim)
        self.qkv = _param(3 * dim * dim + 3 * dim)
        self.proj = _param(dim * dim + dim)
        self.norm2 = _param(2 * dim)
        self.fc1 = _param(dim * dim * mlp_ratio + dim * mlp_ratio)
        self.fc2 = _param(dim * mlp_ratio * dim + dim)
        self.dim, self.heads, self.hidden = dim, num_heads, dim * mlp_ratio

    def forward(self, x, b, n):
        r = self.qkv.requires_grad
        d, h = self.dim, self.heads
        ln1 = _act(b * n * d, F16, x, r)
        qkv = _act(b * n * 3 * d, F16, ln1, r)
        scores = _act(b * h * n * n, F16, qkv, r)
        attn = _act(b * h * n * n, F16, scores, r)
        ctx = _act(b * n * d, F16, (attn, qkv), r)
        x1 = _act(b * n * d, F32, (ctx, x), r)
        ln2 = _act(b * n * d, F16, x1, r)
        fc1 = _act(b * n * self.hidden, F16, ln2, r)
        act = _act(b * n * self.hidden, F16, fc1, r)
        return _act(b * n * d, F32, (act, x1), r)


class VisionTransformer(nn.Module):
    """models.vit_base(patch_size=16, return_all_tokens=True, masked_im_modeling=...): 86M parameters."""

    def __init__(self, patch_size=16, embed_dim=768, depth=12, num_heads=12, masked_im_modeling=False):
        nn.Module.__init__(self)
        self.patch_embed = _param(3 * patch_size * patch_size * embed_dim + embed_dim)
        self.cls_token = _param(embed_dim)
        self.pos_embed = _param(197 * embed_dim)
        self.masked_embed = _param(embed_dim)
        self.blocks = nn.Module()
        for i in range(depth):
            setattr(self.blocks, str(i), Block(embed_dim, num_heads))
        self.norm = _param(2 * embed_dim)
        self.patch_size, self.embed_dim, self.depth = patch_size, embed_dim, depth
        self.masked_im_modeling = masked_im_modeling

    def forward(self, x, mask=None):
        b, res = x._crops, x._res
        n = (res // self.patch_size) ** 2 + 1
        r = self.cls_token.requires_grad
        h = _act(b * n * self.embed_dim, F32, x, r)      # prepare_tokens (+ mask_model: masked_embed where mask)
        for i in range(self.depth):
            h = getattr(self.blocks, str(i))(h, b, n)
        out = _act(b * n * self.embed_dim, F32, h, r)    # norm: all tokens [b, n, 768]
        out._crops, out._tokens = b, n
        return out


class iBOTHead(nn.Module):
    """iBOTHead(768, 8192, patch_out_dim=8192, shared_head=True): MLP 768-2048-2048-256, weight-normed 256 ->
    8192 for [CLS] and patch tokens alike."""

    def __init__(self, in_dim, out_dim, hidden_dim=2048, bottleneck_dim=256):
        nn.Module.__init__(self)
        self.mlp = _param(in_dim * hidden_dim + hidden_dim + hidden_dim * hidden_dim + hidden_dim
                          + hidden_dim * bottleneck_dim + bottleneck_dim)
        self.last_layer_g = _param(out_dim)
        self.last_layer_v = _param(bottleneck_dim * out_dim)
        self.hidden, self.bottleneck, self.out_dim = hidden_dim, bottleneck_dim, out_dim

    def forward(self, x, rows):
        r = self.mlp.requires_grad
        h = _act(rows * self.hidden, F16, x, r)
        h = _act(rows * self.hidden, F16, h, r)
        h = _act(rows * self.bottleneck, F32, h, r)
        return _act(rows * self.out_dim, F16, h, r)


class MultiCropWrapper(nn.Module):
    """utils.MultiCropWrapper as the fork has it: the backbone per resolution group, the head on the [CLS]
    tokens, and on the masked patch tokens only (`masks_flat` selects them)."""

    def __init__(self, backbone, head):
        nn.Module.__init__(self)
        self.backbone = backbone
        self.head = head

    def forward(self, x, mask=None, n_masked=0):
        batch = _cat(x)
        out = self.backbone(batch, mask=mask)
        del batch
        rows = out._crops
        cls = _act(rows * self.backbone.embed_dim, F16, out)            # out[:, 0]
        cls_out = self.head(cls, rows)
        if n_masked == 0:
            return cls_out, None
        patch = _act(n_masked * self.backbone.embed_dim, F16, out)      # out[:, 1:][masks_flat]
        patch_out = self.head(patch, n_masked)
        return cls_out, patch_out


def _cat(tensors):
    """torch.cat(tensors): a new tensor of their total size."""
    out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
    out._crops = sum(t._crops for t in tensors)
    out._res = tensors[0]._res
    return out


class iBOTLoss(nn.Module):
    def __init__(self, out_dim, patch_out_dim, ngcrops, nlcrops):
        nn.Module.__init__(self)
        self.ngcrops, self.ncrops = ngcrops, ngcrops + nlcrops
        self.out_dim, self.patch_out_dim = out_dim, patch_out_dim
        self.register_buffer("center", torch.empty(out_dim * 4, device="cuda"))
        self.register_buffer("center2", torch.empty(patch_out_dim * 4, device="cuda"))

    def forward(self, student_output, teacher_output, student_local_cls, n_masked_per_crop, B):
        student_cls, student_patch = student_output
        teacher_cls, teacher_patch = teacher_output
        n_all = sum(n_masked_per_crop)
        student_cls = _act(self.ncrops * B * self.out_dim, F16, (student_cls, student_local_cls))  # cat, / temp
        student_patch = _act(n_all * self.patch_out_dim, F16, student_patch)           # / student_temp
        teacher_cls_c = _act(self.ngcrops * B * self.out_dim, F32, None)               # softmax, detach
        teacher_patch_c = _act(n_all * self.patch_out_dim, F32, None)                  # softmax, detach
        total_loss1 = total_loss2 = None
        for q in range(self.ngcrops):
            for v in range(self.ncrops):
                if v == q:
                    n = n_masked_per_crop[v]
                    lsm = _act(n * self.patch_out_dim, F32, student_patch)                    # log_softmax
                    prod = _act(n * self.patch_out_dim, F32, (teacher_patch_c, lsm))         # -t * lsm
                    loss2 = _act(n, F32, prod)
                    total_loss2 = loss2 if total_loss2 is None else _act(128, F32, (total_loss2, loss2))
                else:
                    lsm = _act(B * self.out_dim, F32, student_cls)
                    prod = _act(B * self.out_dim, F32, (teacher_cls_c, lsm))
                    loss1 = _act(B, F32, prod)
                    total_loss1 = loss1 if total_loss1 is None else _act(128, F32, (total_loss1, loss1))
                del lsm, prod
        self.update_center(teacher_cls, teacher_patch, n_all)
        return _act(128, F32, (total_loss1, total_loss2))

    def update_center(self, teacher_cls, teacher_patch, n_all):
        with torch.no_grad():
            self.center = torch.empty(self.out_dim * 4, device="cuda")
            self.center2 = torch.empty(self.patch_out_dim * 4, device="cuda")


def _block_mask_counts(rng, images, patches=196, pred_ratio=0.3, pred_ratio_var=0.2):
    """ImageFolderMask: per image a prediction ratio U(0.1, 0.5), block-wise masking of that many patches."""
    return [int(patches * rng.uniform(pred_ratio - pred_ratio_var, pred_ratio + pred_ratio_var))
            for _ in range(images)]


def data_loader(batch, local_crops, steps, seed=0):
    rng = random.Random(seed)
    for _ in range(steps):
        counts = _block_mask_counts(rng, 2 * batch)
        yield [sum(counts[:batch]), sum(counts[batch:])]


def _crops_to_cuda(batch, local_crops_number, global_res=224, local_res=96):
    out = []
    for i in range(2 + local_crops_number):
        res = global_res if i < 2 else local_res
        t = torch.empty(batch * 3 * res * res * 4, device="cuda")
        t._crops, t._res = batch, res
        out.append(t)
    return out


def train_one_epoch(student, teacher, ibot_loss, loader, optimizer, fp16_scaler, args):
    B = args.batch_size_per_gpu
    for it, n_masked in enumerate(loader):
        images = _crops_to_cuda(B, args.local_crops_number)
        masks = [torch.empty(B * 196, device="cuda") for _ in range(2)]        # bool [B, 14, 14] per global crop
        with torch.cuda.amp.autocast(fp16_scaler is not None):
            # get global views
            teacher_output = teacher(images[:2], n_masked=sum(n_masked))
            student_output = student(images[:2], mask=masks[:2], n_masked=sum(n_masked))
            # get local views
            student.module.backbone.masked_im_modeling = False
            student_local_cls = student(images[2:])[0]
            student.module.backbone.masked_im_modeling = True
            loss = ibot_loss(student_output, teacher_output, student_local_cls, n_masked, B)
        optimizer.zero_grad()
        fp16_scaler.scale(loss).backward()
        fp16_scaler.unscale_(optimizer)
        fp16_scaler.step(optimizer)
        fp16_scaler.update()
        # EMA update for the teacher: param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        with torch.no_grad():
            for p in list(student.module.parameters())[:0]:
                pass
        del teacher_output, student_output, student_local_cls, loss, images, masks
        if it % 5 == 0:
            print("Epoch: [0/100]  [%3d/1563]  n_masked %5d  reserved %.2f GiB  max allocated %.2f GiB" % (
                it, sum(n_masked), torch.cuda.memory_reserved() / 2 ** 30, torch.cuda.max_memory_allocated() / 2 ** 30))


def main():
    parser = argparse.ArgumentParser("iBOT")
    parser.add_argument("--arch", default="vit_base")
    parser.add_argument("--batch_size_per_gpu", default=112, type=int)
    parser.add_argument("--local_crops_number", default=10, type=int)
    parser.add_argument("--out_dim", default=8192, type=int)
    parser.add_argument("--patch_out_dim", default=8192, type=int)
    parser.add_argument("--steps", default=1563, type=int)    # one epoch of 1.4M tiles
    args = parser.parse_args()
    torch.cuda.set_device(0)     # LOCAL_RANK 0 of 8; the other ranks have GPUs of their own

    student = MultiCropWrapper(VisionTransformer(masked_im_modeling=True), iBOTHead(768, args.out_dim))
    teacher = MultiCropWrapper(VisionTransformer(), iBOTHead(768, args.out_dim))
    student = nn.parallel.DistributedDataParallel(student, device_ids=[0])
    for p in teacher.parameters():
        p.requires_grad = False
    print("Student and Teacher are built: they are both vit_base network.")
    ibot_loss = iBOTLoss(args.out_dim, args.patch_out_dim, 2, args.local_crops_number)
    optimizer = torch.optim.AdamW([p for p in student.module.parameters() if p.requires_grad])
    fp16_scaler = torch.cuda.amp.GradScaler()
    train_one_epoch(student, teacher, ibot_loss,
                    data_loader(args.batch_size_per_gpu, args.local_crops_number, args.steps),
                    optimizer, fp16_scaler, args)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
