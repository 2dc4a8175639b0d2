"""run.py -- a PhD student's fork of sthalles/SimCLR (the popular PyTorch SimCLR: ResNet backbone, 2-layer MLP
projection head, InfoNCE over the 2N views of a batch, Adam, a GradScaler).  The repository trains on STL10 at
96 px with ResNet-18; the fork adds an ImageNet-100 folder dataset at 224 px and runs ResNet-50 on the lab's
A100-SXM4-40GB (39.59 GiB as PyTorch reports it):

    python run.py -data /datasets/imagenet100 --dataset-name imagenet100 -a resnet50 \\
        --batch-size 256 --epochs 200 --n-views 2 --temperature 0.2 --gpu-index 0

The training step, as the repository has it (simclr.py):

    for images, _ in tqdm(train_loader):
        images = torch.cat(images, dim=0)
        images = images.to(self.args.device)
        with autocast(enabled=self.args.fp16_precision):
            features = self.model(images)
            logits, labels = self.info_nce_loss(features)
            loss = self.criterion(logits, labels)
        self.optimizer.zero_grad()
        scaler.scale(loss).backward()
        ...

`--fp16-precision` is a store_true flag, off unless given; the README's example command does not pass it, nor
does the student.  So the first forward runs 2 x 256 = 512 images of 224 x 224 through ResNet-50 in float32:
about 85 MB of saved activations per image, 43 GB in all, on a 40 GB card.  The model (28M parameters with the
2048-2048-128 head, 112 MB) and Adam's state (not made yet) are nothing; the job fails in layer3 of the very
first forward pass.

An expert: the activations of a float32 forward of 512 images.  Turn on the repository's own
`--fp16-precision` (autocast + GradScaler are already wired; on an A100 bf16 autocast works as well): the
activations halve to ~22 GB and the batch fits with room.  Gradient checkpointing of the ResNet stages is the
next lever.  Do NOT answer with "smaller batch + gradient accumulation": for a contrastive loss the negatives
of a sample are the other samples of the same forward, so accumulating 4 batches of 64 trains with 127
negatives instead of 511 (and BatchNorm statistics over 128 instead of 512): a different, weaker objective, not
the same one in less memory.  If the batch truly cannot fit, the contrastive-specific way to keep 512 negatives
is a gradient cache (GradCache: embed the batch without a graph in chunks, then recompute chunk by chunk).
Wrong: smaller batch with accumulation (changes the loss), expandable_segments / empty_cache (nothing cached
or fragmented: the live activations fill the card), inference_mode (training), quantization, CPU offload,
ZeRO/FSDP or an 8-bit optimizer (the model and its optimizer are 0.3 GB), flash attention (no attention).
"""
import argparse
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, named as the real API: torch.nn.BatchNorm2d, ReLU, MaxPool2d, AdaptiveAvgPool2d, Linear,
# Sequential, CrossEntropyLoss, torch.optim.Adam.  Compiled into torch's file (as PyTorch's are C++ or torch
# code) so that the failing Python line is the program's own.
_NN = """
class BatchNorm2d(Module):
    def __init__(self, num_features, eps=1e-05, momentum=0.1):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(num_features * 4, device="cuda"))
        self.bias = Parameter(torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_mean", torch.empty(num_features * 4, device="cuda"))
        self.register_buffer("running_var", torch.empty(num_features * 4, device="cuda"))

    def forward(self, input):
        out = torch.empty_like(input)          # batch_norm: a new tensor of the input's size and dtype
        out._saved = input                     # saved for backward
        return torch._derive(out, input)


class ReLU(Module):
    def __init__(self, inplace=False):
        Module.__init__(self)
        self.inplace = inplace

    def forward(self, input):
        if self.inplace:
            return input
        out = torch.empty_like(input)
        out._saved = input
        return torch._derive(out, input)


class MaxPool2d(Module):
    def __init__(self, kernel_size, stride=None, padding=0):
        Module.__init__(self)
        self.stride = stride or kernel_size

    def forward(self, input):
        out = torch.empty(max(input.nbytes // (self.stride * self.stride), 512), device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return torch._derive(out, input)


class AdaptiveAvgPool2d(Module):
    def __init__(self, output_size):
        Module.__init__(self)

    def forward(self, input, spatial=49):
        out = torch.empty(max(input.nbytes // spatial, 512), device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return torch._derive(out, input)


class Linear(Module):
    def __init__(self, in_features, out_features, bias=True):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features * 4, device="cuda"))
        self.bias = Parameter(torch.empty(out_features * 4, device="cuda")) if bias else None

    def forward(self, input):
        out = torch.empty(max(input.nbytes * self.out_features // self.in_features, 512), device=input.device)
        out._dtype = input.dtype
        out._saved = input
        return torch._derive(out, input)


class Sequential(Module):
    def __init__(self, *mods):
        Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def forward(self, input):
        for m in self._modules.values():
            input = m(input)
        return input


class CrossEntropyLoss(Module):
    def forward(self, input, target):
        return torch.nn.functional.cross_entropy(input, target)
"""
_ns = dict(vars(nn))
_ns["torch"] = torch
exec(compile(_NN, torch.__file__, "exec"), _ns)
for _k in ("BatchNorm2d", "ReLU", "MaxPool2d", "AdaptiveAvgPool2d", "Linear", "Sequential", "CrossEntropyLoss"):
    setattr(nn, _k, _ns[_k])


class Adam(torch.optim.AdamW):
    """torch.optim.Adam: exp_avg and exp_avg_sq per parameter, made at the first step (as AdamW)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0):
        torch.optim.AdamW.__init__(self, params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


torch.optim.Adam = Adam
# ----

MiB = 1 << 20


# ---------------------------------------------------------------- torchvision.models.resnet50, as torchvision has it
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

        out = self.conv1(x)
        out = self.bn1(out)
        out = self.relu(out)

        out = self.conv2(out)
        out = self.bn2(out)
        out = self.relu(out)

        out = self.conv3(out)
        out = self.bn3(out)

        if self.downsample is not None:
            identity = self.downsample(x)
            out._saved_identity = identity      # the add's other input, alive with the graph

        # out += identity (in place)
        out = self.relu(out)

        return out


class ResNet(nn.Module):
    def __init__(self, layers=(3, 4, 6, 3), num_classes=1000):
        nn.Module.__init__(self)
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, self.inplanes, kernel_size=7, stride=2, padding=3, bias=False, device="cuda")
        self.bn1 = nn.BatchNorm2d(self.inplanes)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(conv1x1(self.inplanes, planes * Bottleneck.expansion, stride),
                                       nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        for _ in range(1, blocks):
            layers.append(Bottleneck(self.inplanes, planes))
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.conv1(x)
        x = self.bn1(x)
        x = self.relu(x)
        x = self.maxpool(x)

        x = self.layer1(x)
        x = self.layer2(x)
        x = self.layer3(x)
        x = self.layer4(x)

        x = self.avgpool(x)
        x = self.fc(x)
        return x


def resnet50(pretrained=False, num_classes=1000):
    return ResNet((3, 4, 6, 3), num_classes=num_classes)


# ---------------------------------------------------------------- models/resnet_simclr.py
class ResNetSimCLR(nn.Module):
    def __init__(self, base_model, out_dim):
        nn.Module.__init__(self)
        self.resnet_dict = {"resnet50": resnet50}
        self.backbone = self.resnet_dict[base_model](pretrained=False, num_classes=out_dim)
        dim_mlp = self.backbone.fc.in_features
        # add mlp projection head
        self.backbone.fc = nn.Sequential(nn.Linear(dim_mlp, dim_mlp), nn.ReLU(), self.backbone.fc)

    def forward(self, x):
        return self.backbone(x)


# ---------------------------------------------------------------- data: ImageNet-100, two augmented views
class ContrastiveLearningViewGenerator(object):
    def __init__(self, n_views=2):
        self.n_views = n_views


class HostBatch(object):
    """One view of a batch as the DataLoader yields it (pinned host memory, float32 [B, 3, 224, 224])."""

    def __init__(self, n, size=224):
        self.n, self.size = n, size


def _cat_views_to_device(images, device):
    """torch.cat(images, dim=0).to(device): the 2N views in one float32 tensor on the GPU."""
    n = sum(v.n for v in images)
    return torch.empty(n * 3 * images[0].size * images[0].size * 4, device=device)


def train_loader(batch_size, n_views, steps=3):
    for _ in range(steps):
        yield [HostBatch(batch_size) for _ in range(n_views)], None


# ---------------------------------------------------------------- simclr.py
class SimCLR(object):
    def __init__(self, *args, **kwargs):
        self.args = kwargs["args"]
        self.model = kwargs["model"]
        self.optimizer = kwargs["optimizer"]
        self.scheduler = kwargs["scheduler"]
        self.criterion = nn.CrossEntropyLoss()

    def info_nce_loss(self, features):
        n = self.args.n_views * self.args.batch_size
        # labels, F.normalize, similarity_matrix = features @ features.T, masks, positives/negatives
        similarity_matrix = torch.empty(n * n * 4, device="cuda")
        similarity_matrix._saved = features
        similarity_matrix = torch._derive(similarity_matrix, features)
        logits = torch.empty(n * n * 4, device="cuda")
        logits._saved = similarity_matrix
        logits = torch._derive(logits, similarity_matrix)
        labels = torch.empty(n * 8, device="cuda")
        return logits, labels

    def train(self, loader):
        scaler = torch.cuda.amp.GradScaler(enabled=self.args.fp16_precision)
        n_iter = 0
        print("Start SimCLR training for %d epochs." % self.args.epochs)
        print("Training with gpu: %s." % self.args.disable_cuda)

        for epoch_counter in range(self.args.epochs):
            for images, _ in loader:
                images = _cat_views_to_device(images, self.args.device)     # torch.cat(images, dim=0).to(device)

                with torch.cuda.amp.autocast(enabled=self.args.fp16_precision):
                    features = self.model(images)
                    logits, labels = self.info_nce_loss(features)
                    loss = self.criterion(logits, labels)

                self.optimizer.zero_grad()

                scaler.scale(loss).backward()

                scaler.step(self.optimizer)
                scaler.update()
                n_iter += 1
            break


def main():
    parser = argparse.ArgumentParser(description="PyTorch SimCLR")
    parser.add_argument("-data", metavar="DIR", default="/datasets/imagenet100")
    parser.add_argument("--dataset-name", default="imagenet100")
    parser.add_argument("-a", "--arch", default="resnet50")
    parser.add_argument("-j", "--workers", default=12, type=int)
    parser.add_argument("--epochs", default=200, type=int)
    parser.add_argument("-b", "--batch-size", default=256, type=int)
    parser.add_argument("--lr", "--learning-rate", default=0.0003, type=float)
    parser.add_argument("--wd", "--weight-decay", default=1e-4, type=float)
    parser.add_argument("--disable-cuda", action="store_true")
    parser.add_argument("--fp16-precision", action="store_true",
                        help="Whether or not to use 16-bit precision GPU training.")
    parser.add_argument("--out_dim", default=128, type=int)
    parser.add_argument("--temperature", default=0.2, type=float)
    parser.add_argument("--n-views", default=2, type=int)
    parser.add_argument("--gpu-index", default=0, type=int)
    args = parser.parse_args()
    args.device = "cuda"
    torch.cuda.set_device(args.gpu_index)

    model = ResNetSimCLR(base_model=args.arch, out_dim=args.out_dim)
    optimizer = torch.optim.Adam(model.parameters(), args.lr, weight_decay=args.wd)
    scheduler = None
    n_params = sum(p.nbytes for p in model.parameters()) // 4
    print("ResNetSimCLR(%s): %.1fM parameters; batch %d x %d views; fp16_precision=%s"
          % (args.arch, n_params / 1e6, args.batch_size, args.n_views, args.fp16_precision))

    simclr = SimCLR(model=model, optimizer=optimizer, scheduler=scheduler, args=args)
    simclr.train(train_loader(args.batch_size, args.n_views))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
