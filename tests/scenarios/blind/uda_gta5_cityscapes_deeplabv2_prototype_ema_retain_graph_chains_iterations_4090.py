"""train_uda.py -- a PhD student's unsupervised domain adaptation for semantic segmentation, GTA5 -> Cityscapes,
DeepLabV2 with a ResNet-101 backbone (output stride 8, BatchNorm frozen, fp32 as in the reference code),
on their RTX 4090 (24 GiB).  Each iteration: one GTA5 crop with labels and one Cityscapes crop without,
512 x 1024; a supervised loss on the source, a self-training loss on the target's pseudo-labels, and a
prototype loss that pulls target features towards class prototypes kept as a running average:

    class ProtoEstimator:
        def update(self, feats, labels):
            means = class_means(feats, labels)                         # [19, 2048] from this target batch
            self.proto = self.momentum * self.proto + (1 - self.momentum) * means

    ...
    proto.update(feat_t, pseudo)
    loss_proto = F.cross_entropy(cosine(feat_t, proto.proto) / tau, pseudo)
    loss = loss_seg + loss_st + 0.1 * loss_proto
    loss.backward(retain_graph=True)

The prototypes are made from features that carry autograd history, so each new `proto` is a node whose
graph reaches every earlier one.  Iteration 2 raised "Trying to backward through the graph a second time
(or directly access saved tensors after they have already been freed)"; the forum answer was to pass
retain_graph=True, which made the error go away.  Now nothing a target pass saved is ever freed: every
iteration's target backbone activations (3.4 GiB a crop, most of it the 23 bottlenecks of layer3 at
64 x 128) stay reachable from proto.proto, and until `loss` is rebound the previous iteration's source
graph is alive too.  Allocated memory after each iteration: 7.3, 10.7, 14.1, 17.5 GiB.  Iteration 5 dies
in the target forward (layer3, block 21, a 32 MiB request) with 17 GiB of old graphs on a 23.5 GiB card.
(Backward also gets slower every iteration: it walks back to iteration 1.)

An expert: memory grows an iteration's activations per step because a running average keeps the autograd
graph of every batch that fed it.  Update the prototypes without history -- under torch.no_grad(), or
from feat_t.detach() (in place: self.proto.mul_(m).add_(means, alpha=1 - m)) -- and drop retain_graph=True;
then the error never appears and each iteration frees its graph.  Wrong first advice: smaller crops or a
smaller batch (it is 1 + 1), gradient checkpointing, mixed precision, empty_cache / expandable_segments
(the old graphs are live), a bigger GPU (the same growth, a few iterations later).
"""
import sys

import torch
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
F32 = 4

# --- what the stand-in torch lacks, as PyTorch has it -------------------------------------------------
# Tensor.backward: afterwards autograd frees what the graph saved, unless retain_graph.  The stand-in's graph
# is the tensors' _saved references (a tensor's own saved tensors and the nodes before it); compiled as
# torch's own code.
_BACKWARD = '''
def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    from torch import autograd
    autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
    if not (retain_graph or create_graph):
        todo = [self]
        while todo:
            x = todo.pop()
            if isinstance(x, (tuple, list)):
                todo.extend(x)
                continue
            saved = getattr(x, "_saved", None)
            if saved is None:
                continue
            x._saved = None
            todo.extend(saved if isinstance(saved, (tuple, list)) else (saved,))
'''
_ns = {}
exec(compile(_BACKWARD, torch.__file__, "exec"), _ns)
torch.Tensor.backward = _ns["backward"]


def _op(nbytes, saves=(), after=()):
    """An operation's output: with autograd on it keeps what the operation saved for backward and the graph
    before it (the earlier nodes, with what they saved), as PyTorch's grad_fn chain does."""
    out = torch.empty(nbytes, device="cuda")
    if torch.is_grad_enabled():
        out._saved = tuple(saves) + tuple(t._saved for t in after if getattr(t, "_saved", None) is not None)
    return torch._derive(out, *after)


def _argmax(t):
    """logits.argmax(1) (no graph)."""
    return torch.empty(t.nbytes // 19 // F32 * 8, device="cuda")


# --- DeepLabV2 / ResNet-101 (torchvision layout), sizes in bytes ----------------------------------------
class Conv(torch.nn.Module):
    def __init__(self, cin, cout, k):
        torch.nn.Module.__init__(self)
        self.cin, self.cout = cin, cout
        self.weight = torch.nn.Parameter(torch.empty(cout * cin * k * k * F32, device="cuda"))

    def forward(self, x, hw):
        return _op(self.cout * hw * F32, saves=(x,), after=(x,))


class FrozenBN(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.c = c
        self.weight = torch.nn.Parameter(torch.empty(c * F32, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(c * F32, device="cuda"))

    def forward(self, x, hw):
        return _op(self.c * hw * F32, saves=(x,), after=(x,))   # ReLU after it is in place


class Bottleneck(torch.nn.Module):
    def __init__(self, cin, mid, cout, downsample=False):
        torch.nn.Module.__init__(self)
        self.conv1, self.bn1 = Conv(cin, mid, 1), FrozenBN(mid)
        self.conv2, self.bn2 = Conv(mid, mid, 3), FrozenBN(mid)
        self.conv3, self.bn3 = Conv(mid, cout, 1), FrozenBN(cout)
        if downsample:
            self.downsample = torch.nn.Module()
            self.downsample.conv, self.downsample.bn = Conv(cin, cout, 1), FrozenBN(cout)
        self.has_downsample = downsample
        self.cout = cout

    def forward(self, x, hw_in, hw):
        out = self.bn1(self.conv1(x, hw_in), hw_in)
        out = self.bn2(self.conv2(out, hw), hw)
        out = self.bn3(self.conv3(out, hw), hw)
        identity = self.downsample.bn(self.downsample.conv(x, hw), hw) if self.has_downsample else x
        return _op(self.cout * hw * F32, after=(out, identity))                   # out + identity, ReLU


class ResNet101(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv1, self.bn1 = Conv(3, 64, 7), FrozenBN(64)
        spec = [("layer1", 3, 64, 64, 256), ("layer2", 4, 256, 128, 512), ("layer3", 23, 512, 256, 1024),
                ("layer4", 3, 1024, 512, 2048)]
        self.stages = []
        for name, n, cin, mid, cout in spec:
            blocks = [Bottleneck(cin if i == 0 else cout, mid, cout, downsample=(i == 0)) for i in range(n)]
            stage = torch.nn.Module()
            for i, b in enumerate(blocks):
                stage._modules[str(i)] = b
            setattr(self, name, stage)
            self.stages.append((name, blocks))

    def forward(self, image, H, W):
        x = self.bn1(self.conv1(image, H * W // 4), H * W // 4)                  # stride 2
        x = _op(64 * H * W // 16 * F32, after=(x,))                               # maxpool, stride 4
        hw = {"layer1": (H * W // 16, H * W // 16), "layer2": (H * W // 16, H * W // 64),
              "layer3": (H * W // 64, H * W // 64), "layer4": (H * W // 64, H * W // 64)}   # dilated: OS 8
        for name, blocks in self.stages:
            hw_in, hw_out = hw[name]
            for i, block in enumerate(blocks):
                x = block(x, hw_in if i == 0 else hw_out, hw_out)
        return x


class ASPPClassifier(torch.nn.Module):
    def __init__(self, num_classes=19):
        torch.nn.Module.__init__(self)
        self.branches = [Conv(2048, num_classes, 3) for _ in range(4)]            # dilations 6, 12, 18, 24
        for i, b in enumerate(self.branches):
            self._modules["conv2d_list_%d" % i] = b

    def forward(self, x, hw):
        outs = [b(x, hw) for b in self.branches]
        return _op(19 * hw * F32, after=tuple(outs))


class DeepLabV2(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = ResNet101()
        self.classifier = ASPPClassifier(19)

    def forward(self, image, H=512, W=1024):
        feat = self.backbone(image, H, W)
        return feat, self.classifier(feat, H * W // 64)


# --- the training script -----------------------------------------------------------------------------
def upsample(logits, H=512, W=1024):
    return _op(19 * H * W * F32, after=(logits,))


def class_means(feats, labels, num_classes=19):
    """Masked average of the features per (pseudo-)class: one_hot(labels) @ feats / counts."""
    onehot = _op(num_classes * feats.nbytes // 2048)
    return _op(num_classes * 2048 * F32, saves=(feats, onehot), after=(feats,))


def cosine(feats, protos):
    return _op(feats.nbytes // 2048 * 19, saves=(feats, protos), after=(feats, protos))


class ProtoEstimator(object):
    def __init__(self, dim=2048, num_classes=19, momentum=0.99):
        self.momentum = momentum
        self.proto = torch.empty(num_classes * dim * F32, device="cuda")

    def update(self, feats, labels):
        means = class_means(feats, labels)
        self.proto = _op(self.proto.nbytes, after=(self.proto, means))   # momentum * proto + (1 - m) * means


def gta5_cityscapes(n, H=512, W=1024):
    for _ in range(n):
        yield (torch.empty(3 * H * W * F32, device="cuda"), torch.empty(H * W * 8, device="cuda"),
               torch.empty(3 * H * W * F32, device="cuda"))


def main():
    batch_size = 1
    model = DeepLabV2().cuda()
    model.train()
    optimizer = torch.optim.SGD(model.parameters(), lr=2.5e-4, momentum=0.9, weight_decay=5e-4)
    proto = ProtoEstimator()
    tau = 0.1
    for i_iter, (images_s, labels_s, images_t) in enumerate(gta5_cityscapes(250_000)):
        optimizer.zero_grad()
        feat_s, pred_s = model(images_s)
        loss_seg = F.cross_entropy(upsample(pred_s), labels_s)

        feat_t, pred_t = model(images_t)
        pseudo = _argmax(pred_t)
        loss_st = F.cross_entropy(upsample(pred_t), pseudo)
        proto.update(feat_t, pseudo)
        loss_proto = F.cross_entropy(cosine(feat_t, proto.proto), pseudo)

        loss = _op(4, after=(loss_seg, loss_st, loss_proto))     # loss_seg + loss_st + 0.1 * loss_proto
        loss.backward(retain_graph=True)
        optimizer.step()
        print("iter %d  allocated %.1f GiB  reserved %.1f GiB"
              % (i_iter + 1, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
