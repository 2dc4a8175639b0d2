"""train_brats_segresnet.py -- a PhD student's glioma segmentation training on BraTS 2023 (four MRI modalities:
T1, T1c, T2, FLAIR; 240 x 240 x 155 voxels) with MONAI's SegResNet, on a lab workstation's RTX A5000 (24 GB).
Run with plain `LD_PRELOAD=liboomguard.so python train.py`.

The CPU augmentation was the bottleneck (GPU at 30%), so the student moved it to the GPU by putting
EnsureTyped(..., device="cuda") first in the transform chain, as a blog post suggested:

    train_transform = Compose([
        LoadImaged(keys=["image", "label"]),
        EnsureTyped(keys=["image", "label"], device="cuda"),     # <- everything after this runs on the GPU
        ConvertToMultiChannelBasedOnBratsClassesd(keys="label"),
        NormalizeIntensityd(keys="image", nonzero=True, channel_wise=True),
        RandSpatialCropd(keys=["image", "label"], roi_size=[224, 224, 144], random_size=False),
        RandAffined(keys=["image", "label"], prob=0.5, rotate_range=0.26, scale_range=0.1, ...),
        RandFlipd(...), RandScaleIntensityd(...), RandShiftIntensityd(...),
    ])
    train_loader = DataLoader(train_ds, batch_size=2, shuffle=True, num_workers=8,
                              multiprocessing_context="spawn")   # fork gave "Cannot re-initialize CUDA
                                                                 # in forked subprocess"; spawn "fixed" it
    model = SegResNet(blocks_down=[1, 2, 2, 4], blocks_up=[1, 1, 1], init_filters=16,
                      in_channels=4, out_channels=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), 1e-4, weight_decay=1e-5)
    scaler = torch.cuda.amp.GradScaler()
    for batch in train_loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = DiceLoss(sigmoid=True)(model(batch["image"]), batch["label"])
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

With spawn, each of the 8 worker processes initialises CUDA itself: its own CUDA context (~0.5 GiB) and its
own caching allocator, which keeps what the GPU transforms needed (the 4 x 240 x 240 x 155 float32 volume,
136 MiB, its normalised copy, RandAffined's sampling grid and outputs at 224 x 224 x 144, the collated batch)
and the two batches it has prefetched (prefetch_factor=2): a CUDA tensor sent to the main process stays the
worker's memory until the main process is done with it.  About 1.5 GiB of cache a worker; with its context
~2 GiB; 8 workers = ~16.4 GiB, listed by nvidia-smi as 8 more python processes -- children of this one.
The training process itself needs ~14.6 GiB at the end of its forward pass (the 4.7 M-parameter SegResNet,
AdamW, and in fp16 autocast ~7 GiB of activations per 224 x 224 x 144 sample, batch 2): alone it fits the
23.5 GiB the card offers with room to spare; beside its workers it has 6.7 GiB.  The first forward pass fails,
in the decoder, with 7.2 GiB of its own allocated.  Nothing leaks; no other user is on the card.

What an expert says first: keep CUDA out of the DataLoader workers -- run the random transforms on the CPU in
the workers and move the collated batch to the GPU in the main process (or do the GPU augmentation there, on
the batch: MONAI's ThreadDataLoader with num_workers=0 is made for GPU transforms); at least fewer workers.
Wrong: smaller batch, mixed precision (already on), gradient checkpointing, expandable_segments, empty_cache
(the training process's own cache is not the problem), "stop the other processes" (they are this job's own
data workers: killing them kills the job), a bigger GPU.
"""
import multiprocessing
import os
import queue
import sys
import time

import torch
from torch import nn
from torch.autograd._graph import derive

MiB = 1 << 20
FP32 = 4
FULL = 240 * 240 * 155          # one MRI modality, voxels
ROI = 224 * 224 * 144           # the training crop, voxels


class BratsGPUDataset(object):
    """The Dataset with the transform chain above: after EnsureTyped(device="cuda") every transform allocates
    on the GPU -- in whatever process runs it (a DataLoader worker here)."""

    def __init__(self, cases):
        self.cases = cases

    def __len__(self):
        return len(self.cases)

    def __getitem__(self, i):
        image = torch.empty(4 * FULL * FP32, device="cuda")        # EnsureTyped(device="cuda"): 4 modalities
        label = torch.empty(FULL * FP32, device="cuda")
        label3 = torch.empty(3 * FULL * FP32, device="cuda")       # ConvertToMultiChannelBasedOnBratsClassesd
        del label
        norm = torch.empty(4 * FULL * FP32, device="cuda")          # NormalizeIntensityd(nonzero, channel_wise)
        del image
        grid = torch.empty(4 * ROI * FP32, device="cuda")           # RandAffined: the sampling grid
        img = torch.empty(4 * ROI * FP32, device="cuda")            # RandSpatialCropd + RandAffined
        lab = torch.empty(3 * ROI * FP32, device="cuda")
        del grid, norm, label3
        flipped = torch.empty(4 * ROI * FP32, device="cuda")        # RandFlipd (a copy)
        del img
        scaled = torch.empty(4 * ROI * FP32, device="cuda")         # RandScaleIntensityd / RandShiftIntensityd
        del flipped
        return {"image": scaled, "label": lab}


def collate(samples):
    image = torch.empty(sum(s["image"].nbytes for s in samples), device="cuda")   # torch.stack
    label = torch.empty(sum(s["label"].nbytes for s in samples), device="cuda")
    return {"image": image, "label": label}


def _worker_loop(dataset, index_queue, data_queue, worker_id):
    """torch.utils.data._utils.worker._worker_loop, as far as memory goes: fetch, collate, send.  A CUDA tensor
    put on the queue is shared through CUDA IPC: the producing worker keeps its block until the consumer lets
    go of it (the stand-in has no IPC, so the worker simply keeps the batches it sent)."""
    torch.cuda.set_device(0)
    sent = []
    parent = os.getppid()
    while True:
        try:
            r = index_queue.get(timeout=1.0)
        except queue.Empty:
            if os.getppid() != parent:          # the main process is gone: leave, as PyTorch's watchdog does
                return
            continue
        if r is None:
            return
        idx, indices = r
        batch = collate([dataset[i] for i in indices])
        sent.append(batch)
        if len(sent) > 2:                       # the main process released the oldest one
            sent.pop(0)
        data_queue.put((idx, worker_id, sum(t.nbytes for t in batch.values())))


class DataLoader(object):
    """torch.utils.data.DataLoader(..., num_workers=8, multiprocessing_context="spawn", prefetch_factor=2):
    8 worker processes, 2 batches in flight per worker."""

    def __init__(self, dataset, batch_size=2, num_workers=8, multiprocessing_context="spawn", prefetch_factor=2):
        self.dataset, self.batch_size = dataset, batch_size
        self.num_workers, self.prefetch_factor = num_workers, prefetch_factor
        self.ctx = multiprocessing.get_context(multiprocessing_context)

    def __iter__(self):
        data_queue = self.ctx.Queue()
        index_queues, workers = [], []
        for w in range(self.num_workers):
            iq = self.ctx.Queue()
            p = self.ctx.Process(target=_worker_loop, args=(self.dataset, iq, data_queue, w), daemon=True)
            p.start()
            index_queues.append(iq)
            workers.append(p)
        self._workers = workers
        n = len(self.dataset) // self.batch_size
        order = list(range(n))
        sent = 0
        for _ in range(self.prefetch_factor):                # _try_put_index, prefetch_factor x num_workers
            for w in range(self.num_workers):
                index_queues[w].put((sent, list(range(sent * 2, sent * 2 + 2))))
                sent += 1
        ready = []
        while len(ready) < sent:                             # (the stand-in waits for every worker's prefetch,
            ready.append(data_queue.get(timeout=120))        # as a real run reaches it in its first seconds)
        for step in order:
            # the batch arrives through CUDA IPC; the stand-in's main process makes its own copy of it
            yield {"image": torch.empty(self.batch_size * 4 * ROI * FP32, device="cuda"),
                   "label": torch.empty(self.batch_size * 3 * ROI * FP32, device="cuda")}


def _op(x, nbytes):
    """One op autograd records: its output, which keeps what the backward needs (x) alive until backward."""
    out = torch.empty(nbytes, device="cuda")
    out._saved = x
    return derive(out, x)


class SegResNet(nn.Module):
    """MONAI SegResNet(blocks_down=[1, 2, 2, 4], blocks_up=[1, 1, 1], init_filters=16): 4.7 M parameters.
    Under fp16 autocast each ResBlock saves its GroupNorm inputs/outputs (GroupNorm runs in float32) and its
    convolutions' inputs (fp16).  (The stand-in computes nothing: each op makes its output's memory.)"""

    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(4700 * 1000 * FP32, device="cuda"))

    def _resblock(self, x, batch, channels, voxels):
        n = batch * channels * voxels
        for dtype_bytes in (4, 4, 2, 4, 4, 2):               # GN, ReLU (fp32), conv (fp16), twice
            x = _op(x, n * dtype_bytes)
        return x

    def forward(self, x, batch=2):
        x = _op(x, batch * 16 * ROI * 2)                     # convInit
        for stage, blocks in enumerate((1, 2, 2, 4)):        # encoder: 16, 32, 64, 128 channels
            if stage:
                x = _op(x, batch * (16 << stage) * (ROI // 8 ** stage) * 2)   # strided conv down
            for _ in range(blocks):
                x = self._resblock(x, batch, 16 << stage, ROI // 8 ** stage)
        for stage in (2, 1, 0):                              # decoder: upsample + skip, one ResBlock
            x = _op(x, batch * (16 << stage) * (ROI // 8 ** stage) * 2)
            x = self._resblock(x, batch, 16 << stage, ROI // 8 ** stage)
        return _op(x, batch * 3 * ROI * 4)                   # conv_final, fp32


def main():
    import scen_truth
    scen_truth.note_every_empty(torch)
    train_ds = BratsGPUDataset(["BraTS-GLI-%05d-000" % i for i in range(1251)])
    train_loader = DataLoader(train_ds, batch_size=2, num_workers=8, multiprocessing_context="spawn")
    model = SegResNet()
    optimizer = torch.optim.AdamW(model.parameters(), 1e-4, weight_decay=1e-5)
    scaler = torch.cuda.amp.GradScaler()
    for epoch in range(300):
        for batch in train_loader:
            try:
                with torch.autocast("cuda", dtype=torch.float16):
                    logits = model(batch["image"], batch=2)
                    loss = _op(logits, 512)                         # DiceLoss(sigmoid=True)
                scen_truth.backward(scaler.scale(loss))
                scaler.step(optimizer)
                scaler.update()
                optimizer.zero_grad()
            except torch.OutOfMemoryError:
                scen_truth.torch_oom_mark()
                raise
            del logits, loss, batch
    return 0


if __name__ == "__main__":
    sys.exit(main())
