"""tune_vicreg.py -- a hyper-parameter sweep of VICReg (facebookresearch/vicreg's model and LARS, ResNet-50 with
the 8192-8192-8192 expander) on ImageNet-100, with Ray Tune on a node of A100-SXM4-80GB (79.35 GiB as PyTorch
reports it).  To get two trials per card, the sweep asks Ray for half a GPU per trial, and because Ray does not
partition GPU memory the trainable caps itself, as the team's sweep template does for every project:

    def train_vicreg(config):
        torch.cuda.set_per_process_memory_fraction(0.5)     # two trials share each GPU
        ...
        with torch.cuda.amp.autocast():
            loss = model.forward(x, y)

    tuner = tune.Tuner(
        tune.with_resources(train_vicreg, {"cpu": 8, "gpu": 0.5}),
        param_space={"base_lr": tune.loguniform(0.05, 0.6), "sim_coeff": tune.choice([15.0, 25.0]),
                     "std_coeff": tune.choice([15.0, 25.0]), "batch_size": tune.choice([256, 512])},
        tune_config=tune.TuneConfig(num_samples=24, scheduler=ASHAScheduler(metric="knn_top1", mode="max")))

Every trial with batch_size 256 runs (24.6 GiB reserved at its peak; 25.3 GiB in nvidia-smi with its context).
Every trial with batch_size 512 errors in its first step, in layer3 of the backbone's forward of the second
view, with PyTorch's message "... 40626.50 MiB allowed; ..." -- while the card has 79.35 GiB and the trial
sharing it holds 25.3 GiB: 53.5 GiB were there for this one.  The batch-512 trial needs 46.4 GiB at its peak
(bf16 activations of 2 x 512 images through ResNet-50, the 151M-parameter expander, its gradients and LARS
state).  It is the trial's own cap (0.5 x 79.35 GiB) that refuses, not the
card, and not the neighbour.

An expert: the allocator refused at the cap the sweep set itself (set_per_process_memory_fraction(0.5));
the device had the memory.  Give the batch-512 trials a whole GPU (resources {"gpu": 1}) with the cap lifted,
or size the fraction by the trial's batch size (0.6 = 47.6 GiB here, and the batch-256 neighbour keeps its
25.3 GiB) -- i.e. raise or remove the cap for these trials.
Wrong first advice: a smaller batch (batch_size is the hyper-parameter being swept: shrinking it removes the
point of the trial), stopping the other process (it is the sweep's other trial, and the cap would refuse
anyway), mixed precision (already under autocast), expandable_segments / empty_cache (nothing cached or
fragmented), a bigger GPU (the card has 1.7 times what the trial needs), gradient checkpointing first (it
would squeeze the trial under a cap that is the sweep's own choice, at 30% more time per trial), quantization,
ZeRO/FSDP.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: torch.nn.BatchNorm2d, BatchNorm1d, ReLU, MaxPool2d,
# AdaptiveAvgPool2d, Linear, Sequential, and autocast's cast of a float32 input to a convolution (conv2d is on
# autocast's lower-precision list: the input is cast and the output is bfloat16).  Compiled into torch's file
# so that the failing Python line is the program's own.
_NN = """
def _like(input, nbytes=None):
    out = torch.empty(max(int(input.nbytes if nbytes is None else nbytes), 512), device=input.device)
    out._dtype = input.dtype
    out._saved = input
    return torch._derive(out, input)


class _BatchNorm(Module):
    def __init__(self, num_features, eps=1e-05, momentum=0.1):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device="cuda"))
        self.bias = Parameter(torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_mean", torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_var", torch.empty(num_features * 4, device="cuda"))

    def forward(self, input):
        return _like(input)


class BatchNorm2d(_BatchNorm):
    pass


class BatchNorm1d(_BatchNorm):
    pass


class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)
        self.inplace = inplace

    def forward(self, input):
        return input if self.inplace else _like(input)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        Module.__init__(self)
        self.stride = stride or kernel_size

    def forward(self, input):
        return _like(input, input.nbytes // (self.stride * self.stride))


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        Module.__init__(self)

    def forward(self, input, spatial=49):
        return _like(input, input.nbytes // spatial)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features * 4, device="cuda"))
        self.bias = Parameter(torch.empty(out_features * 4, device="cuda")) if bias else None

    def forward(self, input):
        return _like(input, input.nbytes * self.out_features // self.in_features)


class Identity(Module):
    def forward(self, input):
        return input


class Sequential(Module):
    def __init__(self, *mods):
        Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


def _conv_forward_autocast(self, input, weight, bias):
    if torch.is_autocast_enabled() and input.dtype == torch.float32:
        cast = torch.empty(input.nbytes // 2, device=input.device)
        cast._dtype = torch.bfloat16
        input = torch._derive(cast, input)
    out = _plain_conv_forward(self, input, weight, bias)
    out._dtype = input.dtype
    return out
"""
_ns = dict(vars(nn))
_ns["torch"] = torch
_ns["_plain_conv_forward"] = nn.Conv2d._conv_forward
exec(compile(_NN, torch.__file__, "exec"), _ns)
for _k in ("BatchNorm2d", "BatchNorm1d", "ReLU", "MaxPool2d", "AdaptiveAvgPool2d", "Linear", "Identity",
           "Sequential"):
    setattr(nn, _k, _ns[_k])
nn.Conv2d._conv_forward = _ns["_conv_forward_autocast"]

# what Tensor.backward does in PyTorch after the gradients are made (retain_graph=False): the graph's saved
# tensors are freed
_BW = """
def _free_saved(root):
    todo, seen = [root], set()
    while todo:
        t = todo.pop()
        if id(t) in seen or not isinstance(t, Tensor):
            continue
        seen.add(id(t))
        for name in ("_saved", "_saved_identity"):
            s = t.__dict__.get(name)
            if isinstance(s, (tuple, list)):
                todo.extend(s)
            elif s is not None:
                todo.append(s)
            if name in t.__dict__:
                setattr(t, name, None)
        if t._base is not None:
            todo.append(t._base)


_plain_backward = Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        _free_saved(self)
"""
_bw = vars(torch)
exec(compile(_BW, torch.__file__, "exec"), _bw)
torch.Tensor.backward = _bw["_backward"]
# ----


# ---------------------------------------------------------------- vicreg/resnet.py (torchvision's, fc removed)
def conv3x3(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=3, stride=stride, padding=1, bias=False, device="cuda")


def conv1x1(in_planes, out_planes, stride=1):
    return nn.Conv2d(in_planes, out_planes, kernel_size=1, stride=stride, bias=False, device="cuda")


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        nn.Module.__init__(self)
        self.conv1 = conv1x1(inplanes, planes)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = conv3x3(planes, planes, stride)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = conv1x1(planes, planes * self.expansion)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        if self.downsample is not None:
            identity = self.downsample(x)
            out._saved_identity = identity
        # out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), zero_init_residual=True):
        nn.Module.__init__(self)
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, kernel_size=7, stride=2, padding=3, bias=False, device="cuda")
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * 4:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * 4, stride), nn.BatchNorm2d(planes * 4))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * 4
        for _ in range(1, blocks):
            layers.append(Bottleneck(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)
        return self.avgpool(x)           # torch.flatten(x, 1)


def resnet50(**kwargs):
    return ResNet((3, 4, 6, 3), **kwargs), 2048


# ---------------------------------------------------------------- vicreg/main_vicreg.py
def Projector(args, embedding):
    mlp_spec = "%d-%s" % (embedding, args["mlp"])
    layers = []
    f = list(map(int, mlp_spec.split("-")))
    for i in range(len(f) - 2):
        layers.append(nn.Linear(f[i], f[i + 1]))
        layers.append(nn.BatchNorm1d(f[i + 1]))
        layers.append(nn.ReLU(True))
    layers.append(nn.Linear(f[-2], f[-1], bias=False))
    return nn.Sequential(*layers)


class VICReg(nn.Module):
    def __init__(self, args):
        nn.Module.__init__(self)
        self.args = args
        self.num_features = int(args["mlp"].split("-")[-1])
        self.backbone, self.embedding = resnet50(zero_init_residual=True)
        self.projector = Projector(args, self.embedding)

    def forward(self, x, y):
        x = self.projector(self.backbone(x))
        y = self.projector(self.backbone(y))

        # repr_loss = F.mse_loss(x, y); x = torch.cat(FullGatherLayer.apply(x), dim=0) (one rank)
        # x = x - x.mean(dim=0); std_x = torch.sqrt(x.var(dim=0) + 0.0001); std_loss = ...
        cov_x = torch.empty(self.num_features * self.num_features * 4, device="cuda")  # (x.T @ x) / (B - 1)
        cov_x._saved = x
        cov_x = torch._derive(cov_x, x)
        cov_y = torch.empty(self.num_features * self.num_features * 4, device="cuda")
        cov_y._saved = y
        cov_y = torch._derive(cov_y, y)
        loss = torch.empty(512, device="cuda")       # sim_coeff * repr + std_coeff * std + cov_coeff * cov
        loss._saved = (cov_x, cov_y)
        return torch._derive(loss, cov_x, cov_y)


class LARS(torch.optim.Optimizer):
    """vicreg's LARS: a momentum buffer "mu" per parameter, made at the first step."""

    def __init__(self, params, lr, weight_decay=0, momentum=0.9, eta=0.001, weight_decay_filter=None,
                 lars_adaptation_filter=None):
        defaults = dict(lr=lr, weight_decay=weight_decay, momentum=momentum, eta=eta)
        torch.optim.Optimizer.__init__(self, params, defaults)

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p.grad is None:
                continue
            param_state = self.state.setdefault(p, {})
            if "mu" not in param_state:
                param_state["mu"] = torch.empty_like(p)       # torch.zeros_like(p)


def _view_to_cuda(batch_size, res=224):
    """x.cuda(non_blocking=True): one augmented view, float32 [B, 3, 224, 224]."""
    return torch.empty(batch_size * 3 * res * res * 4, device="cuda")


def imagenet100_loader(batch_size, steps=2):
    for _ in range(steps):
        yield (None, None), None


def train_vicreg(config):
    torch.cuda.set_per_process_memory_fraction(0.5)     # two trials share each GPU
    args = {"mlp": "8192-8192-8192", "batch_size": config["batch_size"], "base_lr": config["base_lr"],
            "wd": 1e-6, "sim_coeff": config["sim_coeff"], "std_coeff": config["std_coeff"], "cov_coeff": 1.0}
    model = VICReg(args)
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("trial %s: VICReg resnet50 + expander %s, %.1fM parameters, batch %d" % (
        config["trial_id"], args["mlp"], n_params / 1e6, args["batch_size"]))
    optimizer = LARS(model.parameters(), lr=0, weight_decay=args["wd"])
    scaler = torch.cuda.amp.GradScaler()
    for step, ((x, y), _) in enumerate(imagenet100_loader(args["batch_size"])):
        x = _view_to_cuda(args["batch_size"])
        y = _view_to_cuda(args["batch_size"])
        # lr = adjust_learning_rate(args, optimizer, loader, step)
        optimizer.zero_grad()
        with torch.cuda.amp.autocast():
            loss = model.forward(x, y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        # tune.report({"loss": loss.item(), ...}); kNN top-1 every epoch
        print("trial %s step %d: max reserved %.2f GiB" % (config["trial_id"], step,
                                                         torch.cuda.max_memory_reserved() / 2 ** 30))


if __name__ == "__main__":
    # What Ray Tune runs in the trial's worker process (ray::ImplicitFunc.train) for the failing trial; the trial
    # sharing this GPU (batch 256) is another worker process.
    trial = {"trial_id": "train_vicreg_5c1e2_00007", "base_lr": 0.31, "sim_coeff": 25.0, "std_coeff": 25.0,
             "batch_size": int(sys.argv[1]) if len(sys.argv) > 1 else 512}
    try:
        train_vicreg(trial)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
