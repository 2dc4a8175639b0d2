"""saliency_report.py -- a radiology AI group's DenseNet-121 (torchvision, 14 CheXpert findings, trained at
512x512 because the findings they care about -- pneumothorax, small nodules -- are small) on the
hospital's inference server, one Tesla T4 (16 GB, 15 GiB usable).  For a reader study the radiologists
asked for SmoothGrad maps of the 234 CheXpert validation studies, one map per study for its top finding.
The researcher uses Captum, as the SmoothGrad paper does (50 noisy samples, sigma 15%):

    model = densenet121(num_classes=14); model.load_state_dict(ckpt); model.cuda().eval()
    nt = NoiseTunnel(Saliency(model))
    for x, study in val_loader:                       # batch 1: one 1x3x512x512 study
        x = x.cuda()
        cls = model(x).argmax(1).item()  ... (under no_grad)
        attr = nt.attribute(x, nt_type="smoothgrad", nt_samples=50, stdevs=0.15, target=cls)

NoiseTunnel without nt_samples_batch_size puts all 50 noisy copies in ONE batch, and Saliency runs
that batch forward with autograd on (it needs d output / d input).  torchvision's DenseNet-121 keeps, per
512x512 image, ~690 MiB of activations for backward (every dense layer concatenates all earlier feature
maps into a new tensor, then batch-norms it; memory_efficient=False is the default); 50 images want
~34 GiB, the card has 14.5 GiB.  The very first study fails during the forward pass, at the batch norm
of transition1 right after denseblock1 (an 800 MiB request, 480 MiB free, 14 GiB allocated), the model
in eval mode, autograd on, nothing else on the card (weights 27 MiB).

An expert: the batch of 50 noise samples does not fit; the method itself is fine.  Evaluate the noise
samples in chunks and sum the gradients: nt_samples_batch_size=5 (or 10) in NoiseTunnel.attribute
(Captum accumulates the chunks), i.e. a smaller batch / the operation split in chunks.  Then, if wanted,
fp16 autocast on the T4 or densenet121(memory_efficient=True) (checkpointed dense layers).  Wrong
advice: torch.no_grad()/inference_mode -- the model is in eval mode and looks like inference, but a
saliency map IS a gradient with respect to the input: without autograd there is no map at all.  Also
wrong: empty_cache/expandable_segments (nothing is cached, the live activations fill the card), a
bigger GPU (an 80 GB card for a 5-line change), quantization.
"""
import sys

import torch
from torch import nn
from torch.autograd._graph import derive

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20


# ---- torchvision.models.densenet, as far as memory goes (the stand-in torch has Conv2d, not the rest):
#      BatchNorm2d / pooling / Linear / torch.cat make a new tensor of the size PyTorch's do (fp32).
class BatchNorm2d(nn.Module):
    def __init__(self, num_features):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(num_features * 4, device="cuda"))
        self.bias = nn.Parameter(torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_mean", torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_var", torch.empty(num_features * 4, device="cuda"))

    def forward(self, input):
        out = torch.empty(input.nbytes, device="cuda")
        out._saved = input
        return derive(out, input, self.weight)


class ReLU(nn.Module):
    def forward(self, input):              # inplace=True in torchvision's DenseNet: no new memory
        return input


class _Pool2d(nn.Module):
    def forward(self, input):              # kernel 2 / stride 2 (3/2 for pool0): a quarter of the bytes
        out = torch.empty(input.nbytes // 4, device="cuda")
        out._saved = input
        return derive(out, input)


MaxPool2d = AvgPool2d = _Pool2d


def cat(tensors, dim=1):
    """torch.cat: a new tensor holding all of them."""
    out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
    out._saved = tuple(tensors)
    return derive(out, *tensors)


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(in_features * out_features * 4, device="cuda"))

    def forward(self, input, batch):
        out = torch.empty(batch * 14 * 4, device="cuda")
        out._saved = input
        return derive(out, input, self.weight)


class _DenseLayer(nn.Module):
    def __init__(self, num_input_features, growth_rate=32, bn_size=4):
        nn.Module.__init__(self)
        self.norm1 = BatchNorm2d(num_input_features)
        self.relu1 = ReLU()
        self.conv1 = nn.Conv2d(num_input_features, bn_size * growth_rate, 1, bias=False, device="cuda")
        self.norm2 = BatchNorm2d(bn_size * growth_rate)
        self.relu2 = ReLU()
        self.conv2 = nn.Conv2d(bn_size * growth_rate, growth_rate, 3, bias=False, device="cuda")
        self.memory_efficient = False

    def bn_function(self, inputs):
        concated_features = cat(inputs, 1)
        bottleneck_output = self.conv1(self.relu1(self.norm1(concated_features)))
        return bottleneck_output

    def forward(self, input):
        prev_features = [input] if isinstance(input, torch.Tensor) else input
        bottleneck_output = self.bn_function(prev_features)
        new_features = self.conv2(self.relu2(self.norm2(bottleneck_output)))
        return new_features


class _DenseBlock(nn.Module):
    def __init__(self, num_layers, num_input_features, growth_rate=32):
        nn.Module.__init__(self)
        for i in range(num_layers):
            setattr(self, "denselayer%d" % (i + 1), _DenseLayer(num_input_features + i * growth_rate))
        self.num_layers = num_layers

    def forward(self, init_features):
        features = [init_features]
        for i in range(self.num_layers):
            layer = getattr(self, "denselayer%d" % (i + 1))
            new_features = layer(features)
            features.append(new_features)
        return cat(features, 1)


class _Transition(nn.Module):
    def __init__(self, num_input_features, num_output_features):
        nn.Module.__init__(self)
        self.norm = BatchNorm2d(num_input_features)
        self.relu = ReLU()
        self.conv = nn.Conv2d(num_input_features, num_output_features, 1, bias=False, device="cuda")
        self.pool = AvgPool2d()

    def forward(self, x):
        return self.pool(self.conv(self.relu(self.norm(x))))


class _Features(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.conv0 = nn.Conv2d(3, 64, 7, stride=2, bias=False, device="cuda")
        self.norm0 = BatchNorm2d(64)
        self.relu0 = ReLU()
        self.pool0 = MaxPool2d()
        c = 64
        for i, n in enumerate((6, 12, 24, 16)):
            setattr(self, "denseblock%d" % (i + 1), _DenseBlock(n, c))
            c += n * 32
            if i != 3:
                setattr(self, "transition%d" % (i + 1), _Transition(c, c // 2))
                c //= 2
        self.norm5 = BatchNorm2d(c)

    def forward(self, x):
        x = self.pool0(self.relu0(self.norm0(self.conv0(x))))
        for i in range(4):
            x = getattr(self, "denseblock%d" % (i + 1))(x)
            if i != 3:
                x = getattr(self, "transition%d" % (i + 1))(x)
        return self.norm5(x)


class DenseNet(nn.Module):
    def __init__(self, num_classes=14):
        nn.Module.__init__(self)
        self.features = _Features()
        self.classifier = Linear(1024, num_classes)

    def forward(self, x, batch=1):
        features = self.features(x)
        out = torch.empty(batch * 1024 * 4, device="cuda")      # relu + adaptive_avg_pool2d + flatten
        out._saved = features
        out = derive(out, features)
        return self.classifier(out, batch)


def densenet121(num_classes=14):
    return DenseNet(num_classes)


# ---- captum.attr, as far as memory goes: NoiseTunnel(Saliency(model)).attribute(...)
def _run_forward(forward_func, inputs, n):
    return forward_func(inputs, n)


def compute_gradients(forward_fn, inputs, target_ind, n):
    with torch.autograd.set_grad_enabled(True):
        outputs = _run_forward(forward_fn, inputs, n)
        grads = torch.empty(inputs.nbytes, device="cuda")    # torch.autograd.grad(outputs, inputs)
    return grads


class Saliency(object):
    def __init__(self, forward_func):
        self.forward_func = forward_func

    def attribute(self, inputs, target=None, abs=True, n=1):
        inputs.requires_grad_()
        gradients = compute_gradients(self.forward_func, inputs, target, n)
        return gradients


class NoiseTunnel(object):
    def __init__(self, attribution_method):
        self.attribution_method = attribution_method

    def attribute(self, inputs, nt_type="smoothgrad", nt_samples=5, nt_samples_batch_size=None, stdevs=1.0,
                  target=None):
        # nt_samples_batch_size=None: every noisy sample in one batch
        batch = nt_samples if nt_samples_batch_size is None else nt_samples_batch_size
        with torch.no_grad():
            expanded = torch.empty(inputs.nbytes * batch, device="cuda")   # inputs.repeat_interleave(batch)
            noise = torch.empty(inputs.nbytes * batch, device="cuda")      # torch.normal(0, stdevs, ...)
            inputs_with_noise = torch.empty(inputs.nbytes * batch, device="cuda")
            del expanded, noise
        return self.attribution_method.attribute(inputs_with_noise, target=target, n=batch)


class set_grad_enabled(object):
    """torch.autograd.set_grad_enabled (the stand-in torch lacks it)."""
    def __init__(self, mode):
        self.mode = bool(mode)

    def __enter__(self):
        self._prev = torch.is_grad_enabled()
        torch._grad.enabled = self.mode

    def __exit__(self, *exc):
        torch._grad.enabled = self._prev
        return False


if not hasattr(torch.autograd, "set_grad_enabled"):
    torch.autograd.set_grad_enabled = torch.set_grad_enabled = set_grad_enabled


# ---- the user's script
def val_studies():
    for i in range(234):
        yield "patient%05d/study1/view1_frontal.jpg" % (64541 + i)


model = densenet121(num_classes=14)
model.cuda().eval()
nt = NoiseTunnel(Saliency(model))
print("model on cuda: %.0f MiB" % (torch.cuda.memory_allocated() / MiB))

try:
    for path in val_studies():
        x = torch.empty(3 * 512 * 512 * 4, device="cuda")          # 1x3x512x512 float32, normalised
        with torch.no_grad():
            logits = model(x)
        cls = 0                                                      # logits.argmax(1).item()
        attr = nt.attribute(x, nt_type="smoothgrad", nt_samples=50, stdevs=0.15, target=cls)
        print(path, "saliency done")
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
