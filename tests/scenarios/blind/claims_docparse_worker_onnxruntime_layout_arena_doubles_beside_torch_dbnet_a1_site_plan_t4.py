"""docparse_worker.py -- the document-ingest worker of a property-insurance claims platform: one
Tesla T4 (16 GB, g4dn.xlarge) per worker, one process, three models on one card:

  * layout detection: a DocLayout-YOLO model exported to ONNX, run by onnxruntime-gpu with the CUDA
    execution provider and its default options;
        layout = ort.InferenceSession("doclayout_yolo.onnx", providers=["CUDAExecutionProvider"])
  * text detection: DBNet++ (ResNet-50, PyTorch, float32), at the page's native 200 dpi -- the team
    stopped resizing pages to 1,024 px because the 6-pt print of claim forms vanished;
  * text recognition: TrOCR-base-printed (PyTorch, fp16) on the detected lines, 64 at a time.

Per page: render at 200 dpi, layout (onnxruntime), text detection (torch), recognition (torch).
Most pages are A4 claim forms (1664 x 2368 px padded); site plans come as A3 and, now and then, A1.

onnxruntime's CUDA provider allocates through its own BFC arena, not PyTorch's: by default
(arena_extend_strategy=kNextPowerOfTwo, gpu_mem_limit unlimited, no shrinkage) every extension of
the arena is twice the previous one, and the arena never gives memory back.  On the first A1 site
plan (4704 x 6624 = 31 Mpx) the layout model's activations (~4.9 GB at fp32, for about one second)
make the arena grow from 2 GiB to 8 GiB in two doublings (a 2 GiB region, then a 4 GiB one) -- and
keep it, idle, after the run.  Then DBNet, in PyTorch, needs ~7.7 GB of activations for the same
page; PyTorch gives back its cached segments (5 GiB of pieces sized for A3 pages and TrOCR batches)
and retries, gets the backbone's outputs, and fails at the FPN's fused map (Tried to allocate 1.86
GiB).  The error reads "15 GiB total, 198 MiB free; 6.06 GiB allocated by PyTorch, 0.25 GiB reserved
but unallocated": the other 8 GiB are onnxruntime's arena, outside PyTorch, idle.  Without them the
page fits: DBNet's peak is 7.2 GiB beside 0.7 GiB of torch weights.

An expert: the memory is held by another allocator in this process, onnxruntime's arena, which
doubled and kept its peak: configure its CUDA provider -- arena_extend_strategy="kSameAsRequested",
a gpu_mem_limit (e.g. 3 GiB), and RunOptions "memory.enable_memory_arena_shrinkage" = "gpu:0" so the
arena is trimmed after each run -- then run the layout model at the resolution it was trained at
(long side 1,024-1,600: it is a layout detector, the fine print is DBNet's job), or tile huge pages.
Wrong first advice: torch.cuda.empty_cache() (PyTorch has already returned its free segments while
retrying; it cannot free onnxruntime's arena), a smaller recognition batch (not what fails),
quantization of the torch models (DBNet's weights are 100 MB), a bigger GPU, or
looking for other processes (it is all this process).
"""
import ctypes
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

fp16, f32 = torch.float16, torch.float32
MiB = 1 << 20


# ----------------------------------------------------------------------------------------------
# onnxruntime-gpu, as far as memory goes: an InferenceSession on the CUDA execution provider
# allocates from a BFCArena built over cudaMalloc (libonnxruntime_providers_cuda.so calls the CUDA
# runtime).  The stand-in mirrors the arena's Extend(): the next region is the current region size,
# doubled until the request fits (kNextPowerOfTwo), tried with cudaMalloc and backed off by 0.9x when
# the device refuses; regions are never freed (no shrinkage by default).  Within a run, a tensor is
# placed in the first region with room (the real arena does best fit over chunks).
class _CudaRuntime(object):
    def __init__(self):
        self.rt = ctypes.CDLL("libcudart.so.13")
        self.rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]

    def malloc(self, nbytes):
        p = ctypes.c_void_p(0)
        if self.rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(nbytes)) != 0:
            self.rt.cudaGetLastError()
            return None
        return p.value


class OrtException(RuntimeError):
    pass


class BFCArena(object):
    def __init__(self, initial_chunk=1 * MiB, extend_strategy="kNextPowerOfTwo"):
        self.cuda = _CudaRuntime()
        self.curr_region = initial_chunk
        self.strategy = extend_strategy
        self.regions = []                    # [addr, size, bytes in use]

    def total_reserved(self):
        return sum(r[1] for r in self.regions)

    def _extend(self, rounded):
        increased = False
        while rounded > self.curr_region:
            self.curr_region *= 2
            increased = True
        nbytes = self.curr_region
        addr = self.cuda.malloc(nbytes)
        while addr is None:                  # kBackpedalFactor
            nbytes = int(nbytes * 0.9) // 256 * 256
            if nbytes < rounded:
                raise OrtException("BFCArena::AllocateRawInternal Failed to allocate memory for requested buffer "
                                   "of size %d" % rounded)
            addr = self.cuda.malloc(nbytes)
        self.regions.append([addr, nbytes, 0])
        if not increased and self.strategy == "kNextPowerOfTwo":
            self.curr_region *= 2
        return self.regions[-1]

    def alloc(self, nbytes):
        rounded = (nbytes + 255) // 256 * 256
        for r in self.regions:
            if r[1] - r[2] >= rounded:
                r[2] += rounded
                return rounded
        r = self._extend(rounded)
        r[2] += rounded
        return rounded


class InferenceSession(object):
    """onnxruntime.InferenceSession(path, providers=["CUDAExecutionProvider"]) for a YOLO-style layout
    model (20M parameters, fp32); run() on one page: the peak of its activations, allocated in the
    arena and released to the arena (not to the device) when the run ends."""

    def __init__(self, path, providers=None):
        self.arena = BFCArena()
        self.weights = [self.arena.alloc(n) for n in [12 * MiB] * 6 + [4 * MiB] * 2]   # initializers, 80 MB
        self._persistent = [r[2] for r in self.arena.regions]

    def run(self, output_names, feeds):
        px = feeds["pixels"]
        for nbytes in (12 * px, 64 * px, 32 * px, 48 * px):        # input, stem, stage 1, C2f concat (fp32)
            self.arena.alloc(nbytes)
        for i, r in enumerate(self.arena.regions):                 # end of run: chunks back to the arena
            r[2] = self._persistent[i] if i < len(self._persistent) else 0
        return [{"boxes": 40}]


# ----------------------------------------------------------------------------------------------
# the PyTorch models (the stand-in computes no values; every tensor is the size PyTorch's would be)
class DBNetPP(torch.nn.Module):
    """ResNet-50 + FPN + differentiable-binarization head, float32 (25M parameters)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = torch.nn.Parameter(torch.empty(23_500_000, dtype=f32, device="cuda"))
        self.neck_head = torch.nn.Parameter(torch.empty(1_800_000, dtype=f32, device="cuda"))

    def forward(self, page):
        px = page["pixels"]
        stem = torch.empty(16 * px, dtype=f32, device="cuda")           # conv1: 64 ch at 1/2
        x = torch.empty(4 * px, dtype=f32, device="cuda")               # maxpool: 64 ch at 1/4
        del stem
        c2 = torch.empty(16 * px, dtype=f32, device="cuda")             # layer1: 256 ch at 1/4
        mid = torch.empty(4 * px, dtype=f32, device="cuda")
        del x, mid
        c3 = torch.empty(8 * px, dtype=f32, device="cuda")              # layer2: 512 ch at 1/8
        c4 = torch.empty(4 * px, dtype=f32, device="cuda")              # layer3
        c5 = torch.empty(2 * px, dtype=f32, device="cuda")              # layer4
        p2 = torch.empty(16 * px, dtype=f32, device="cuda")             # FPN top-down: 256 ch at 1/4
        fuse = torch.empty(16 * px, dtype=f32, device="cuda")           # 4 x 64 ch upsampled to 1/4, concat
        del c3, c4, c5
        head = torch.empty(16 * px, dtype=f32, device="cuda")           # deconv: 64 ch at 1/2
        del p2, c2
        prob = torch.empty(px, dtype=f32, device="cuda")                # probability map, full resolution
        thresh = torch.empty(px, dtype=f32, device="cuda")
        del fuse, head, thresh
        return prob


class VisionEncoderDecoderModel(torch.nn.Module):
    """TrOCR-base-printed, fp16 (334M parameters)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = torch.nn.Parameter(torch.empty(86_000_000, dtype=fp16, device="cuda"))
        self.decoder = torch.nn.Parameter(torch.empty(248_000_000, dtype=fp16, device="cuda"))

    def generate(self, pixel_values, max_new_tokens=48):
        b = pixel_values["batch"]
        hidden = torch.empty(b * 577 * 768, dtype=fp16, device="cuda")
        mlp = torch.empty(b * 577 * 3072, dtype=fp16, device="cuda")
        del mlp
        cross_kv = torch.empty(12 * 2 * b * 577 * 1024, dtype=fp16, device="cuda")
        tokens = torch.empty(b * max_new_tokens * 8, dtype=torch.uint8, device="cuda")
        del hidden, cross_kv
        return tokens


# ----------------------------------------------------------------------------------------------
# docparse_worker.py
text_det = DBNetPP().to("cuda").eval()
recognizer = VisionEncoderDecoderModel().to("cuda").eval()
layout = InferenceSession("models/doclayout_yolo.onnx", providers=["CUDAExecutionProvider"])

PAGE = {"A4": (1664, 2368), "A3": (2368, 3328), "A1": (4704, 6624)}   # 200 dpi, padded to /32


def process_page(claim, size):
    w, h = PAGE[size]
    page = {"pixels": w * h}
    regions = layout.run(None, {"images": None, "pixels": w * h})
    with torch.inference_mode():
        prob = text_det(page)
        n_lines = 60 if size == "A4" else 140
        del prob
        for start in range(0, n_lines, 64):
            crops = {"batch": min(64, n_lines - start)}
            text = recognizer.generate(crops)
            del text
    return regions


def claims_queue():
    for i in range(24):
        yield "CLM-%06d" % (88100 + i), "A4"
        if i % 6 == 5:
            yield "CLM-%06d" % (88100 + i), "A3"
    yield "CLM-088131", "A1"                       # a contractor's site plan, scanned at the copy shop


try:
    for claim, size in claims_queue():
        process_page(claim, size)
        print("%s %s ok   torch reserved %.1f GiB, onnxruntime arena %.1f GiB" % (
            claim, size, torch.cuda.memory_reserved() / 2.0 ** 30, layout.arena.total_reserved() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
