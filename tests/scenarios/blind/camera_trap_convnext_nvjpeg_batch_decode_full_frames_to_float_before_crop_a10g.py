"""train_species.py -- a wildlife NGO trains a ConvNeXt-Tiny species classifier (120 classes, 224 px,
batch 192, bf16) on camera-trap photos, on an AWS g5.2xlarge (one A10G, 24 GB, 8 vCPUs).  With PIL in 6
DataLoader workers the job ran at 310 img/s with the GPU mostly idle, so the data scientist moved decoding
to the GPU: the workers now only read the JPEG files, and the batch is decoded with nvJPEG
(torchvision.io.decode_jpeg(list, device="cuda"), batched) and augmented there with torchvision.transforms.v2:

    imgs = decode_jpeg(datas, device="cuda")                         # full frames, uint8
    # strip the camera's info bar, even out the IR night shots over the whole frame
    imgs = [equalize(to_dtype(im[:, :-INFO_BAR], torch.float32, scale=True)) for im in imgs]
    x = torch.stack([train_tf(im) for im in imgs])                   # RandomResizedCrop(224), flip, jitter

The traps are a mix of 3 to 16 MP cameras (Reconyx 2048x1440, Bushnell 8 MP, Browning 12 and 16 MP):
8.7 MP on average, 26 MB per frame as uint8 and 104 MB as float32.  192 full frames decoded are 4.7 GiB;
converted to float32 in one list before any crop, 18.2 GiB more -- the model never sees more than
192 x 3 x 224 x 224 (0.1 GiB).  The very first batch fails in to_dtype at the 177th frame of the list,
before the model's first forward pass.

An expert: the preprocessing holds the whole batch at full resolution, and in float32: crop/resize each
frame while it is still uint8 (v2.RandomResizedCrop works on uint8 tensors; the equalization can use the
frame's statistics without a float copy of it, or run on the crop), convert only the 224-px crops to float,
and drop the decoded list before the forward pass; decode in chunks of 32 if the uint8 frames are still too
much.  (DALI's decoders.image_random_crop decodes only the crop window.)  Wrong first advice: a smaller
batch (halves the training batch to hide a preprocessing blowup that still costs 12 GB), mixed precision
or gradient checkpointing (the model has not run; the float32 frames are not activations),
empty_cache or expandable_segments (the frames are live in a list), a bigger GPU.
"""
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20

# ------------------------------------------------------------------------------------------------
# Stand-ins for torchvision (decode_jpeg, transforms.v2) and the pieces of torch this script uses that
# the stand-in torch lacks, mirroring the real API's shape: a CUDA tensor carries its shape and dtype as
# attributes, sizes are bytes.
# ------------------------------------------------------------------------------------------------
_ITEM = {"uint8": 1, "float32": 4, "int64": 8, "bfloat16": 2}


def _tensor(shape, dtype):
    n = _ITEM[dtype]
    for d in shape:
        n *= d
    t = torch.empty(n, dtype="uint8", device="cuda")
    t.shape, t.elem = tuple(shape), dtype
    return t


def _getitem(self, idx):
    """im[:, :-k]: a view without the last k rows."""
    c, h, w = self.shape
    stop = idx[1].stop
    v = self.view()
    v.shape, v.elem = (c, h + stop if stop < 0 else stop, w), self.elem
    return v


torch.Tensor.__getitem__ = _getitem


def _stack(ts):
    return _tensor((len(ts),) + ts[0].shape, ts[0].elem)


torch.stack = _stack


class RawBytes(object):
    """torchvision.io.read_file(path): the JPEG file's bytes in host memory, and (in its header) the size."""

    def __init__(self, h, w):
        self.h, self.w = h, w


def decode_jpeg(input, device="cpu"):
    """torchvision.io.decode_jpeg on a list of encoded images, device="cuda": one batched nvJPEG decode,
    a list of uint8 (3, H, W) CUDA tensors."""
    return [_tensor((3, b.h, b.w), "uint8") for b in input]


class v2(object):
    class functional(object):
        @staticmethod
        def to_dtype(inpt, dtype, scale=False):
            return _tensor(inpt.shape, dtype)

    class Compose(object):
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, x):
            for t in self.transforms:
                x = t(x)
            return x

    class RandomResizedCrop(object):
        def __init__(self, size, scale=(0.08, 1.0), antialias=True):
            self.size = size

        def __call__(self, x):
            return _tensor((x.shape[0], self.size, self.size), x.elem)

    class RandomHorizontalFlip(object):
        def __call__(self, x):
            return x

    class ColorJitter(object):
        def __init__(self, *args):
            pass

        def __call__(self, x):
            return x

    class Normalize(object):
        def __init__(self, mean, std):
            pass

        def __call__(self, x):
            return x


def _equalize(frame):
    """Per-frame intensity standardization, in place (mean/std over the whole frame)."""
    return frame


class CameraTrapFiles(object):
    """The dataset's JPEGs: which trap model took each photo decides its size."""
    CAMERAS = [((1440, 2048), 35), ((2448, 3264), 25), ((2592, 4608), 25), ((3024, 5376), 15)]

    def __init__(self, n, seed=0):
        rng = random.Random(seed)
        sizes = [hw for hw, weight in self.CAMERAS for _ in range(weight)]
        self.items = [(rng.choice(sizes), rng.randrange(120)) for _ in range(n)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        (h, w), label = self.items[i]
        return RawBytes(h, w), label


class DataLoader(object):
    def __init__(self, dataset, batch_size, shuffle=True, num_workers=0, collate_fn=None):
        self.dataset, self.batch_size, self.collate_fn = dataset, batch_size, collate_fn

    def __iter__(self):
        order = list(range(len(self.dataset)))
        random.Random(1).shuffle(order)
        for s in range(0, len(order) - self.batch_size + 1, self.batch_size):
            yield self.collate_fn([self.dataset[i] for i in order[s:s + self.batch_size]])


class HostLabels(object):
    def __init__(self, labels):
        self.labels = labels

    def cuda(self, non_blocking=False):
        return _tensor((len(self.labels),), "int64")


class ConvNeXtTiny(torch.nn.Module):
    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.stem = torch.nn.Parameter(torch.empty(4_700 * 4))
        self.stages = torch.nn.Parameter(torch.empty(27_800_000 * 4))
        self.head = torch.nn.Parameter(torch.empty((768 * num_classes + num_classes) * 4))

    def forward(self, x):
        b = x.shape[0]
        acts = [torch.empty(b * 60 * MiB // 16) for _ in range(16)]     # ~60 MB a 224-px image under bf16
        out = _tensor((b, 120), "float32")
        out._saved = tuple(acts)
        return out


class CrossEntropyLoss(object):
    def __init__(self, label_smoothing=0.0):
        pass

    def __call__(self, logits, target):
        return torch._derive(torch.empty(512), logits)


# ------------------------------------------------------------------------------------------------
# train_species.py
# ------------------------------------------------------------------------------------------------
to_dtype = v2.functional.to_dtype
equalize = _equalize
INFO_BAR = 64                      # rows of the camera's info strip at the bottom of every frame
BATCH = 192
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)

train_tf = v2.Compose([
    v2.RandomResizedCrop(224, scale=(0.2, 1.0), antialias=True),
    v2.RandomHorizontalFlip(),
    v2.ColorJitter(0.2, 0.2, 0.2),
    v2.Normalize(MEAN, STD),
])


def collate_raw(batch):
    return [b for b, _ in batch], HostLabels([y for _, y in batch])


def gpu_batch(datas):
    imgs = decode_jpeg(datas, device="cuda")
    # strip the camera's info bar, even out the IR night shots over the whole frame
    imgs = [equalize(to_dtype(im[:, :-INFO_BAR], torch.float32, scale=True)) for im in imgs]
    return torch.stack([train_tf(im) for im in imgs])


def main():
    loader = DataLoader(CameraTrapFiles(412_000), batch_size=BATCH, shuffle=True, num_workers=6,
                        collate_fn=collate_raw)
    model = ConvNeXtTiny(num_classes=120)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.05)
    criterion = CrossEntropyLoss(label_smoothing=0.1)
    for epoch in range(30):
        for step, (datas, labels) in enumerate(loader):
            x = gpu_batch(datas)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(x)
                loss = criterion(logits, labels.cuda(non_blocking=True))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            if step % 100 == 0:
                print("epoch %d step %d" % (epoch, step))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
