"""train_seg.py -- a mapping start-up trains BiSeNetV2 (real-time semantic segmentation, 3.4M parameters, float32)
on Cityscapes, 19 classes, 512 x 1024 crops, on an AWS g4dn.12xlarge (4x Tesla T4, 16 GB each).  The engineer
took the model and the OHEM losses from the public repo but not its torchrun/DDP launcher -- "one process is
simpler" -- and sized the batch from a single-T4 run, where batch 12 trained at ~11 GiB:

    net = BiSeNetV2(n_classes=19).cuda()
    net = torch.nn.DataParallel(net)                   # device_ids = all 4 GPUs, output_device = GPU 0
    ims_per_gpu = 12
    loader = DataLoader(train_ds, batch_size=ims_per_gpu * torch.cuda.device_count(), ...)   # 48
    for im, lb in loader:
        im, lb = im.cuda(), lb.cuda()
        logits, *logits_aux = net(im)                  # main head + 4 booster heads, all upsampled to 512 x 1024
        loss = criteria_pre(logits, lb) + sum(c(l, lb) for c, l in zip(criteria_aux, logits_aux))
        loss.backward(); optim.step()

Each replica runs 12 images (~8.9 GiB with its CUDA context on every card).  But DataParallel gathers every output
onto GPU 0, and BiSeNetV2 training returns five full-resolution logit maps: 5 x 48 x 19 x 512 x 1024 float32 =
8.9 GiB more on GPU 0 alone (on top of GPU 0's own replica, the whole input batch and labels), before the loss
adds its log-softmax copies there too.  The first iteration fails in DataParallel's gather, on GPU 0, with
GPUs 1-3 at ~9 GiB each and 6 GiB free on each.

An expert: the out-of-memory is DataParallel's imbalance, not the per-GPU batch (the single-card run proved 12
images fit a T4): GPU 0 carries the gathered outputs and the loss for all four.  Use DistributedDataParallel,
one process per GPU (the repo's own torchrun launcher), each computing its own loss on its own 12 images; or,
short of that, compute the loss inside the module DataParallel replicates so that only a scalar is gathered.
Wrong advice: a smaller batch (it wastes the 6 GiB free on GPUs 1-3 and keeps GPU 0 the bottleneck), a fused
cross-entropy (the memory is the gathered logits, not a vocabulary), empty_cache / expandable_segments (the
tensors are live), mixed precision or gradient checkpointing first (they shrink every GPU to rescue one),
cropping the images.
"""
import os
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in supplement (not the user's code): torch.nn.DataParallel (and tensor addition), which the stand-in
# torch lacks, as
# PyTorch lays it out (torch/nn/parallel/data_parallel.py): scatter the input along dim 0, replicate the module
# onto each device (Broadcast of its parameters and buffers), run the replicas, gather the outputs onto
# output_device (Gather keeps only the devices and sizes for backward).  The stand-in computes nothing;
# parallel_apply runs the replicas one after the other.  Compiled as torch's own file.
_DP_SRC = '''
import collections


def _chunk_to(t, devices):
    n = len(devices)
    out = []
    for d in devices:
        if d == t.device:
            v = t.view()
            v.nbytes = t.nbytes // n
            out.append(v)
        else:
            out.append(torch.empty(t.nbytes // n, device=d))
    return out


def scatter(inputs, devices):
    per = [_chunk_to(x, devices) for x in inputs]
    return [tuple(p[i] for p in per) for i in range(len(devices))]


def _replicate_module(m, device, params_map):
    r = object.__new__(type(m))
    r.__dict__.update(m.__dict__)
    r.__dict__["_parameters"] = collections.OrderedDict(
        (k, params_map[id(p)] if p is not None else None) for k, p in m._parameters.items())
    r.__dict__["_buffers"] = collections.OrderedDict(
        (k, torch.empty(b.nbytes, device=device) if b is not None else None) for k, b in m._buffers.items())
    r.__dict__["_modules"] = collections.OrderedDict(
        (k, _replicate_module(c, device, params_map) if c is not None else None) for k, c in m._modules.items())
    return r


def replicate(network, devices):
    replicas = []
    params = network.parameters()
    for d in devices:
        if d == devices[0]:
            replicas.append(network)
            continue
        params_map = dict((id(p), Parameter(torch.empty(p.nbytes, device=d), p.requires_grad)) for p in params)
        replicas.append(_replicate_module(network, d, params_map))
    return replicas


def parallel_apply(modules, inputs):
    return [m(*inp) for m, inp in zip(modules, inputs)]


def gather(outputs, target_device):
    n_out = len(outputs[0])
    result = []
    for j in range(n_out):
        parts = [o[j] for o in outputs]
        g = torch.empty(sum(p.nbytes for p in parts), device=target_device)
        g._saved = tuple(getattr(p, "_saved", None) for p in parts if getattr(p, "_saved", None) is not None)
        result.append(torch._derive(g, *parts))
    return tuple(result)


class DataParallel(Module):
    def __init__(self, module, device_ids=None, output_device=None, dim=0):
        Module.__init__(self)
        self.module = module
        self.device_ids = list(range(torch.cuda.device_count())) if device_ids is None else list(device_ids)
        self.output_device = self.device_ids[0] if output_device is None else output_device
        self.dim = dim

    def forward(self, *inputs, **kwargs):
        inputs = scatter(inputs, self.device_ids)
        replicas = replicate(self.module, self.device_ids[:len(inputs)])
        outputs = parallel_apply(replicas, inputs)
        return gather(outputs, self.output_device)
'''
_dp_ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
exec(compile(_DP_SRC, os.path.join(os.path.dirname(torch.__file__), "nn", "parallel", "data_parallel.py"), "exec"),
     _dp_ns)
torch.nn.DataParallel = _dp_ns["DataParallel"]
_TENSOR_SRC = '''
def _binary(self, other):
    both = isinstance(other, Tensor)
    out = torch.empty(max(self.nbytes, other.nbytes if both else 0, 512), device=self.device)
    out._saved = (self, other) if both else self
    return torch._derive(out, self, *([other] if both else []))


Tensor.__add__ = Tensor.__radd__ = _binary
'''
exec(compile(_TENSOR_SRC, os.path.join(os.path.dirname(torch.__file__), "_tensor.py"), "exec"),
     {"torch": torch, "Tensor": torch.Tensor})
# ---- end of the supplement

# ------------------------------------------------------------------------------------------------------------
# the user's program (BiSeNetV2 as the public repo lays it out; sizes per pixel of the 512 x 1024 crop)
# ------------------------------------------------------------------------------------------------------------
N_CLASSES = 19
CROP = (512, 1024)


def act(x, px, bytes_per_px, n=1):
    """n feature maps of bytes_per_px bytes per input pixel (conv -> BN -> ReLU outputs kept for backward)."""
    for _ in range(n):
        out = torch.empty(px * bytes_per_px, device=x.device)
        out._saved = x
        x = torch._derive(out, x)
    return x


def w(n):
    return torch.nn.Parameter(torch.empty(n * 4, device="cuda"))


class DetailBranch(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.S1 = torch.nn.Conv2d(3, 64, 3, stride=2, device="cuda")
        self.S2_S3 = w(64 * 64 * 9 * 4 + 64 * 128 * 9 + 128 * 128 * 9 * 2)

    def forward(self, x, px):
        feat = self.S1(x)                                   # 64 ch at 1/2
        feat = act(feat, px, 64 // 4 * 4, 5)                # S1: bn, relu, conv, bn, relu
        feat = act(feat, px, 64 // 16 * 4, 9)               # S2 at 1/4
        return act(feat, px, 128 // 64 * 4, 9)              # S3 at 1/8


class SegmentBranch(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = w(2_150_000)

    def forward(self, x, px):
        feat2 = act(x, px, 16 // 16 * 4, 6)                 # stem at 1/4
        feat3 = act(feat2, px, 2, 6)                        # GE layers at 1/8 .. 1/32
        feat4 = act(feat3, px, 1, 4)
        feat5_4 = act(feat4, px, 1, 4)
        feat5_5 = act(feat5_4, px, 1, 2)                    # context embedding
        return feat2, feat3, feat4, feat5_4, feat5_5


class BGALayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = w(128 * 128 * 9 * 4)

    def forward(self, x_d, x_s, px):
        return act(x_d, px, 128 // 64 * 4, 8)


class SegmentHead(torch.nn.Module):
    def __init__(self, in_chan, mid_chan, up_factor):
        torch.nn.Module.__init__(self)
        self.weight = w(in_chan * mid_chan * 9 + mid_chan * N_CLASSES)
        self.mid_chan, self.up_factor = mid_chan, up_factor

    def forward(self, x, px):
        feat = act(x, px, max(self.mid_chan * 4 // self.up_factor ** 2, 1), 3)
        feat = act(feat, px, max(N_CLASSES * 4 // self.up_factor ** 2, 1))
        return act(feat, px, N_CLASSES * 4)                 # upsampled to the full crop


class BiSeNetV2(torch.nn.Module):
    def __init__(self, n_classes):
        torch.nn.Module.__init__(self)
        self.detail = DetailBranch()
        self.segment = SegmentBranch()
        self.bga = BGALayer()
        self.head = SegmentHead(128, 1024, 8)
        self.aux2 = SegmentHead(16, 128, 4)
        self.aux3 = SegmentHead(32, 128, 8)
        self.aux4 = SegmentHead(64, 128, 16)
        self.aux5_4 = SegmentHead(128, 128, 32)

    def forward(self, x):
        px = x.nbytes // (3 * 4)                            # pixels in this replica's images
        feat_d = self.detail(x, px)
        feat2, feat3, feat4, feat5_4, feat_s = self.segment(x, px)
        feat_head = self.bga(feat_d, feat_s, px)
        logits = self.head(feat_head, px)
        if not self.training:
            return (logits,)
        return (logits, self.aux2(feat2, px), self.aux3(feat3, px), self.aux4(feat4, px), self.aux5_4(feat5_4, px))


class OhemCELoss(object):
    def __init__(self, thresh):
        self.thresh = thresh

    def __call__(self, logits, labels):
        loss = F.cross_entropy(logits, labels)              # per-pixel, then the hardest 70% kept
        return loss


class CityScapes(object):
    """leftImg8bit / gtFine, random scale 0.25-2.0, 512 x 1024 crops, flips: one batch of images and labels."""

    def batch(self, n):
        h, w_ = CROP
        return torch.empty(n * 3 * h * w_ * 4, device="cuda"), torch.empty(n * h * w_ * 8, device="cuda")


def train():
    net = BiSeNetV2(n_classes=N_CLASSES)
    net.train()
    net = torch.nn.DataParallel(net)
    criteria_pre = OhemCELoss(0.7)
    criteria_aux = [OhemCELoss(0.7) for _ in range(4)]
    optim = torch.optim.SGD(net.parameters(), lr=5e-2, momentum=0.9, weight_decay=5e-4)
    ims_per_gpu = 12
    batch_size = ims_per_gpu * torch.cuda.device_count()
    ds = CityScapes()
    for it in range(150_000):
        im, lb = ds.batch(batch_size)                       # im.cuda(), lb.cuda(): the whole batch on GPU 0
        optim.zero_grad()
        logits, *logits_aux = net(im)
        loss_pre = criteria_pre(logits, lb)
        loss_aux = [crit(lgt, lb) for crit, lgt in zip(criteria_aux, logits_aux)]
        loss = loss_pre + sum(loss_aux)
        loss.backward()
        optim.step()


try:
    train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
