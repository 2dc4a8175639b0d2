"""upscale_folder.py -- a small batch job that runs Real-ESRGAN x4plus (RRDBNet, 16.7M params, fp16)
over a folder of a client's product pictures on a Colab T4 (15 GiB), with plain
`LD_PRELOAD=liboomguard.so`.  The script is Real-ESRGAN's inference_realesrgan.py with its defaults:
half precision, batch 1, and --tile 0 (no tiling: the whole image in one pass):

    upsampler = RealESRGANer(scale=4, model_path=..., model=RRDBNet(...), tile=0, half=True)
    for path in sorted(glob("in/*")):
        img = cv2.imread(path)
        output, _ = upsampler.enhance(img, outscale=4)      # under torch.no_grad()

The folder holds 800x600 web pictures, which go through fine (the 4x stage peaks at ~2 GiB), and one
8000x6000 photo straight from the client's 48 MP camera.  For that single image the first conv
alone makes 6 GiB of features (64 channels at 48 MP), and the first dense block's torch.cat of the
features and the first conv's output (96 channels, 8.6 GiB) cannot be made: the job dies on the 24th
image, nothing else running, under no_grad, in fp16, with the cache of the small images given back.
An expert: tile the image (--tile 400: the network runs on overlapping 400x400 crops and the output
is stitched; memory stays that of a small image), or downscale that photo first.  Not a smaller
batch (it is 1), not inference mode or mixed precision (already), not checkpointing (no training),
not a cache or fragmentation problem.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

batch_size = 1


def released(t):
    """an output computed under no_grad: autograd saves nothing for it (the stand-in's conv and
    interpolate keep their input as if for backward; with autograd off PyTorch does not)."""
    t._saved = None
    return t


def cat(tensors):
    """torch.cat along channels: a new tensor of the inputs' bytes."""
    return torch.empty(sum(t.nbytes for t in tensors) // 2, dtype=torch.float16, device="cuda")


class ResidualDenseBlock(torch.nn.Module):
    def __init__(self, nf=64, gc=32):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Conv2d(nf, gc, 3)
        self.conv2 = torch.nn.Conv2d(nf + gc, gc, 3)
        self.conv3 = torch.nn.Conv2d(nf + 2 * gc, gc, 3)
        self.conv4 = torch.nn.Conv2d(nf + 3 * gc, gc, 3)
        self.conv5 = torch.nn.Conv2d(nf + 4 * gc, nf, 3)

    def forward(self, x):
        x1 = released(self.conv1(x))
        x2 = released(self.conv2(cat((x, x1))))
        x3 = released(self.conv3(cat((x, x1, x2))))
        x4 = released(self.conv4(cat((x, x1, x2, x3))))
        x5 = released(self.conv5(cat((x, x1, x2, x3, x4))))
        return torch.empty_like(x)                         # x5 * 0.2 + x


class RRDB(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.rdb1 = ResidualDenseBlock()
        self.rdb2 = ResidualDenseBlock()
        self.rdb3 = ResidualDenseBlock()

    def forward(self, x):
        out = self.rdb3(self.rdb2(self.rdb1(x)))
        return torch.empty_like(x)                         # out * 0.2 + x


class RRDBNet(torch.nn.Module):
    def __init__(self, num_block=23):
        torch.nn.Module.__init__(self)
        self.conv_first = torch.nn.Conv2d(3, 64, 3)
        self.num_block = num_block
        for i in range(num_block):
            setattr(self, "body_%d" % i, RRDB())
        self.conv_body = torch.nn.Conv2d(64, 64, 3)
        self.conv_up1 = torch.nn.Conv2d(64, 64, 3)
        self.conv_up2 = torch.nn.Conv2d(64, 64, 3)
        self.conv_hr = torch.nn.Conv2d(64, 64, 3)
        self.conv_last = torch.nn.Conv2d(64, 3, 3)

    def half(self):
        """model.half(): every weight replaced by an fp16 copy (the fp32 one freed)."""
        for m in self.modules():
            for k, p in list(m._parameters.items()):
                if p is not None:
                    m._parameters[k] = torch.nn.Parameter(
                        torch.empty(p.nbytes // 4, dtype=torch.float16, device="cuda"), requires_grad=False)
        return self

    def forward(self, x):
        feat = released(self.conv_first(x))
        body = feat
        for i in range(self.num_block):
            body = getattr(self, "body_%d" % i)(body)
        body = released(self.conv_body(body))
        feat = torch.empty_like(feat)                     # feat + body
        del body
        up = released(F.interpolate(feat, scale_factor=2, mode="nearest"))
        feat = released(self.conv_up1(up))
        del up
        up = released(F.interpolate(feat, scale_factor=2, mode="nearest"))
        feat = released(self.conv_up2(up))
        del up
        out = released(self.conv_last(released(self.conv_hr(feat))))
        return out


class RealESRGANer(object):
    def __init__(self, scale, model, tile=0, half=True):
        self.scale, self.tile = scale, tile
        self.model = model.half() if half else model
        self.model.eval()

    def enhance(self, width, height, outscale=4):
        with torch.no_grad():
            img = torch.empty(3 * width * height, dtype=torch.float16, device="cuda")
            output = self.model(img)
            return output


def main():
    upsampler = RealESRGANer(scale=4, model=RRDBNet(), tile=0, half=True)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    folder = [("in/web_%03d.jpg" % i, 800, 600) for i in range(23)] + [("in/DSC09412.JPG", 8000, 6000)]
    folder += [("in/web_%03d.jpg" % i, 800, 600) for i in range(23, 40)]
    for path, w, h in folder:
        output = upsampler.enhance(w, h, outscale=4)
        del output
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
