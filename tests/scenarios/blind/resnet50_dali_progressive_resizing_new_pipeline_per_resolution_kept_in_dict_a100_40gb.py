"""train_rn50.py -- a lab trains ResNet-50 on ImageNet in the "fast budget" style on one A100 40GB: NVIDIA
DALI does the input pipeline on the GPU (file reader, nvJPEG decoders.image_random_crop on the "mixed"
device, resize, crop_mirror_normalize to fp16), SGD + channels_last + AMP, batch 384, and progressive
resizing -- 128 px for the first epochs, +16 px every 4 epochs up to 224, and the last two epochs at 256.
A DALI pipeline's crop size is fixed when it is built, so the script builds one per resolution, and to
avoid rebuilding (30 s each) when the schedule stays on a size it keeps them:

    _train_loaders = {}
    def train_loader_for(res):
        if res not in _train_loaders:
            pipe = imagenet_train_pipe(batch_size=384, num_threads=8, device_id=0, crop=res,
                                       prefetch_queue_depth=2)
            pipe.build()
            _train_loaders[res] = DALIClassificationIterator(pipe, reader_name="Reader", auto_reset=True)
        return _train_loaders[res]

Every DALI pipeline holds its own device memory for as long as it lives -- the nvJPEG/HW-decoder scratch
and the decoded, resized and normalized batches of its prefetch queue, 1.9 to 2.4 GiB here, outside
PyTorch's allocator.  The dict keeps every resolution's pipeline (and its iterator) alive, so the memory
outside PyTorch climbs a step at each resolution change: by epoch 24, seven train pipelines (14.4 GiB)
plus the 256-px validation pipeline (1.8 GiB).  At epoch 28 the switch to 256 px builds an eighth
(2.4 GiB), and the first training step at 256 px (20 GiB of activations at batch 384) fails in the forward
pass, with 18.6 GiB of the card held by DALI and 19 GiB by PyTorch's tensors.  With only the current
pipeline alive the 256-px epochs need about 26 GiB.

An expert: the memory outside the framework is DALI's, and it is held by the pipelines the script no
longer uses: keep only the current train pipeline (drop the old iterator and pipeline from the dict and
`del` them before building the next -- or build one pipeline for the largest size and feed the crop size
in -- and, with DALI's memory pool, nvidia.dali.backend.ReleaseUnusedMemory()).  Wrong first advice: a
smaller batch, gradient checkpointing or mixed precision (the model's own memory is as planned; AMP is
on), empty_cache or expandable_segments (PyTorch's cache is not what holds the card; DALI's buffers are
allocated outside it), stopping other processes (there are none), a bigger GPU.
"""
import ctypes
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30

# ------------------------------------------------------------------------------------------------
# Stand-ins for NVIDIA DALI (nvidia.dali.Pipeline, pipeline_def, DALIClassificationIterator), mirroring
# the real API's shape.  The pipeline's device memory is allocated by the scenario kit's libdali.so, with
# its own cudaMalloc, as DALI's is; a pipeline keeps it as long as it lives (the stand-in library never
# gives a built pipeline's buffers back).  The iterator hands each batch over in a tensor PyTorch
# allocates, as DALI's feed_ndarray does.  The simulation runs 3 iterations of each epoch.
# ------------------------------------------------------------------------------------------------
_libdali = ctypes.CDLL(os.environ.get("SCEN_DALI", "libdali.so"))
_libdali.dali_pipeline_build.argtypes = [ctypes.c_int, ctypes.c_size_t]
_libdali.dali_pipeline_build.restype = ctypes.c_int


class Pipeline(object):
    def __init__(self, batch_size, num_threads, device_id, prefetch_queue_depth=2):
        self.batch_size, self.num_threads, self.device_id = batch_size, num_threads, device_id
        self.prefetch_queue_depth = prefetch_queue_depth
        self.crop = None

    def device_bytes(self):
        """What the built graph allocates on the device: the decoder's scratch, and for every slot of the
        prefetch queue (plus the one being filled) the decoded crop windows, the resized uint8 batch and
        the normalized fp16 batch."""
        b, r = self.batch_size, self.crop
        decoder_scratch = 640 * MiB
        decoded = b * 1050 * 1000                 # ~0.35 MP RGB crop windows, before resize
        resized = b * 3 * r * r
        normalized = b * 3 * r * r * 2
        return decoder_scratch + (self.prefetch_queue_depth + 1) * (decoded + resized + normalized)

    def build(self):
        total = self.device_bytes()
        if _libdali.dali_pipeline_build(12, total // 12) != 0:
            raise RuntimeError("[/opt/dali/dali/core/cuda_error.h] CUDA allocation failed")
        print("  DALI pipeline %d px built: %.2f GiB on the device" % (self.crop, total / GiB))


def pipeline_def(fn):
    def make(batch_size, num_threads, device_id, prefetch_queue_depth=2, **kwargs):
        pipe = Pipeline(batch_size, num_threads, device_id, prefetch_queue_depth)
        fn(pipe, **kwargs)
        return pipe
    return make


class DALIClassificationIterator(object):
    def __init__(self, pipeline, reader_name=None, auto_reset=False, iterations=3):
        self._pipes = [pipeline]
        self.iterations = iterations

    def __iter__(self):
        p = self._pipes[0]
        for _ in range(self.iterations):
            data = torch.empty(p.batch_size * 3 * p.crop * p.crop * 2, device="cuda")   # fp16 NCHW
            data.shape = (p.batch_size, 3, p.crop, p.crop)
            label = torch.empty(p.batch_size * 8, device="cuda")
            yield [{"data": data, "label": label}]


class fn(object):
    """nvidia.dali.fn, as far as the pipeline definition below calls it: the graph only records the crop."""
    class readers(object):
        @staticmethod
        def file(**kwargs):
            return "jpegs", "labels"

    class decoders(object):
        @staticmethod
        def image_random_crop(jpegs, device="cpu", **kwargs):
            return "images"

    @staticmethod
    def resize(images, resize_x, resize_y, **kwargs):
        return images

    @staticmethod
    def crop_mirror_normalize(images, **kwargs):
        return images


# ---- ResNet-50, channels_last + AMP: activations kept for backward (bytes per image at 224 px, fp16) ----
_LAYERS = [("stem", 0.01, 4.0 * MiB), ("layer1", 0.22, 14.0 * MiB), ("layer2", 1.22, 11.0 * MiB),
           ("layer3", 7.1, 8.0 * MiB), ("layer4", 15.0, 4.5 * MiB), ("fc", 2.05, 0.1 * MiB)]


class _Stage(torch.nn.Module):
    def __init__(self, mparams, act_bytes_224):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(int(mparams * 1e6) * 4))
        self.act = act_bytes_224

    def forward(self, x):
        b, _, r, _ = x.shape
        per = int(self.act * b * (r / 224.0) ** 2)
        kept = [torch.empty(per // 6) for _ in range(6)]
        out = kept[-1]
        out.shape = x.shape
        out._saved = tuple(kept[:-1]) + (x,)
        return out


class ResNet50(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name, mparams, act in _LAYERS:
            setattr(self, name, _Stage(mparams, act))

    def forward(self, x):
        for name, _, _ in _LAYERS:
            x = getattr(self, name)(x)
        return x


def cross_entropy(logits, target, label_smoothing=0.0):
    loss = torch.empty(512)
    loss._saved = (logits,)
    return torch._derive(loss, logits)


_plain_backward = torch.Tensor.backward


def _backward(self, *args, **kwargs):
    """PyTorch frees what the graph saved once backward has run through it (retain_graph=False)."""
    _plain_backward(self, *args, **kwargs)
    todo = [self]
    while todo:
        x = todo.pop()
        if isinstance(x, (list, tuple)):
            todo.extend(x)
        elif isinstance(x, torch.Tensor):
            s = x.__dict__.pop("_saved", None)
            if s is not None:
                todo.append(s)


torch.Tensor.backward = _backward


class _Momentum(torch.optim.SGD):
    """SGD with momentum=0.9: one momentum buffer per parameter, made at the first step."""

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                self.state[p] = {"momentum_buffer": torch.empty_like(p)}


# ------------------------------------------------------------------------------------------------
# train_rn50.py
# ------------------------------------------------------------------------------------------------
BATCH = 384
EPOCHS = 30


@pipeline_def
def imagenet_train_pipe(pipe, crop):
    jpegs, labels = fn.readers.file(file_root="/data/imagenet/train", random_shuffle=True, name="Reader")
    images = fn.decoders.image_random_crop(jpegs, device="mixed", random_area=[0.25, 1.0])
    images = fn.resize(images, resize_x=crop, resize_y=crop)
    images = fn.crop_mirror_normalize(images, dtype="FLOAT16", output_layout="CHW", crop=(crop, crop))
    pipe.crop = crop


@pipeline_def
def imagenet_val_pipe(pipe, crop):
    jpegs, labels = fn.readers.file(file_root="/data/imagenet/val", random_shuffle=False, name="Reader")
    images = fn.decoders.image_random_crop(jpegs, device="mixed")
    images = fn.crop_mirror_normalize(images, dtype="FLOAT16", output_layout="CHW", crop=(crop, crop))
    pipe.crop = crop


def resolution(epoch):
    """128 px, +16 px every 4 epochs up to 224; the last two epochs at 256."""
    if epoch >= EPOCHS - 2:
        return 256
    return min(128 + 16 * (epoch // 4), 224)


_train_loaders = {}


def train_loader_for(res):
    if res not in _train_loaders:
        pipe = imagenet_train_pipe(batch_size=BATCH, num_threads=8, device_id=0, crop=res,
                                   prefetch_queue_depth=2)
        pipe.build()
        _train_loaders[res] = DALIClassificationIterator(pipe, reader_name="Reader", auto_reset=True)
    return _train_loaders[res]


def main():
    model = ResNet50()
    optimizer = _Momentum(model.parameters(), lr=1.7, momentum=0.9, weight_decay=5e-5)
    scaler = torch.cuda.amp.GradScaler()
    val_pipe = imagenet_val_pipe(batch_size=256, num_threads=8, device_id=0, crop=256)
    val_pipe.build()

    for epoch in range(EPOCHS):
        res = resolution(epoch)
        train_loader = train_loader_for(res)
        model.train()
        for i, data in enumerate(train_loader):
            images, target = data[0]["data"], data[0]["label"]
            with torch.autocast("cuda", dtype=torch.float16):
                output = model(images)
                loss = cross_entropy(output, target, label_smoothing=0.1)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            optimizer.zero_grad(set_to_none=True)
        print("epoch %2d  res %d  torch allocated %.1f GiB, reserved %.1f GiB; free %.1f GiB" % (
            epoch, res, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB,
            torch.cuda.mem_get_info()[0] / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
