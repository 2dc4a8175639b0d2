"""parcellate_cohort.py -- a neuroimaging core's batch job: whole-brain parcellation of T1-weighted MRIs
into the 133 BrainCOLOR labels with the lab's own 3D U-Net (DynUNet layout, filters 32..320), run over
an ageing cohort on a cloud VM with one T4 (16 GB, 15 GiB usable), fp16 autocast under
torch.inference_mode(), MONAI's sliding_window_inference on 128^3 windows at overlap 0.5, 8 windows a
batch (18 windows a brain).

Stitching a 133-channel probability volume on the GPU is big (the output buffer is float32: 133 x
192 x 256 x 256 x 4 B = 6.7 GB), so the job's author added a fallback, as nnU-Net's predictor does:

    def segment(image):
        try:
            return sliding_window_inference(image, (128, 128, 128), 8, model, overlap=0.5)
        except torch.cuda.OutOfMemoryError:
            log.warning("OOM stitching on the GPU; retrying with the output on the CPU")
            torch.cuda.empty_cache()
            return sliding_window_inference(image, (128, 128, 128), 8, model, overlap=0.5, device="cpu")

On the first subject the GPU attempt does not fit: the first batch of windows goes through, the
6.2 GiB output buffer is made, and the second batch fails in the decoder's full-resolution stage (a
1 GiB feature map).  The fallback then runs inside the `except` block, where the exception being
handled still holds its traceback, and with it the frames of the failed call: sliding_window_inference's
output buffer and count map, and the U-Net forward's skip connections and decoder tensors -- 12.0 GiB
that empty_cache() cannot release because they are referenced (2.1 GiB more stay cached in the pieces
between them).  The fallback needs 6.8 GiB at its peak; it gets ~2.5 GiB and fails in its first batch's
first convolution block (a 1 GiB request): an out-of-memory error inside the out-of-memory handler.
Run after the except block, the same fallback peaks at 6.8 GiB and fits.

An expert: retry after leaving the except block (note the failure in a flag and call the fallback after
the try statement), so the failed attempt's tensors are freed before the retry; then pick the CPU
stitching up front for outputs this large (133 classes) instead of trying the GPU first.  Wrong first
advice: empty_cache (it is already called, and cannot free referenced tensors), expandable_segments
(the 12 GiB are live, not fragmented), a smaller sw_batch_size (a batch of 1 would squeeze in beside
12 GiB of dead tensors, at 8 times the launches, and leave them there), inference_mode or fp16 (both
already on), a bigger GPU.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# --- what real PyTorch has and the stand-in torch lacks, in plain Python compiled as torch's own file:
# autocast's fp16 convolution (the input cast to fp16), ConvTranspose3d, InstanceNorm3d, LeakyReLU,
# torch.cat, conversions; nothing is saved for backward while autograd is off.
_TORCH_ADDITIONS = r'''
from torch.autograd._graph import derive

def _new(nbytes, dtype, like, *inputs):
    out = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device=like.device)
    if torch.is_grad_enabled():
        out._saved = tuple(inputs)
        return derive(out, *inputs)
    return out

def _half(t):
    return t if t.dtype == "float16" else _new(t.nbytes // 2, "float16", t, t)

def _to_float(t):
    return t if t.dtype == "float32" else _new(t.nbytes * 2, "float32", t, t)

def _conv3d_forward(self, input):
    if torch.is_autocast_enabled():
        input = _half(input)
    out = self._conv_forward(input, self.weight, self.bias)
    out._dtype = input.dtype
    if not torch.is_grad_enabled():
        out._saved = None
        out._params = ()
    return out

class ConvTranspose3d(_ConvNd):
    _dims = 3
    def forward(self, input):
        if torch.is_autocast_enabled():
            input = _half(input)
        return _new(input.nbytes * self.out_channels // self.in_channels * self.stride ** 3, input.dtype, input, input)

class InstanceNorm3d(Module):
    def __init__(self, num_features, affine=True, device=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device=device))
        self.bias = Parameter(torch.empty(num_features * 4, device=device))
    def forward(self, input):
        return _new(input.nbytes, input.dtype, input, input)

class LeakyReLU(Module):
    def __init__(self, negative_slope=0.01, inplace=False):
        Module.__init__(self)
    def forward(self, input):
        return input

def cat(tensors, dim=0):
    return _new(sum(t.nbytes for t in tensors), tensors[0].dtype, tensors[0], *tensors)

def zeros(nbytes, device=None):
    return torch.empty(nbytes, device=device) if device != "cpu" else _HostBuffer(nbytes)

class _HostBuffer(object):
    def __init__(self, nbytes):
        self.nbytes = nbytes

def window(t, nbytes):
    return _new(nbytes, t.dtype, t, t)

def divide(a, b):
    if isinstance(a, _HostBuffer):
        return _HostBuffer(a.nbytes)
    return _new(a.nbytes, a.dtype, a, a, b)

def to(t, device):
    if device == "cpu":
        return _HostBuffer(t.nbytes)
    return t
'''
_ns = {"torch": torch}
exec("from torch.nn.modules.conv import _ConvNd\nfrom torch.nn.modules.module import Module\n"
     "from torch.nn.parameter import Parameter", _ns)
exec(compile(_TORCH_ADDITIONS, torch.nn.modules.conv.__file__, "exec"), _ns)
torch.nn.Conv3d.forward = _ns["_conv3d_forward"]
nn.ConvTranspose3d, nn.InstanceNorm3d, nn.LeakyReLU = _ns["ConvTranspose3d"], _ns["InstanceNorm3d"], _ns["LeakyReLU"]
torch.cat = _ns["cat"]
T_zeros, T_window, T_divide, T_to, T_float = _ns["zeros"], _ns["window"], _ns["divide"], _ns["to"], _ns["_to_float"]


# --- stand-ins for MONAI (same names and call shapes), as far as memory goes
class UnetBasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1):
        nn.Module.__init__(self)
        self.conv1 = nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.norm1 = nn.InstanceNorm3d(cout, device="cuda")
        self.conv2 = nn.Conv3d(cout, cout, 3, device="cuda")
        self.norm2 = nn.InstanceNorm3d(cout, device="cuda")
        self.lrelu = nn.LeakyReLU(0.01, inplace=True)

    def forward(self, inp):
        out = self.lrelu(self.norm1(self.conv1(inp)))
        return self.lrelu(self.norm2(self.conv2(out)))


class UnetUpBlock(nn.Module):
    def __init__(self, cin, cout, up):
        nn.Module.__init__(self)
        self.transp_conv = nn.ConvTranspose3d(cin, cout, up, stride=up, device="cuda")
        self.conv_block = UnetBasicBlock(cout * 2, cout)

    def forward(self, inp, skip):
        out = self.transp_conv(inp)
        out = torch.cat((out, skip), dim=1)
        return self.conv_block(out)


class DynUNet(nn.Module):
    def __init__(self, in_channels, out_channels, strides, filters):
        nn.Module.__init__(self)
        self.input_block = UnetBasicBlock(in_channels, filters[0], strides[0])
        self.downsamples = [UnetBasicBlock(filters[i - 1], filters[i], strides[i]) for i in range(1, len(filters) - 1)]
        for i, m in enumerate(self.downsamples):
            setattr(self, "down_%d" % i, m)
        self.bottleneck = UnetBasicBlock(filters[-2], filters[-1], strides[-1])
        self.upsamples = [UnetUpBlock(filters[i + 1], filters[i], strides[i + 1]) for i in reversed(range(len(filters) - 1))]
        for i, m in enumerate(self.upsamples):
            setattr(self, "up_%d" % i, m)
        self.output_block = nn.Conv3d(filters[0], out_channels, 1, device="cuda")

    def forward(self, x):
        skips = [self.input_block(x)]
        for down in self.downsamples:
            skips.append(down(skips[-1]))
        out = self.bottleneck(skips[-1])
        for up, skip in zip(self.upsamples, reversed(skips)):
            out = up(out, skip)
        return self.output_block(out)


def sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, overlap=0.25, device=None, shape=None,
                             num_classes=133):
    """monai.inferers.sliding_window_inference, as far as memory goes: windows cut from the input and
    batched, predicted, converted to float32 (the compute dtype), weighted and added into the output
    buffer and the count map (made on `device`, default the input's, after the first prediction), and
    at the end the output divided by the count map."""
    device = device or "cuda"
    roi_vox = roi_size[0] * roi_size[1] * roi_size[2]
    total = 1
    for size, r in zip(shape, roi_size):
        total *= -(-(size - r) // int(r * (1 - overlap))) + 1
    importance_map = torch.empty(roi_vox * 4, device="cuda")
    output_image = count_map = None
    for slice_g in range(0, total, sw_batch_size):
        n = min(sw_batch_size, total - slice_g)
        win_data = torch.cat([T_window(inputs, roi_vox * 4) for _ in range(n)])
        seg_prob = predictor(win_data)
        if output_image is None:
            vox = shape[0] * shape[1] * shape[2]
            output_image = T_zeros(vox * 4 * num_classes, device=device)
            count_map = T_zeros(vox * 4, device=device)
        seg_prob = T_to(seg_prob, device)
        for i in range(n):
            # output_image[original_idx] += importance_map * seg_prob[i]: a float32 window on 
            weighted = T_float(T_window(seg_prob, seg_prob.nbytes // n)) if device != "cpu" else None
            del weighted
        del seg_prob, win_data
    return T_divide(output_image, count_map)


class HostVolume(object):
    def __init__(self, shape):
        self.shape = shape
        self.nbytes = shape[0] * shape[1] * shape[2] * 4

    def to(self, device):
        return torch.empty(self.nbytes, device=device)


# ------------------------------------------------------------------------------------------------------
# the user's script
# ------------------------------------------------------------------------------------------------------
import logging                                   # noqa: E402

log = logging.getLogger("parcellate")
ROI = (128, 128, 128)
SW_BATCH = 8                                     # 18 windows a brain: 3 batches

model = DynUNet(in_channels=1, out_channels=133, strides=(1, 2, 2, 2, 2), filters=(32, 64, 128, 256, 320))
model.eval()


def segment(image, shape):
    try:
        return sliding_window_inference(image, ROI, SW_BATCH, model, overlap=0.5, shape=shape)
    except torch.cuda.OutOfMemoryError:
        log.warning("OOM stitching on the GPU; retrying with the output on the CPU")
        torch.cuda.empty_cache()
        return sliding_window_inference(image, ROI, SW_BATCH, model, overlap=0.5, device="cpu", shape=shape)


subjects = [("sub-0001", (192, 256, 256)), ("sub-0002", (176, 256, 256)), ("sub-0003", (192, 256, 256))]
try:
    for subject_id, shape in subjects:
        image = HostVolume(shape).to("cuda")         # LoadImage, NormalizeIntensity, EnsureType on the GPU
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            probs = segment(image, shape)
        labels = probs                               # argmax over the 133 channels, SaveImage
        del image, probs
        print(subject_id, "done")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
