"""analytics_service.py -- a video-analytics service on one NVIDIA L4 (22.49 GiB usable), run with plain
`LD_PRELOAD=liboomguard.so python analytics_service.py --cameras site_b.yaml`.

One Python process does everything.  At start it loads the "forensic search" enrichment model with PyTorch
(the CLIP ViT-L/14 vision tower in fp16, 303M parameters = 0.58 GiB, HF CLIPVisionModelWithProjection), then
starts one worker thread per camera, written after TensorRT's Python multi-threading sample:

    class CameraWorker(threading.Thread):
        def run(self):
            self.cfx = cuda.Device(0).make_context()            # pycuda: a NEW CUDA context for this thread
            engine = trt.Runtime(LOGGER).deserialize_cuda_engine(open("yolov8m_fp16.plan", "rb").read())
            context = engine.create_execution_context()         # its activation memory
            d_in, d_out = cuda.mem_alloc(1*3*640*640*4), cuda.mem_alloc(1*84*8400*4)
            decoder = nvc.CreateDecoder(gpuid=0, codec=nvc.cudaVideoCodec.H264, usedevicememory=True)
            while True: decode -> preprocess -> context.execute_async_v3(stream) -> NMS -> crops to queue

and the main thread is the batcher: it collects the person/vehicle crops of every camera (at most 256 per
batch, the same MAX_BATCH since day one), embeds them with CLIP under torch.inference_mode() and writes the
vectors to the search index.

Each camera thread costs, per nvidia-smi, about 418 MiB: its own CUDA context (~256 MiB: make_context() makes a
full context, not the primary one), its own deserialized copy of the YOLOv8m engine (54 MiB of fp16
weights), its execution context's activation memory (72 MiB), its input/output bindings (4.7 + 2.7 MB) and
the NVDEC decoder's 8 pitched 1080p NV12 surfaces (25.3 MB).  The service was sized and run for months at
site A with 20 cameras (8.2 GiB of camera threads).  Site B has 50 cameras: 50 x 418 MiB = 20.4 GiB, on top
of PyTorch's own context (256 MiB) and the 0.58 GiB of CLIP weights.

The quiet batches (16 to 64 crops) still fit in the ~1.25 GiB that is left beside the weights; the first
busy moment fills a batch of 256 crops, whose first attention layer (eager attention: 256 x 16 heads x 257 x
257 fp16 scores = 516 MiB, then the softmax's probabilities as large, beside the hidden states and q/k/v of
128.5 MiB each) does not fit, and PyTorch raises at the softmax: "Tried to allocate 516.01 MiB ... of which
46.00 MiB is free. Of the allocated memory 1813.13 MiB is allocated by PyTorch, and 18.87 MiB is reserved by
PyTorch but unallocated".  nvidia-smi lists one process only -- this one -- at 22.4 GiB.

What an expert says first: PyTorch is not what fills the card (1.8 GiB: 0.58 GiB of weights and this
batch's activations; the same batch ran for months at site A); 20.4 GiB of this process's memory is outside
PyTorch and its own context: 50 CUDA contexts made one per camera thread by make_context() (12.5 GiB) and 50
private copies of the same TensorRT engine with their buffers (7.9 GiB).  Share ONE context across the camera threads (retain the primary context -- the one PyTorch
already uses -- and push/pop it, or use pycuda.autoinit once), deserialize the engine once and give each
thread only an execution context (or batch the cameras through one engine, DeepStream style): that frees
~12 GiB of contexts and ~2.6 GiB of engine copies.  (No catalog id names this fix: `share_cuda_context`;
`non_framework_memory`, "find the memory held outside the framework", points at the same place.)
Wrong advice: a smaller crop batch (it treats the symptom; the same batch fit with 20 cameras), empty_cache
or expandable_segments (PyTorch caches next to nothing; this is no fragmentation), stopping other processes
(there are none), restarting (the 50 contexts come back), inference_mode / mixed precision (already on:
inference_mode, fp16 weights), gradient checkpointing (no training), a bigger GPU (the L4 is the site's
hardware, and the waste is 12 GiB of duplicate contexts).

The camera threads stand in for pycuda + TensorRT + PyNvVideoCodec: they call the CUDA driver
(cuCtxCreate_v2, cuMemAlloc_v2) through ctypes, as pycuda's _driver.so and TensorRT's default allocator do
through their own bindings.
"""
import ctypes
import sys
import threading

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
NUM_CAMERAS = 50                 # site B (site A had 20)
MAX_BATCH = 256                  # crops per CLIP batch, unchanged since site A
FP16 = torch.float16

scen_truth.note_every_empty(torch)   # truth marks: every torch.empty notes its request (test scaffolding)

# ----------------------------------------------------------------------------------------------------------
# camera workers: pycuda + TensorRT + NVDEC, through the CUDA driver
_cu = ctypes.CDLL("libcuda.so.1")
_cu.cuInit.argtypes = [ctypes.c_uint]
_cu.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
_cu.cuCtxCreate_v2.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint, ctypes.c_int]
_cu.cuMemAlloc_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t]

STOP = threading.Event()


def _check(status, what):
    if status != 0:
        raise RuntimeError("pycuda._driver.Error: %s failed: %d" % (what, status))


def mem_alloc(nbytes):
    """pycuda.driver.mem_alloc(nbytes) in the thread's current context."""
    p = ctypes.c_uint64(0)
    _check(_cu.cuMemAlloc_v2(ctypes.byref(p), nbytes), "cuMemAlloc")
    return p.value


class CameraWorker(threading.Thread):
    def __init__(self, cam_id):
        threading.Thread.__init__(self, name="cam-%02d" % cam_id, daemon=True)
        self.cam_id = cam_id
        self.ready = threading.Event()
        self.error = None

    def run(self):
        try:
            _check(_cu.cuInit(0), "cuInit")
            dev = ctypes.c_int(0)
            _check(_cu.cuDeviceGet(ctypes.byref(dev), 0), "cuDeviceGet")
            ctx = ctypes.c_void_p(0)
            _check(_cu.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev.value), "cuCtxCreate")   # Device(0).make_context()
            self.cfx = ctx.value
            self.engine = mem_alloc(54 * MiB)              # deserialize_cuda_engine: the YOLOv8m fp16 weights
            self.exec_mem = mem_alloc(72 * MiB)            # create_execution_context(): activation memory
            self.d_input = mem_alloc(1 * 3 * 640 * 640 * 4)     # binding "images"  (4.7 MB)
            self.d_output = mem_alloc(1 * 84 * 8400 * 4)       # binding "output0" (2.7 MB)
            self.surfaces = mem_alloc(8 * 2048 * 1620)          # NVDEC: 8 decode surfaces, 1080p NV12, pitch 2048
        except Exception as e:
            self.error = e
            self.ready.set()
            return
        self.ready.set()
        while not STOP.wait(0.05):
            pass                                           # decode -> infer -> NMS -> crops to the batcher


def start_cameras(n):
    workers = []
    for cam in range(n):
        w = CameraWorker(cam)
        w.start()
        w.ready.wait()                                     # RTSP connected, engine loaded: next camera
        if w.error is not None:
            raise w.error
        workers.append(w)
    return workers


# ----------------------------------------------------------------------------------------------------------
# the enrichment model: CLIP ViT-L/14 vision tower (HF names), fp16, eager attention
HIDDEN, HEADS, MLP, PATCH, IMAGE, PROJ = 1024, 16, 4096, 14, 224, 768
TOKENS = (IMAGE // PATCH) ** 2 + 1                         # 257


def new(n):
    return torch.empty(n, dtype=FP16, device="cuda")


class Linear(nn.Module):
    def __init__(self, fan_in, fan_out):
        nn.Module.__init__(self)
        self.fan_in, self.fan_out = fan_in, fan_out
        self.weight = nn.Parameter(new(fan_in * fan_out), requires_grad=False)
        self.bias = nn.Parameter(new(fan_out), requires_grad=False)

    def forward(self, x):
        rows = x.nbytes // (2 * self.fan_in)
        return new(rows * self.fan_out)


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(new(dim), requires_grad=False)
        self.bias = nn.Parameter(new(dim), requires_grad=False)

    def forward(self, x):
        return new(x.nbytes // 2)


def softmax(scores):
    """F.softmax(attn_weights, dim=-1): a new tensor of the scores' size."""
    return new(scores.nbytes // 2)


class CLIPAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, HIDDEN)
        self.v_proj = Linear(HIDDEN, HIDDEN)
        self.out_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, batch):
        q = self.q_proj(x)
        k = self.k_proj(x)
        v = self.v_proj(x)
        attn_weights = new(batch * HEADS * TOKENS * TOKENS)          # torch.bmm(q, k.transpose(1, 2))
        attn_probs = softmax(attn_weights)
        del attn_weights
        attn_output = new(batch * TOKENS * HIDDEN)                    # torch.bmm(attn_probs, v)
        del q, k, v, attn_probs
        return self.out_proj(attn_output)


class CLIPMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.fc1 = Linear(HIDDEN, MLP)
        self.fc2 = Linear(MLP, HIDDEN)

    def forward(self, x):
        h = self.fc1(x)
        h = new(h.nbytes // 2)                                        # quick_gelu
        return self.fc2(h)


class CLIPEncoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layer_norm1 = LayerNorm(HIDDEN)
        self.self_attn = CLIPAttention()
        self.layer_norm2 = LayerNorm(HIDDEN)
        self.mlp = CLIPMLP()

    def forward(self, hidden_states, batch):
        x = self.self_attn(self.layer_norm1(hidden_states), batch)
        hidden_states = new(x.nbytes // 2)                            # residual + x
        del x
        x = self.mlp(self.layer_norm2(hidden_states))
        out = new(x.nbytes // 2)                                      # residual + x
        return out


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under the keys "0" ... "n-1", as PyTorch's."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __getitem__(self, i):
        return self._modules[str(i)]

    def __len__(self):
        return len(self._modules)


class CLIPEncoder(nn.Module):
    def __init__(self, n):
        nn.Module.__init__(self)
        self.layers = ModuleList([CLIPEncoderLayer() for _ in range(n)])

    def forward(self, hidden_states, batch):
        for i in range(len(self.layers)):
            hidden_states = self.layers[i](hidden_states, batch)
        return hidden_states


class CLIPVisionModelWithProjection(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embedding = nn.Parameter(new(HIDDEN * 3 * PATCH * PATCH), requires_grad=False)
        self.class_embedding = nn.Parameter(new(HIDDEN), requires_grad=False)
        self.position_embedding = nn.Parameter(new(TOKENS * HIDDEN), requires_grad=False)
        self.pre_layrnorm = LayerNorm(HIDDEN)
        self.encoder = CLIPEncoder(24)
        self.post_layernorm = LayerNorm(HIDDEN)
        self.visual_projection = Linear(HIDDEN, PROJ)

    def forward(self, pixel_values, batch):
        embeddings = new(batch * TOKENS * HIDDEN)                     # conv patches + class + positions
        hidden_states = self.pre_layrnorm(embeddings)
        del embeddings
        hidden_states = self.encoder(hidden_states, batch)
        pooled = self.post_layernorm(new(batch * HIDDEN))             # last_hidden_state[:, 0, :]
        del hidden_states
        return self.visual_projection(pooled)                         # image_embeds


# quiet evening traffic, then the first busy moment (shift change at the gates): a full batch
BATCHES = [16, 24, 40, 32, 64, 48, 16, 56, 64, 40, 32, 24, 64, 48, MAX_BATCH, MAX_BATCH, MAX_BATCH]

try:
    model = CLIPVisionModelWithProjection().eval()      # from_pretrained(..., torch_dtype=torch.float16).cuda()
    workers = start_cameras(NUM_CAMERAS)
    index = []
    with torch.inference_mode():
        for step, batch in enumerate(BATCHES):
            pixel_values = new(batch * 3 * IMAGE * IMAGE)             # crops resized + normalized on the GPU
            image_embeds = model(pixel_values, batch)
            index.append(image_embeds.nbytes)                          # .cpu().numpy() -> faiss index (host)
            del image_embeds, pixel_values
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
STOP.set()
sys.exit(0)
