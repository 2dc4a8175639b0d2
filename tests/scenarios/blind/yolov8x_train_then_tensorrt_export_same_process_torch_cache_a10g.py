"""train_and_ship.py -- one script on an AWS g5.xlarge (one A10G, 24 GB) that fine-tunes YOLOv8x on a
pallet-detection set and then exports the best weights to a TensorRT engine for the edge boxes:

    model = YOLO("yolov8x.pt")
    model.train(data="pallets.yaml", imgsz=1024, batch=16, epochs=3, amp=True)
    model.export(format="engine", half=True, workspace=8)       # same process

The user: "training and validation finish fine, then the TensorRT export fails with 'Error Code 2:
OutOfMemory'.  If I run `yolo export model=best.pt format=engine` by itself it works.  Does TensorRT need
more than 24 GB?"

What fills the memory: PyTorch's caching allocator.  Training at 1024 px, batch 16 (and validation at batch 32) reserved ~19 GiB
for activations; after the last validation those blocks are free but PyTorch keeps them cached (it returns
memory to the driver only when one of its own allocations fails, or on torch.cuda.empty_cache()).  The
trainer object, its EMA copy and the AdamW state also stay alive inside `model` (~1.2 GiB in use).
TensorRT allocates outside PyTorch, with cudaMalloc: the builder's fp16 weights and activation memory
fit in the ~2.6 GiB the card has left, the 2 GiB scratch of its second tactic does not (1.4 GiB free) --
while PyTorch sits on ~18 GiB it is not using.

An expert says first: release PyTorch's cache before the export -- `del` the trainer, gc.collect(),
torch.cuda.empty_cache() -- or run the export as its own process (which the user found works).  Wrong
advice: a smaller batch, gradient checkpointing or mixed precision (training finished fine), other
processes (there are none), expandable_segments (PyTorch still keeps what it reserved), a bigger GPU,
quantizing the model.
"""
import ctypes
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

batch = 16
imgsz = 1024


class TensorRTBuilder(object):
    """tensorrt.Builder.build_serialized_network, as far as memory goes: libnvinfer cudaMallocs the
    network's weights, its activation memory, then a scratch workspace per tactic it times."""

    def __init__(self, workspace_gib):
        self.rt = ctypes.CDLL("libcudart.so.13")
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.workspace = int(workspace_gib * GiB)
        self.held = []

    def _malloc(self, nbytes):
        p = ctypes.c_void_p(0)
        if self.rt.cudaMalloc(ctypes.byref(p), nbytes) != 0:
            self.rt.cudaGetLastError()
            st = torch.cuda.memory_stats()
            scen_truth.mark("fail", 0, nbytes, allocated=st["allocated_bytes.all.current"],
                            reserved=st["reserved_bytes.all.current"])
            raise RuntimeError("[TRT] [E] 2: [virtualMemoryBuffer.cpp::resizePhysical::145] Error Code 2: "
                               "OutOfMemory (no further information)")
        self.held.append(p.value)
        return p.value

    def build_serialized_network(self, n_params):
        self._malloc(n_params * 2)                      # fp16 weights
        self._malloc(1200 * MiB)                        # activation memory of the batch-1 engine at 1024 px
        for tactic_bytes in (512 * MiB, 2 * GiB, 4 * GiB):
            ws = self._malloc(tactic_bytes)             # tactic timing scratch, up to the workspace limit
            self.rt.cudaFree(ws)
            self.held.remove(ws)
        return b"engine"


class C2f(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(nbytes // 4, dtype=torch.float32, device="cuda"))

    def forward(self, x, act_bytes):
        h = x
        for _ in range(4):
            t = torch.empty(act_bytes // 2, dtype=torch.float16, device="cuda")
            if torch.is_grad_enabled():
                t._saved = h
            h = torch.autograd._graph.derive(t, h, self.weight)
        return h


class DetectionModel(nn.Module):
    """YOLOv8x: 68.2M params (fp32 master weights)."""

    def __init__(self):
        nn.Module.__init__(self)
        for i, mib in enumerate((6, 20, 40, 60, 60, 40, 24, 10)):
            setattr(self, "m%d" % i, C2f(mib * MiB))
        self.n_params = 68_200_000

    def forward(self, imgs, b):
        h = imgs
        for i, scale in enumerate((8, 6, 4, 3, 2, 2, 3, 4)):
            h = getattr(self, "m%d" % i)(h, b * scale * 9 * MiB)
        return h


class DetectionTrainer(object):
    def __init__(self, model):
        self.model = model
        self.ema = DetectionModel()                     # ultralytics ModelEMA: a deepcopy kept on the GPU
        for p in self.ema.parameters():
            p.requires_grad = False
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=5e-4)

    def train(self, epochs, steps_per_epoch):
        for epoch in range(epochs):
            for step in range(steps_per_epoch):
                imgs = torch.empty(batch * 3 * imgsz * imgsz, dtype=torch.uint8, device="cuda")
                with torch.autocast("cuda", dtype=torch.float16):
                    preds = self.model(imgs, batch)
                    loss = torch.autograd._graph.derive(torch.empty(512, device="cuda"), preds)
                    loss._saved = preds
                scen_truth.backward(loss)
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
                del imgs, preds, loss
            self.validate()

    def validate(self):
        with torch.no_grad():
            for step in range(10):
                imgs = torch.empty(32 * 3 * imgsz * imgsz, dtype=torch.uint8, device="cuda")
                preds = self.ema(imgs, 32)
                del imgs, preds


class YOLO(object):
    def __init__(self, weights):
        self.model = DetectionModel()
        self.trainer = None

    def train(self, data, imgsz, batch, epochs, amp=True):
        self.trainer = DetectionTrainer(self.model)
        torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
        self.trainer.train(epochs, steps_per_epoch=40)

    def export(self, format="engine", half=True, workspace=8):
        with torch.no_grad():                           # warm-up passes and torch.onnx.export, batch 1
            im = torch.empty(3 * 1024 * 1024 * 2, dtype=torch.uint8, device="cuda")
            for _ in range(2):
                y = self.model(im, 1)
                del y
        builder = TensorRTBuilder(workspace_gib=workspace)
        return builder.build_serialized_network(self.model.n_params)


def main():
    model = YOLO("yolov8x.pt")
    model.train(data="pallets.yaml", imgsz=imgsz, batch=batch, epochs=3, amp=True)
    print("reserved %.1f GiB, allocated %.1f GiB" % (torch.cuda.memory_reserved() / GiB,
                                                     torch.cuda.memory_allocated() / GiB))
    model.export(format="engine", half=True, workspace=8)
    return 0


if __name__ == "__main__":
    sys.exit(main())
