"""nnUNetv2_train Dataset219_AMOS 3d_fullres 0 -p nnUNetResEncUNetXLPlans -- a radiology research
workstation with one RTX A6000 (48 GB).  The XL residual-encoder plans target ~40 GB of VRAM (patch
192 x 192 x 192, batch 2, autocast fp16 as nnU-Net always trains; this dataset's plan peaks ~30 GB).  The same workstation runs the
group's MONAI Label server (a DeepEdit model and its cached images, ~22 GiB, started weeks ago with
`monailabel start_server`, serving the annotators' 3D Slicer) and a 3D Slicer session with GPU volume
rendering (~1.5 GiB).  nvidia-smi, had the user looked, lists both.

Iteration 0 runs out in the forward pass, in the decoder: the process holds ~23.5 GiB of activations
and weights, the two other processes 23.5 GiB of the card.  The job alone would fit the card: its first
iteration peaks at ~29.5 GiB of the 47.5 GiB a CUDA context leaves.

An expert: the memory that is missing is held by other processes on the same GPU (MONAI Label's server
and Slicer): stop the server (or move it to another GPU / schedule training for the night), then train
the XL plans; or use the L plans (24 GB target) if the server must stay.  Not mixed precision (on), not
empty_cache or expandable_segments (the job's own memory is live), not inference.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 2
PATCH = 192


class BasicBlockD(torch.nn.Module):
    """conv - instance norm - leaky relu - conv - instance norm (+ skip) - leaky relu; under autocast the
    convolutions run in fp16 and instance_norm in fp32 (autocast's fp32 list), so the norms' outputs and
    what follows them are fp32."""

    def __init__(self, cin, cout, stride=1):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.conv2 = torch.nn.Conv3d(cout, cout, 3, device="cuda")

    def forward(self, x):
        c1 = self.conv1(x)
        n1 = torch.empty(2 * c1.nbytes, device="cuda")
        n1._saved = c1
        a1 = torch.empty(2 * c1.nbytes, device="cuda")
        a1._saved = n1
        c2 = self.conv2(torch.empty(c1.nbytes, device="cuda"))     # a1 cast back to fp16 for the conv
        c2._keep = a1
        n2 = torch.empty(2 * c2.nbytes, device="cuda")
        n2._saved = c2
        out = torch.empty(c2.nbytes, device="cuda")                 # (+ skip), leaky relu, fp16 for the next conv
        out._saved = n2
        return out


class Stage(torch.nn.Module):
    def __init__(self, cin, cout, n_blocks, stride):
        torch.nn.Module.__init__(self)
        self.n = n_blocks
        self.block0 = BasicBlockD(cin, cout, stride)
        for i in range(1, n_blocks):
            setattr(self, "block%d" % i, BasicBlockD(cout, cout))

    def forward(self, x):
        for i in range(self.n):
            x = getattr(self, "block%d" % i)(x)
        return x


class DecoderStage(torch.nn.Module):
    def __init__(self, cin, cout):
        torch.nn.Module.__init__(self)
        self.transp = torch.nn.Parameter(torch.empty(cin * cout * 8 * 4, device="cuda"))   # ConvTranspose3d, stride 2
        self.cin, self.cout = cin, cout
        self.conv = BasicBlockD(2 * cout, cout)
        self.seg = torch.nn.Conv3d(cout, 16, 1, device="cuda")     # deep supervision head (15 organs + bg)

    def forward(self, x, skip):
        w = self.transp
        up = torch.empty(x.nbytes * 8 * self.cout // self.cin // 2, device="cuda")     # fp16, twice the size per dim
        up._saved = x
        cat = torch.empty(up.nbytes + skip.nbytes, device="cuda")
        cat._saved = up
        y = self.conv(cat)
        seg = self.seg(y)
        return y, seg


class ResidualEncoderUNet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        feats = [32, 64, 128, 256, 320, 320]
        blocks = [1, 3, 4, 6, 6, 6]
        self.stem = torch.nn.Conv3d(1, feats[0], 3, device="cuda")
        prev = feats[0]
        for i, (f, b) in enumerate(zip(feats, blocks)):
            setattr(self, "enc%d" % i, Stage(prev, f, b, 1 if i == 0 else 2))
            prev = f
        for i in range(4, -1, -1):
            setattr(self, "dec%d" % i, DecoderStage(feats[i + 1], feats[i]))

    def forward(self, x):
        x = self.stem(x)
        skips = []
        for i in range(6):
            x = getattr(self, "enc%d" % i)(x)
            skips.append(x)
        outs = []
        for i in range(4, -1, -1):
            x, seg = getattr(self, "dec%d" % i)(x, skips[i])
            outs.append(seg)
        return outs


def main():
    network = ResidualEncoderUNet().cuda()
    network.train()
    optimizer = torch.optim.SGD(network.parameters(), lr=1e-2, momentum=0.99, nesterov=True, weight_decay=3e-5)
    for iteration in range(250 * 1000):
        data = torch.empty(batch_size * PATCH ** 3 * 2, device="cuda")            # fp16 patches
        target = torch.empty(batch_size * PATCH ** 3 * 1, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            output = network(data)
            loss = torch.empty(512, device="cuda")                              # DC + CE, deep supervision
            loss._saved = output[-1]
            loss._params = output[-1]._params
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del data, target, output, loss


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
