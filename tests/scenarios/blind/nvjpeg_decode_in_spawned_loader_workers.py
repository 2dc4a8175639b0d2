"""train_vitl.py -- fine-tuning a ViT-L/16 image classifier (304M parameters) on a 24 GiB card, with
plain `LD_PRELOAD=liboomguard.so`.  JPEG decoding on the CPU was the bottleneck, so the dataset now
decodes and augments on the GPU inside the DataLoader workers:

    class JpegDataset(Dataset):
        def __getitem__(self, i):                       # batched: a sampler hands out 128 files
            imgs = torchvision.io.decode_jpeg(self.read(i), device="cuda")     # nvJPEG, full size
            imgs = self.gpu_augment(imgs)              # RandomResizedCrop, ColorJitter on the GPU
            return imgs.cpu()                           # CUDA tensors cannot cross the queue safely
    loader = DataLoader(ds, batch_size=None, num_workers=8, persistent_workers=True,
                        multiprocessing_context="spawn")   # "Cannot re-initialize CUDA in forked subprocess"
    for i, images in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(images.cuda(non_blocking=True)).loss / ACCUM
        loss.backward()
        if (i + 1) % ACCUM == 0:                       # ACCUM = 8: the first step after 8 batches
            optimizer.step(); optimizer.zero_grad()

Each of the eight spawned workers creates its own CUDA context (about 500 MiB) and its own PyTorch
caching allocator, which keeps the nvJPEG output and augmentation buffers (about 600 MiB) cached
between batches: 8.8 GiB of the card in eight processes that train nothing.  The training process
(weights and gradients 2.3 GiB, 11 GiB of activations per micro-batch) survives the eight
micro-batches and the first optimizer.step(), whose 2.3 GiB of AdamW moments come out of the cached
activation blocks; the next forward pass then needs its 11 GiB of activations again and fails with
470 MiB requests.  With num_workers=0 -- or with the workers decoding on the CPU -- the same training
fits (about 16 GiB in all) with room to spare.

An expert: take CUDA out of the workers -- decode on the CPU in the workers (or with DALI / nvJPEG
batched in the main process) and run the GPU augmentation on the whole batch in the training process
after .cuda(); or at least far fewer GPU workers.  Those processes are this job's own, not somebody
else's to stop; not a smaller batch or checkpointing first (the model and its activations fit), not
a cache or fragmentation problem, not a bigger GPU.
"""
import multiprocessing as mp
import queue
import sys

import torch

import scen_truth

MiB = 1 << 20
WORKERS = 8
ACCUM = 8
PREFETCH = 2
scen_truth.note_every_empty(torch)


# -- the dataset, as it runs in each worker process --------------------------------------------
def decode_and_augment(index):
    """decode_jpeg(device="cuda") of 128 JPEGs and the GPU augmentation; returns the batch on the CPU
    (the stand-in: its size in bytes).  The GPU buffers go back to this worker's own cache."""
    decoded = torch.empty(280 * MiB, dtype=torch.uint8, device="cuda")    # 128 full-size RGB images
    work = torch.empty(320 * MiB, device="cuda")          # float32 working copies: resize, crop, jitter
    out = 128 * 3 * 224 * 224                                               # .to(uint8).cpu()
    del decoded, work
    return out


def _worker_loop(worker_id, index_queue, data_queue):
    """torch.utils.data._utils.worker._worker_loop, as far as this job goes."""
    while True:
        idx = index_queue.get()
        if idx is None:
            break
        data_queue.put((idx, decode_and_augment(idx)))


class DataLoaderIter(object):
    """DataLoader(num_workers=WORKERS, persistent_workers=True, multiprocessing_context="spawn"),
    in-order delivery, PREFETCH batches in flight per worker."""

    def __init__(self, n_batches):
        ctx = mp.get_context("spawn")
        self.n = n_batches
        self.data_queue = ctx.Queue()
        self.index_queues = [ctx.Queue() for _ in range(WORKERS)]
        self.workers = [ctx.Process(target=_worker_loop, args=(w, self.index_queues[w], self.data_queue), daemon=True)
                        for w in range(WORKERS)]
        for w in self.workers:
            w.start()
        self.sent = 0
        self.next_idx = 0
        self.reorder = {}
        for _ in range(PREFETCH * WORKERS):
            self._send()

    def _send(self):
        if self.sent < self.n:
            self.index_queues[self.sent % WORKERS].put(self.sent)
            self.sent += 1

    def __iter__(self):
        return self

    def __next__(self):
        if self.next_idx >= self.n:
            raise StopIteration
        while self.next_idx not in self.reorder:
            idx, data = self.data_queue.get()
            self.reorder[idx] = data
        data = self.reorder.pop(self.next_idx)
        self.next_idx += 1
        self._send()
        return data

    def shutdown(self):
        for q in self.index_queues:
            q.put(None)
        for w in self.workers:
            w.join(timeout=60)
            if w.is_alive():
                w.terminate()


# -- the training process --------------------------------------------------------------------------
class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(48 * MiB, device="cuda"))       # 12.6M params fp32

    def forward(self, h):
        a = torch.empty(470 * MiB, device="cuda")            # bf16 activations of 128 x 197 tokens, kept
        a._saved = h
        return a


class ViTLarge(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))
        for i in range(24):
            setattr(self, "block%d" % i, Block())
        self.head = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    def forward(self, x):
        h = x
        for i in range(24):
            h = getattr(self, "block%d" % i)(h)
        return h


def main():
    model = ViTLarge()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.05)
    loader = DataLoaderIter(n_batches=10000)
    try:
        for i, nbytes in enumerate(loader):
            images = torch.empty(nbytes, dtype=torch.uint8, device="cuda")      # .cuda(non_blocking=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                out = model(images)
                loss = torch.empty(512, device="cuda")
                loss._saved = out
                loss._params = tuple(model.parameters())
            scen_truth.backward(loss)
            del loss, out, images
            if (i + 1) % ACCUM == 0:
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()          # the truth while the workers still hold their memory
        raise
    finally:
        loader.shutdown()


if __name__ == "__main__":
    main()
    sys.exit(0)
