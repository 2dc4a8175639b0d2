"""main_dino.py -- facebookresearch/dino, ViT-S/16 on a workstation with one RTX 4090 (24 GB; 23.99 GiB here),
pretraining on 410k unlabeled microscopy crops:

    python main_dino.py --arch vit_small --patch_size 16 --batch_size_per_gpu 96 --use_fp16 true \\
        --local_crops_number 8 --out_dim 65536 --epochs 300 --data_path /data/cells/train \\
        --output_dir runs/dino_s16_cells

The same command ran last week for two days (16.3 GB at its peak: two networks of 44M parameters, AdamW, DDP's
buckets, the activations of 2 x 96 global crops at 224 and 8 x 96 local crops at 96).  This morning the
researcher deduplicated the data set from a Jupyter notebook: open_clip ViT-L-14 (openai) embedding the 410k
crops at batch 512, then a cosine-similarity search.  The notebook's kernel is still running in a browser tab
on the same machine; it keeps its 1.7 GB model and PyTorch's cache of the embedding pass: 8.6 GiB in
nvidia-smi.  Restarting the DINO run (same command, same code), it fails in the first iteration, in the DINO
loss (the log-softmax products of the 18 teacher/student crop pairs, after both forward passes), with "Tried to
allocate 24.00 MiB ... of which 14.00 MiB is free", holding 15 GB itself.

An expert: nothing about DINO changed; 8.6 GiB of the card belong to another process (the notebook's kernel,
`nvidia-smi` lists its pid).  Shut that kernel down (or `del` its model and `torch.cuda.empty_cache()` in the
notebook) and the unchanged run fits with about 7 GB to spare.  If the notebook must stay, it is the notebook's
cache to limit, not DINO to shrink.
Wrong first advice: a smaller batch_size_per_gpu or fewer local crops (they change the recipe: the run fitted
as it was), mixed precision (already --use_fp16 true), gradient checkpointing, expandable_segments /
empty_cache in the DINO process (its own cache is empty: it is its first iteration), an 8-bit optimizer, a
bigger GPU, inference_mode (training).
"""
import argparse
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
    """An activation; saved for backward (kept alive by its output) only when autograd records this op: as in
    PyTorch, the frozen teacher's forward saves nothing and its intermediates go as soon as they are used."""
    t = torch.empty(numel, dtype=dtype, device="cuda")
    ins = [s for s in (saved if isinstance(saved, tuple) else (saved,)) if s is not None]
    if record and torch.is_grad_enabled():
        t._saved = saved
    return torch._derive(t, *ins)


class Block(nn.Module):
    """vision_transformer.Block(dim=384, num_heads=6, mlp_ratio=4, qkv_bias=True)."""

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
    """vision_transformer.vit_small(patch_size=16, drop_path_rate=0.1): 12 blocks, width 384; 21.7M parameters."""

    def __init__(self, patch_size=16, embed_dim=384, depth=12, num_heads=6):
        nn.Module.__init__(self)
        self.patch_embed = _param(3 * patch_size * patch_size * embed_dim + embed_dim)
        self.cls_token = _param(embed_dim)
        self.pos_embed = _param(197 * embed_dim)
        self.blocks = nn.Module()
        for i in range(depth):
            setattr(self.blocks, str(i), Block(embed_dim, num_heads))
        self.norm = _param(2 * embed_dim)
        self.patch_size, self.embed_dim, self.depth = patch_size, embed_dim, depth

    def forward(self, x):
        b, res = x._crops, x._res
        n = (res // self.patch_size) ** 2 + 1
        r = self.cls_token.requires_grad
        h = _act(b * n * self.embed_dim, F32, x, r)            # prepare_tokens: patch_embed, cls, interpolated pos
        for i in range(self.depth):
            h = getattr(self.blocks, str(i))(h, b, n)
        out = _act(b * self.embed_dim, F32, h, r)              # norm(x)[:, 0]
        out._crops = b
        return out


class DINOHead(nn.Module):
    """DINOHead(384, 65536, use_bn=False, norm_last_layer=True): MLP 384-2048-2048-256, then the weight-normed
    last layer 256 -> 65536."""

    def __init__(self, in_dim, out_dim, hidden_dim=2048, bottleneck_dim=256):
        nn.Module.__init__(self)
        self.mlp = _param(in_dim * hidden_dim + hidden_dim + hidden_dim * hidden_dim + hidden_dim
                          + hidden_dim * bottleneck_dim + bottleneck_dim)
        self.last_layer_g = _param(out_dim)
        self.last_layer_v = _param(bottleneck_dim * out_dim)
        self.hidden, self.bottleneck, self.out_dim = hidden_dim, bottleneck_dim, out_dim

    def forward(self, x):
        b = x._crops
        r = self.mlp.requires_grad
        h = _act(b * self.hidden, F16, x, r)
        h = _act(b * self.hidden, F16, h, r)
        h = _act(b * self.bottleneck, F32, h, r)                 # F.normalize
        out = _act(b * self.out_dim, F16, h, r)                  # last_layer
        out._crops = b
        return out


class MultiCropWrapper(nn.Module):
    def __init__(self, backbone, head):
        nn.Module.__init__(self)
        backbone.fc, backbone.head = nn.Module(), nn.Module()
        self.backbone = backbone
        self.head = head

    def forward(self, x):
        # convert to list
        if not isinstance(x, list):
            x = [x]
        # crops grouped by resolution: torch.unique_consecutive(...) -> [2, 10] here
        groups = []
        start = 0
        while start < len(x):
            end = start
            while end < len(x) and x[end]._res == x[start]._res:
                end += 1
            groups.append((start, end))
            start = end
        output = None
        for start_idx, end_idx in groups:
            batch = _cat(x[start_idx:end_idx])
            _out = self.backbone(batch)
            del batch
            # accumulate outputs
            output = _out if output is None else _cat([output, _out])
        # Run the head forward on the concatenated features.
        return self.head(output)


def _cat(tensors):
    """torch.cat(tensors): a new tensor of their total size, in their graph."""
    n = sum(t.nbytes for t in tensors)
    out = torch.empty(n, device="cuda")
    out._dtype = tensors[0].dtype
    out._crops = sum(getattr(t, "_crops", 0) for t in tensors)
    out._res = getattr(tensors[0], "_res", None)
    if torch.is_grad_enabled() and any(t._params or t.requires_grad for t in tensors):
        out._saved = tuple(tensors)
    return torch._derive(out, *tensors)


class DINOLoss(nn.Module):
    def __init__(self, out_dim, ncrops, warmup_teacher_temp=0.04, teacher_temp=0.04, student_temp=0.1):
        nn.Module.__init__(self)
        self.ncrops, self.out_dim = ncrops, out_dim
        self.student_temp = student_temp
        self.register_buffer("center", torch.empty(out_dim * 4, device="cuda"))

    def forward(self, student_output, teacher_output, epoch):
        B = teacher_output._crops // 2
        student_out = _act(student_output._crops * self.out_dim, F16, student_output)   # / self.student_temp
        teacher_out = _act(teacher_output._crops * self.out_dim, F32, None)   # softmax((t - center) / temp).detach()
        total_loss = None
        n_loss_terms = 0
        for iq in range(2):
            for v in range(self.ncrops):
                if v == iq:
                    continue
                lsm = _act(B * self.out_dim, F32, student_out)                   # F.log_softmax(student_out[v])
                prod = _act(B * self.out_dim, F32, (teacher_out, lsm))          # -q * log_softmax
                loss = _act(B, F32, prod)                                        # torch.sum(..., dim=-1)
                del prod, lsm
                total_loss = loss if total_loss is None else _act(128, F32, (total_loss, loss))
                n_loss_terms += 1
        self.update_center(teacher_output)
        return total_loss

    def update_center(self, teacher_output):
        with torch.no_grad():
            batch_center = torch.empty(self.out_dim * 4, device="cuda")
            self.center = torch.empty(self.out_dim * 4, device="cuda")      # center * m + batch_center * (1 - m)
            del batch_center


class DataAugmentationDINO(object):
    """2 global crops (224, scale 0.4-1) and local_crops_number local crops (96, scale 0.05-0.4)."""

    def __init__(self, local_crops_number):
        self.local_crops_number = local_crops_number


def _crops_to_cuda(batch, local_crops_number, global_res=224, local_res=96):
    """images = [im.cuda(non_blocking=True) for im in images]: float32 [B, 3, res, res] per crop."""
    out = []
    for i in range(2 + local_crops_number):
        res = global_res if i < 2 else local_res
        t = torch.empty(batch * 3 * res * res * 4, device="cuda")
        t._crops, t._res = batch, res
        out.append(t)
    return out


def train_one_epoch(student, teacher, teacher_without_ddp, dino_loss, data_loader, optimizer, lr_schedule,
                    wd_schedule, momentum_schedule, epoch, fp16_scaler, args):
    for it, (images, _) in enumerate(data_loader):
        # move images to gpu
        images = _crops_to_cuda(args.batch_size_per_gpu, args.local_crops_number)
        # teacher and student forward passes + compute dino loss
        with torch.cuda.amp.autocast(fp16_scaler is not None):
            teacher_output = teacher(images[:2])  # only the 2 global views pass through the teacher
            student_output = student(images)
            loss = dino_loss(student_output, teacher_output, epoch)

        # student update
        optimizer.zero_grad()
        fp16_scaler.scale(loss).backward()
        fp16_scaler.unscale_(optimizer)
        fp16_scaler.step(optimizer)
        fp16_scaler.update()

        # EMA update for the teacher
        with torch.no_grad():
            pass   # param_k.data.mul_(m).add_((1 - m) * param_q.detach().data)
        print("Epoch: [%d/%d]  [%d]  loss ...  max mem %.0f MB" % (
            epoch, args.epochs, it, torch.cuda.max_memory_allocated() / 1e6))


def data_loader(n=3):
    for _ in range(n):
        yield None, None


def main():
    parser = argparse.ArgumentParser("DINO")
    parser.add_argument("--arch", default="vit_small")
    parser.add_argument("--patch_size", default=16, type=int)
    parser.add_argument("--out_dim", default=65536, type=int)
    parser.add_argument("--use_fp16", default=True)
    parser.add_argument("--batch_size_per_gpu", default=96, type=int)
    parser.add_argument("--epochs", default=300, type=int)
    parser.add_argument("--local_crops_number", type=int, default=8)
    args = parser.parse_args()

    # utils.init_distributed_mode(args): "Will run the code on one GPU." (rank 0, world size 1, nccl)
    torch.cuda.set_device(0)

    student = VisionTransformer(patch_size=args.patch_size)
    teacher = VisionTransformer(patch_size=args.patch_size)
    embed_dim = student.embed_dim
    student = MultiCropWrapper(student, DINOHead(embed_dim, args.out_dim))
    teacher = MultiCropWrapper(teacher, DINOHead(embed_dim, args.out_dim))
    # synchronize batch norms (if any); DDP wrapper for the student
    student = nn.parallel.DistributedDataParallel(student, device_ids=[0])
    teacher_without_ddp = teacher
    # teacher and student start with the same weights: load_state_dict (no new memory)
    for p in teacher.parameters():
        p.requires_grad = False
    print("Student and Teacher are built: they are both %s network." % args.arch)

    dino_loss = DINOLoss(args.out_dim, args.local_crops_number + 2)
    params_groups = [p for p in student.module.parameters() if p.requires_grad]   # utils.get_params_groups
    optimizer = torch.optim.AdamW(params_groups)  # to use with ViTs
    fp16_scaler = torch.cuda.amp.GradScaler() if args.use_fp16 else None

    print("Starting DINO training !")
    for epoch in range(args.epochs):
        train_one_epoch(student, teacher, teacher_without_ddp, dino_loss, data_loader(), optimizer, None, None,
                        None, epoch, fp16_scaler, args)
        break


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
