"""sharpness.py -- a researcher studies whether stronger RandAugment gives flatter minima: for four ImageNet
ResNet-50 checkpoints (RandAugment magnitude 0, 5, 9, 15; 90 epochs each, trained elsewhere) she computes
the top Hessian eigenvalue and the Hessian trace with PyHessian, on the lab's V100 32GB.  PyHessian's
README passes one batch (`data=(inputs, targets)`); to get a less noisy estimate she builds one fixed batch
of 512 validation images (224 px, float32), the same for every checkpoint:

    inputs, targets = fixed_batch(val_set, n=512, seed=0)
    for m in (0, 5, 9, 15):
        model = resnet50(); model.load_state_dict(torch.load(ckpt(m), map_location="cpu")["model"])
        model = model.cuda()
        hessian_comp = hessian(model, criterion, data=(inputs, targets), cuda=True)
        top_eigenvalues, _ = hessian_comp.eigenvalues(top_n=1)

hessian.__init__ puts the model in eval mode ("make model is in evaluation model"), runs the forward pass
on the whole batch with autograd on and calls loss.backward(create_graph=True): the Hessian-vector products
of the power iteration differentiate through that graph.  ResNet-50 keeps ~85 MB of activations per 224-px
image in float32 for backward: 43 GB for 512 images, on a card with 31.7 GiB.  The first checkpoint's
forward pass fails in layer3, before any backward.  At the failure the model is in eval mode, autograd
is on, no optimizer exists -- it looks like an evaluation run that forgot torch.no_grad().

An expert: it is not; the graph is the point -- a Hessian needs autograd (and create_graph), so
no_grad / inference_mode would break the computation.  Use less data per pass: PyHessian's `dataloader=`
mode (a DataLoader of 64-image batches over the same 512 images) accumulates the Hessian-vector products
over the mini-batches, which gives the same 512-sample Hessian with the memory of one 64-image batch (the
eigenvalue estimate does not need the 512 images in one graph).  Wrong first advice: inference_mode /
no_grad, mixed precision (fp16 second derivatives are too coarse for eigenvalues), empty_cache or
expandable_segments (nothing is cached), an 8-bit optimizer or ZeRO (there is no optimizer), gradient
checkpointing (double backward through recomputation: possible, but not where to start).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ------------------------------------------------------------------------------------------------
# Stand-ins for what the stand-in torch lacks, mirroring the real API's shape: BatchNorm2d, ReLU,
# MaxPool2d, the pooling head (the stand-in has Conv2d), torch.autograd.grad for the power iteration,
# host tensors, and PyHessian's hessian class (pyhessian/hessian.py) with the parts this script uses.
# Sizes in bytes, as the stand-in's tensors are.
# ------------------------------------------------------------------------------------------------
nn = torch.nn
F = torch.nn.functional


def _new(nbytes, inp):
    out = torch.empty(max(int(nbytes), 512), device=inp.device)
    out._saved = inp if torch.is_grad_enabled() else None
    return torch._derive(out, inp)


class BatchNorm2d(nn.Module):
    def __init__(self, num_features):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(num_features * 4))
        self.bias = nn.Parameter(torch.empty(num_features * 4))
        self.register_buffer("running_mean", torch.empty(num_features * 4))
        self.register_buffer("running_var", torch.empty(num_features * 4))

    def forward(self, x):
        return _new(x.nbytes, x)


class ReLU(nn.Module):
    def __init__(self, inplace=False):
        nn.Module.__init__(self)

    def forward(self, x):
        return x                                    # inplace=True, as torchvision builds it


class MaxPool2d(nn.Module):
    def __init__(self, kernel_size, stride, padding=0):
        nn.Module.__init__(self)

    def forward(self, x):
        return _new(x.nbytes // 4, x)


class Linear(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(cin * cout * 4))
        self.bias = nn.Parameter(torch.empty(cout * 4))
        self.cin, self.cout = cin, cout

    def forward(self, x):
        return _new(x.nbytes // self.cin * self.cout // 49, x)      # after the 7x7 average pool


class HostTensor(object):
    is_cuda = False

    def __init__(self, nbytes):
        self.nbytes = nbytes

    def cuda(self, non_blocking=False):
        return torch.empty(self.nbytes)


def _grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True):
    """torch.autograd.grad: one tensor per input (the Hessian-vector product, in the power iteration)."""
    return [torch.empty_like(p) for p in inputs]


torch.autograd.grad = _grad


# ---- torchvision.models.resnet (as torchvision lays it out) ----
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False)


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False)


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        nn.Module.__init__(self)
        width = planes
        self.conv1 = conv1x1(inplanes, width)
        self.bn1 = BatchNorm2d(width)
        self.conv2 = conv3x3(width, width, stride)
        self.bn2 = BatchNorm2d(width)
        self.conv3 = conv1x1(width, planes * self.expansion)
        self.bn3 = BatchNorm2d(planes * self.expansion)
        self.relu = ReLU(inplace=True)
        if downsample is not None:
            self.downsample = downsample
        self.has_downsample = downsample is not None

    def forward(self, x):
        identity = x
        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)
        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)
        out = self.conv3(out)
        out = self.bn3(out)
        if self.has_downsample:
            identity = self.downsample(x)
        out = torch._derive(out, identity)          # out += identity (in place)
        out = self.relu(out)
        return out


class Sequential(nn.Module):
    def __init__(self, *mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)
        self.n = len(mods)

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, str(i))(x)
        return x


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        nn.Module.__init__(self)
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = BatchNorm2d(64)
        self.relu = ReLU(inplace=True)
        self.maxpool = MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.fc = Linear(512 * 4, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = Sequential(conv1x1(self.inplanes, planes * 4, stride), BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        for _ in range(1, blocks):
            layers.append(Bottleneck(self.inplanes, planes))
        return Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        return self.fc(x)


def resnet50():
    return ResNet()


class CrossEntropyLoss(object):
    def __call__(self, outputs, targets):
        return _new(512, outputs)


def load_checkpoint_cpu(path, model):
    """torch.load(path, map_location="cpu")["model"]: the state dict in host memory."""
    return dict((name, HostTensor(p.nbytes)) for name, p in model.named_parameters())


# ---- pyhessian/utils.py and pyhessian/hessian.py ----
def group_product(xs, ys):
    return sum(0.0 for _ in zip(xs, ys))


def normalization(v):
    return v


def get_params_grad(model):
    params = []
    grads = []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        params.append(param)
        grads.append(0. if param.grad is None else param.grad + 0.)
    return params, grads


def hessian_vector_product(gradsH, params, v):
    hv = torch.autograd.grad(gradsH, params, grad_outputs=v, only_inputs=True, retain_graph=True)
    return hv


class hessian():
    """The class to compute: i) the top 1 (n) eigenvalue(s) of the neural network; ii) the trace of the
    entire neural network; iii) the estimated eigenvalue density."""

    def __init__(self, model, criterion, data=None, dataloader=None, cuda=True):
        assert (data is not None and dataloader is None) or (data is None and dataloader is not None)
        self.model = model.eval()  # make model is in evaluation model
        self.criterion = criterion
        if data is not None:
            self.data = data
            self.full_dataset = False
        else:
            self.data = dataloader
            self.full_dataset = True
        self.device = "cuda" if cuda else "cpu"

        # pre-processing for single batch case to simplify the computation.
        if not self.full_dataset:
            self.inputs, self.targets = self.data
            if self.device == "cuda":
                self.inputs, self.targets = self.inputs.cuda(), self.targets.cuda()

            # if we only compute the Hessian information for a single batch data, we can re-use the gradients.
            outputs = self.model(self.inputs)
            loss = self.criterion(outputs, self.targets)
            loss.backward(create_graph=True)

        # this step is used to extract the parameters from the model
        params, gradsH = get_params_grad(self.model)
        self.params = params
        self.gradsH = gradsH  # gradient used for Hessian computation

    def eigenvalues(self, maxIter=100, tol=1e-3, top_n=1):
        eigenvalues = []
        eigenvectors = []
        for _ in range(top_n):
            v = [torch.empty_like(p) for p in self.params]
            for i in range(maxIter):
                Hv = hessian_vector_product(self.gradsH, self.params, v)
                v = normalization(Hv)
            eigenvalues.append(0.0)
            eigenvectors.append(v)
        return eigenvalues, eigenvectors


# ------------------------------------------------------------------------------------------------
# sharpness.py
# ------------------------------------------------------------------------------------------------
def fixed_batch(n, seed=0):
    """n ImageNet val images (Resize 256, CenterCrop 224, Normalize), stacked on the CPU, and their labels."""
    return HostTensor(n * 3 * 224 * 224 * 4), HostTensor(n * 8)


criterion = CrossEntropyLoss()
inputs, targets = fixed_batch(512, seed=0)
results = {}
try:
    for magnitude in (0, 5, 9, 15):
        model = resnet50()
        model.load_state_dict(load_checkpoint_cpu("runs/rn50_ra_m%d/checkpoint_ep90.pth" % magnitude, model))
        model = model.cuda()
        hessian_comp = hessian(model, criterion, data=(inputs, targets), cuda=True)
        top_eigenvalues, _ = hessian_comp.eigenvalues(top_n=1)
        results[magnitude] = top_eigenvalues[0]
        print("RandAugment m=%d: top Hessian eigenvalue %.2f" % (magnitude, top_eigenvalues[0]))
        del hessian_comp, model
        torch.cuda.empty_cache()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
