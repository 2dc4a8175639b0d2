"""train_liver.py -- a radiology resident's liver and liver-tumour segmentation on the Medical Segmentation
Decathlon's Task03 (131 portal-venous CTs; 104 training, 27 validation), a MONAI SegResNet
(init_filters 32, blocks_down 1-2-2-4), trained on the lab's RTX 4090 (24 GB).  The script started as
MONAI's 3D segmentation tutorial; training runs on 96^3 crops, batch 2 x 4 crops (RandCropByPosNegLabeld,
num_samples=4), fp32, 17.4 GiB at its peak, and has run fine for the whole first epoch.

For the second experiment the resident cleaned the script up and moved the tutorial's inline validation
block into a function.  In the tutorial it read

    model.eval()
    with torch.no_grad():
        for val_data in val_loader:
            ...
            val_outputs = sliding_window_inference(val_inputs, roi_size, sw_batch_size, model)

and after the refactor it reads

    def evaluate(model, loader):
        model.eval()                       # "eval mode, no gradients"
        for val_data in loader:
            val_inputs = val_data["image"].to(device)
            val_outputs = sliding_window_inference(val_inputs, (96, 96, 96), 4, model, overlap=0.5)
            ...

-- the `with torch.no_grad():` line did not make it into the function.  model.eval() switches dropout and
normalization statistics, not autograd.  So the first validation, after epoch 1, runs every window's
forward pass with autograd recording, and sliding_window_inference adds each window's prediction into
its output volume in place: the output volume carries the graph of every window stitched so far, and
with it every window's activations.  One batch of 4 windows keeps ~8.7 GiB; the first validation volume
(380 x 300 x 280 voxels after Spacingd, 210 windows at overlap 0.5, 53 window batches) dies in the third
window batch's forward pass, in a residual block of the encoder's full-resolution level, with the first
two batches' activations (18 GiB) still held by the output volume.  The training state is tiny
(SegResNet has 18.8 M parameters: 75 MB, its AdamW state 150 MB, the gradients dropped by zero_grad).

An expert: this is evaluation, not training -- run it without autograd (torch.no_grad() or
torch.inference_mode() around the validation loop, or decorate evaluate()); then each window's
activations are freed as soon as its prediction is added, and the whole validation needs ~3 GiB.
Wrong first advice: a smaller sw_batch_size or roi_size (memory would still grow with every window:
the 210 windows of one volume keep ~460 GiB of activations whatever the batch), gradient checkpointing or
mixed precision (training-time tools, and the growth stays), expandable_segments or empty_cache (the
memory is live, held by the output's graph), freeing the training state (225 MB of 24 GB), a bigger GPU.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file
# (its frames count as the framework's): GroupNorm, ReLU, trilinear upsampling, slicing/indexing,
# elementwise ops and in-place indexed addition as autograd records them (with autograd on, an in-place
# add into a tensor makes it part of the graph of what was added), and a backward that releases what the
# graph saved.  An operation saves its inputs only while autograd records.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _new(nbytes, like, *inputs):
    out = torch.empty(nbytes, device=like.device)
    out._dtype = like.dtype
    if torch.is_grad_enabled():
        out._saved = tuple(inputs)
        return derive(out, *inputs)
    return out

def _conv3d_forward(self, input):
    out = self._conv_forward(input, self.weight, self.bias)
    if not torch.is_grad_enabled():
        out._saved = None
        out._params = ()
    return out

class GroupNorm(Module):
    def __init__(self, num_groups, num_channels, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_channels * 4, device=device))
        self.bias = Parameter(torch.empty(num_channels * 4, device=device))
    def forward(self, input):
        return _new(input.nbytes, input, input)

class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

def upsample_trilinear(input, scale_factor=2):
    return _new(input.nbytes * scale_factor ** 3, input, input)

def add(a, b):
    return _new(max(a.nbytes, b.nbytes), a, a, b)

def window(t, nbytes):
    """t[slices]: a window of a volume, copied out (torch.cat of the windows makes the batch)."""
    return _new(nbytes, t, t)

def mul(t, weight):
    return _new(t.nbytes, t, t, weight)

def index_add_(target, value):
    """target[idx] += value: in place; with autograd on, target joins value's graph and keeps it."""
    if torch.is_grad_enabled() and (value._params or value.requires_grad):
        prev = target.__dict__.get("_saved") or ()
        target._saved = tuple(prev) + (value,)
        derive(target, value)
    return target

def cat(tensors, dim=0):
    return _new(sum(t.nbytes for t in tensors), tensors[0], *tensors)

_engine_backward = torch.Tensor.backward

def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _engine_backward(self, gradient, retain_graph, create_graph, inputs)
    if retain_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        saved = t.__dict__.get("_saved")
        if saved is None:
            continue
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if isinstance(x, torch.Tensor))
'''
_ns = {"torch": torch}
exec("from torch.nn.modules.module import Module\nfrom torch.nn.parameter import Parameter", _ns)
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv3d.forward = _ns["_conv3d_forward"]
nn.GroupNorm, nn.ReLU = _ns["GroupNorm"], _ns["ReLU"]
torch.cat = _ns["cat"]
torch.Tensor.backward = _ns["_backward"]
F_upsample, T_window, T_mul, T_index_add_, T_add = (_ns["upsample_trilinear"], _ns["window"], _ns["mul"],
                                                    _ns["index_add_"], _ns["add"])


# --- stand-ins for what the script takes from MONAI (same names and call shapes), as far as memory goes
class ResBlock(nn.Module):
    def __init__(self, ch):
        nn.Module.__init__(self)
        self.norm1 = nn.GroupNorm(8, ch, device="cuda")
        self.conv1 = nn.Conv3d(ch, ch, 3, device="cuda")
        self.norm2 = nn.GroupNorm(8, ch, device="cuda")
        self.conv2 = nn.Conv3d(ch, ch, 3, device="cuda")
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x
        x = self.conv1(self.act(self.norm1(x)))
        x = self.conv2(self.act(self.norm2(x)))
        return T_add(x, identity)


class SegResNet(nn.Module):
    """monai.networks.nets.SegResNet(spatial_dims=3, init_filters=32, in_channels=1, out_channels=3,
    blocks_down=(1, 2, 2, 4), blocks_up=(1, 1, 1), upsample_mode="nontrainable")."""

    def __init__(self, init_filters=32, in_channels=1, out_channels=3, blocks_down=(1, 2, 2, 4), blocks_up=(1, 1, 1)):
        nn.Module.__init__(self)
        f = init_filters
        self.convInit = nn.Conv3d(in_channels, f, 3, device="cuda")
        self.down = []
        for i, n in enumerate(blocks_down):
            ch = f * 2 ** i
            layers = ([nn.Conv3d(ch // 2, ch, 3, stride=2, device="cuda")] if i > 0 else []) + [ResBlock(ch) for _ in range(n)]
            for j, m in enumerate(layers):
                setattr(self, "down_%d_%d" % (i, j), m)
            self.down.append(layers)
        self.up = []
        for i, n in enumerate(blocks_up):
            ch = f * 2 ** (len(blocks_up) - i - 1)
            reduce = nn.Conv3d(ch * 2, ch, 1, device="cuda")
            blocks = [ResBlock(ch) for _ in range(n)]
            setattr(self, "up_reduce_%d" % i, reduce)
            for j, m in enumerate(blocks):
                setattr(self, "up_%d_%d" % (i, j), m)
            self.up.append((reduce, blocks))
        self.norm_final = nn.GroupNorm(8, f, device="cuda")
        self.conv_final = nn.Conv3d(f, out_channels, 1, device="cuda")

    def forward(self, x):
        x = self.convInit(x)
        skips = []
        for layers in self.down:
            for m in layers:
                x = m(x)
            skips.append(x)
        skips.pop()
        for reduce, blocks in self.up:
            x = T_add(F_upsample(reduce(x), scale_factor=2), skips.pop())
            for m in blocks:
                x = m(x)
        return self.conv_final(self.norm_final(x))


def dense_patch_iter(image_voxels, roi, overlap):
    """the window grid of monai.inferers.utils._get_scan_interval / dense_patch_slices"""
    n = 1
    for size, r in zip(image_voxels, roi):
        step = int(r * (1 - overlap))
        n *= -(-(size - r) // step) + 1
    return n


def sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, overlap=0.25, shape=None):
    """monai.inferers.sliding_window_inference, as far as memory goes: windows cut from the input and
    batched (torch.cat), predicted, weighted by the importance map and added in place into the output
    volume and the count map."""
    roi_vox = roi_size[0] * roi_size[1] * roi_size[2]
    total = dense_patch_iter(shape, roi_size, overlap)
    importance_map = torch.empty(roi_vox * 4, device=inputs.device)
    output_image = count_map = None
    for slice_g in range(0, total, sw_batch_size):
        idx = range(slice_g, min(slice_g + sw_batch_size, total))
        win_data = torch.cat([T_window(inputs, roi_vox * 4) for _ in idx])
        seg_prob = predictor(win_data)
        if output_image is None:
            vox = shape[0] * shape[1] * shape[2]
            output_image = torch.empty(vox * 4 * 3, device=inputs.device)
            count_map = torch.empty(vox * 4, device=inputs.device)
        for _ in idx:
            T_index_add_(output_image, T_mul(T_window(seg_prob, roi_vox * 4 * 3), importance_map))
        del seg_prob, win_data
    return output_image


class DiceCELoss(object):
    def __call__(self, outputs, target):
        out = torch.empty(512, device=outputs.device)
        out._saved = (outputs,)
        from torch.autograd._graph import derive
        return derive(out, outputs)


class HostVolume(object):
    """a MetaTensor on the CPU as the DataLoader yields it"""

    def __init__(self, shape, channels=1):
        self.shape = shape
        self.nbytes = shape[0] * shape[1] * shape[2] * 4 * channels

    def to(self, device):
        return torch.empty(self.nbytes, device=device)


def train_loader_epoch(n_batches, batch_size=2, num_samples=4, roi=(96, 96, 96)):
    for _ in range(n_batches):
        crops = batch_size * num_samples
        yield {"image": HostVolume(roi, crops), "label": HostVolume(roi, crops)}


def val_loader():
    for shape in ((380, 300, 280), (352, 288, 236), (400, 310, 300)):
        yield {"image": HostVolume(shape), "label": HostVolume(shape), "shape": shape}


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
device = "cuda:0"
model = SegResNet(init_filters=32, in_channels=1, out_channels=3, blocks_down=(1, 2, 2, 4), blocks_up=(1, 1, 1))
loss_function = DiceCELoss()
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
roi_size = (96, 96, 96)
sw_batch_size = 4
max_epochs = 300
val_interval = 1
steps_per_epoch = 52            # 104 training volumes, batch 2


def evaluate(model, loader):
    model.eval()
    scores = []
    for val_data in loader:
        val_inputs = val_data["image"].to(device)
        val_labels = val_data["label"].to(device)
        val_outputs = sliding_window_inference(val_inputs, roi_size, sw_batch_size, model, overlap=0.5,
                                               shape=val_data["shape"])
        scores.append(0.0)          # post_pred / DiceMetric on val_outputs and val_labels
    model.train()
    return sum(scores) / len(scores)


try:
    for epoch in range(max_epochs):
        model.train()
        epoch_loss = 0.0
        for step, batch_data in enumerate(train_loader_epoch(steps_per_epoch)):
            inputs, labels = batch_data["image"].to(device), batch_data["label"].to(device)
            optimizer.zero_grad()
            outputs = model(inputs)
            loss = loss_function(outputs, labels)
            loss.backward()
            optimizer.step()
            del inputs, labels, outputs, loss
        print("epoch %d done, peak %.1f GiB" % (epoch + 1, torch.cuda.max_memory_allocated() / 2 ** 30))
        if (epoch + 1) % val_interval == 0:
            metric = evaluate(model, val_loader())
            print("epoch %d mean dice %.4f" % (epoch + 1, metric))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
