"""train_effnet.py -- EfficientNet-B7 training at 600 px (fp32 weights, AdamW, AMP, batch 32) on a
24 GiB card, with NVIDIA DALI decoding JPEGs on the GPU.  The training pipeline is built at start;
the validation pipeline is built lazily, at the first validation, after the first epoch:

    train_pipe = create_dali_pipeline(train_dir, batch_size=32, prefetch_queue_depth=2); train_pipe.build()
    train_loader = DALIClassificationIterator(train_pipe)
    for epoch in range(epochs):
        for batch in train_loader: ...                   # forward/backward: ~18 GiB of activations
        if val_loader is None:
            val_pipe = create_dali_pipeline(val_dir, batch_size=128, prefetch_queue_depth=4)
            val_pipe.build()                             # DALI cudaMallocs its output buffers
            val_loader = DALIClassificationIterator(val_pipe)

During the epoch PyTorch's caching allocator reserved ~20 GiB for the activations; after the last
step those blocks are free but stay cached by PyTorch (it gives memory back only when one of its own
allocations fails).  DALI allocates outside PyTorch, with cudaMalloc: the first three of its four
1 GiB buffers take the ~4 GiB the card has free, the fourth fails with ~1 GiB free, while PyTorch holds ~18 GiB cached and unused.  An expert:
torch.cuda.empty_cache() before building the validation pipeline (or build it at start-up, before
training fills PyTorch's cache); the training itself fits.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class DALIPipeline(object):
    def __init__(self, batch_size, prefetch_queue_depth, buffer_bytes):
        self.lib = ctypes.CDLL(os.environ["SCEN_DALI"])
        self.lib.dali_pipeline_build.argtypes = [ctypes.c_int, ctypes.c_size_t]
        self.depth, self.buffer_bytes = prefetch_queue_depth, buffer_bytes

    def build(self):
        if self.lib.dali_pipeline_build(self.depth, self.buffer_bytes) != 0:
            # PyTorch's books at the failure (for the truth); not "fw": ctypes released the GIL for
            # DALI's call, as DALI's own bindings do, so the shim cannot ask the Python adapter then
            st = torch.cuda.memory_stats()
            scen_truth.mark("fail", 0, self.buffer_bytes, allocated=st["allocated_bytes.all.current"],
                            reserved=st["reserved_bytes.all.current"])
            raise RuntimeError("[/opt/dali/dali/core/access_order.cc] CUDA allocation failed: out of memory")


class EfficientNetB7(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, mib in enumerate((12, 24, 36, 48, 60, 48, 16, 8)):
            setattr(self, "stage%d" % i, torch.nn.Parameter(torch.empty(mib * MiB, device="cuda")))

    def forward(self, images):
        h = images
        for i in range(48):                              # MBConv blocks at 600 px, batch 32, fp16
            a = torch.empty((416 if i < 24 else 352) * MiB, device="cuda")
            a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    train_pipe = DALIPipeline(batch_size=32, prefetch_queue_depth=2, buffer_bytes=132 * MiB)
    train_pipe.build()
    model = EfficientNetB7().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    val_pipe = None
    for epoch in range(100):
        for step in range(20):
            images = torch.empty(32 * 3 * 600 * 600 * 2 // MiB * MiB, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(images)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            model.zero_grad(set_to_none=True)
            del loss, images
        if val_pipe is None:
            val_pipe = DALIPipeline(batch_size=128, prefetch_queue_depth=4, buffer_bytes=1 * GiB)
            val_pipe.build()


main()
sys.exit(0)
