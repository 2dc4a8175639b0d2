"""intersection_analytics.py -- a city's traffic-management centre counts and re-identifies vehicles at one
junction from four 4K cameras (RTSP, HEVC, 15 fps each), on a single NVIDIA L4 (24 GB) in the roadside
cabinet.  The service has two processes on the card:

  * the main process: YOLOv8-L vehicle detector + a ViT-B re-identification model (fp16, inference_mode),
    a tracker, and every 15 minutes a cross-camera report (origin-destination counts) that matches the
    vehicle shots of the last 30 minutes against each other;
  * a decoder process, started with torch.multiprocessing (spawn), that decodes the four streams on the
    L4's NVDEC engines (torchaudio's StreamReader, hw_accel="cuda:0") and hands the decoded chunks --
    CUDA tensors, 4 frames x 3 x 2160 x 3840 uint8 = 100 MB each -- to the main process:

        frames_q = mp.Queue()
        decoder = mp.Process(target=decode_cameras, args=(CAMERAS, frames_q), daemon=True)

A CUDA tensor put into a torch.multiprocessing queue is shared, not copied: the producer (the decoder)
keeps its memory until the consumer has received it *and* released it.  The queue has no maxsize.  At
night and mid-morning the main loop keeps up with the 60 fps; in the morning rush (more vehicles: more
crops for the ReID model) it falls a few fps behind, the decoder keeps decoding in real time, and the
backlog -- every frame decoded and not yet consumed -- stays on the GPU in the decoder process, growing
steadily from about 07:30.  The main process itself stays near 1.5 GiB (it even calls empty_cache() after
each report).  The 08:00 report -- all vehicle shots of the last 30 minutes matched against each other,
2.9 GiB of similarities in fp16, up from 1.1 GiB at 07:45 -- is the first request its own cache cannot
serve, and it fails: the decoder holds ~19 GiB of undelivered 4K frames (about 200 chunks), the main
process 0.9 GiB after releasing its cache.
(The stand-in compresses the morning into a few hundred batches; torch.multiprocessing's CUDA sharing, the
NVDEC StreamReader and the torch functions the stand-in torch lacks are written below with their real
shapes.)

An expert: the GPU is full of the decoder's queue, not of the main process's work.  Bound the hand-off:
torch.multiprocessing.Queue(maxsize=...) of a few chunks, with the decoder dropping the oldest frames (or
skipping) when the consumer is behind, so that the backlog is at most a few hundred MB (handing frames over
in host memory instead only moves an unbounded backlog to RAM).  Wrong first advice: a smaller report or
splitting the similarity matrix (it buys minutes: the backlog keeps growing and the decoder itself runs out
soon after), a smaller detector batch, quantization, expandable_segments / empty_cache (the memory is live,
in another process), killing "the other process" (it is the service's own decoder), a bigger GPU (a
deeper backlog later).
"""
import multiprocessing
import os
import sys
import time
import types
import weakref

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
FRAME = 3 * 2160 * 3840                    # one decoded 4K RGB frame, uint8
CHUNK_FRAMES = 4

# ------------------------------------------------------------- stand-ins for what the stand-in torch lacks
_TMP_SRC = '''
import multiprocessing, weakref
import torch

class _CudaIPCSentDataLimbo(object):
    """torch/csrc/CudaIPCTypes.cpp: the producer keeps every CUDA storage it has sent until each consumer that
    received it has released it (the consumers decrement a shared reference counter)."""
    def __init__(self):
        self.sent = {}
        self.released = 0
        self.next_id = 0

_limbo = _CudaIPCSentDataLimbo()


class _IpcTensor(torch.Tensor):
    """a CUDA tensor rebuilt in the consumer from an IPC handle: the producer's memory, mapped here"""
    def __init__(self, handle, back):
        torch.Tensor.__init__(self, handle["device"], None, handle["nbytes"])
        self._dtype = handle["dtype"]
        weakref.finalize(self, back.put, handle["id"])


def _pack(obj, back):
    if isinstance(obj, torch.Tensor):
        _limbo.next_id += 1
        _limbo.sent[_limbo.next_id] = obj
        return {"ipc": True, "id": _limbo.next_id, "nbytes": obj.nbytes, "dtype": obj.dtype, "device": obj.device}
    if isinstance(obj, tuple):
        return tuple(_pack(x, back) for x in obj)
    return obj


def _unpack(obj, back):
    if isinstance(obj, dict) and obj.get("ipc"):
        return _IpcTensor(obj, back)
    if isinstance(obj, tuple):
        return tuple(_unpack(x, back) for x in obj)
    return obj


def _collect(back):
    """torch.cuda.ipc_collect(), which the producer also runs as it sends: frees what consumers released"""
    while True:
        try:
            key = back.get_nowait()
        except Exception:
            return
        _limbo.sent.pop(key, None)
        _limbo.released += 1


class Queue(object):
    """torch.multiprocessing.Queue: a multiprocessing queue whose CUDA tensors travel as IPC handles"""
    def __init__(self, maxsize=0):
        ctx = multiprocessing.get_context("spawn")
        self._q = ctx.Queue(maxsize)
        self._back = ctx.Queue()

    def put(self, obj, block=True, timeout=None):
        _collect(self._back)
        self._q.put(_pack(obj, self._back), block, timeout)

    def get(self, block=True, timeout=None):
        return _unpack(self._q.get(block, timeout), self._back)


def get_context(method=None):
    return multiprocessing.get_context(method)
'''

_TORCHAUDIO_SRC = '''
import time
import torch
import torch.multiprocessing as _tmp

T0 = 7 * 3600                    # the stand-in's streams start at 07:00:00
CHUNK_SECONDS = 18.0             # ... and compress the morning: one chunk per camera stands for 18 s
RUSH_FROM = 7 * 3600 + 31 * 60   # from 07:31 the consumer falls behind: 6 chunks decoded per 4 consumed


class StreamReader(object):
    """torchaudio.io.StreamReader on an RTSP source, decoded with NVDEC (decoder="hevc_cuvid",
    hw_accel="cuda:0"): chunks of frames_per_chunk frames, uint8 RGB, on the GPU.  A live source comes at
    its own pace; the stand-in paces it against what the consumer has released."""
    def __init__(self, src):
        self.src = src
        self.k = 0

    def add_video_stream(self, frames_per_chunk, decoder=None, hw_accel=None):
        self.frames_per_chunk = frames_per_chunk
        self.device = int(hw_accel.split(":")[1]) if hw_accel else 0

    def stream(self):
        while True:
            pts = T0 + self.k * CHUNK_SECONDS
            _live_source_wait(pts)
            self.k += 1
            chunk = torch.empty(self.frames_per_chunk * ''' + str(FRAME) + ''', dtype=torch.uint8, device=self.device)
            yield (chunk,), pts


_made = [0]
_rush_base = [None]


def _live_source_wait(pts):
    """the cameras deliver in real time: 1 chunk per chunk consumed until the rush, 1.5 from then on"""
    back = _live_source_wait.back
    while True:
        _tmp._collect(back)
        rel = _tmp._limbo.released
        if pts >= RUSH_FROM and _rush_base[0] is None:
            _rush_base[0] = rel
        extra = (rel - _rush_base[0]) // 2 if _rush_base[0] is not None else 0
        if _made[0] < rel + 8 + extra:
            _made[0] += 1
            return
        time.sleep(0.0005)
'''

_TORCH_FN_SRC = '''
def cat(tensors, dim=0, out=None):
    tensors = list(tensors)
    res = empty(sum(t.nbytes for t in tensors) // _ITEMSIZE[tensors[0].dtype], dtype=tensors[0].dtype,
                device=tensors[0].device)
    if all(getattr(t, "_shape", None) for t in tensors):
        res._shape = (sum(t._shape[0] for t in tensors),) + tuple(tensors[0]._shape[1:])
    return res

def t(input):
    v = input.view()
    v._shape = tuple(reversed(input._shape))
    return v

def mm(input, mat2, out=None):
    res = empty(input._shape[0] * mat2._shape[1], dtype=input.dtype, device=input.device)
    res._shape = (input._shape[0], mat2._shape[1])
    return res
'''

_F_SRC = '''
def normalize(input, p=2.0, dim=1, eps=1e-12, out=None):
    res = torch.empty(input.nbytes // torch._ITEMSIZE[input.dtype], dtype=input.dtype, device=input.device)
    res._shape = getattr(input, "_shape", None)
    return res
'''


def _install_standins():
    base = os.path.dirname(torch.__file__)
    tmp = types.ModuleType("torch.multiprocessing")
    tmp.__file__ = os.path.join(base, "multiprocessing", "queue.py")
    exec(compile(_TMP_SRC, tmp.__file__, "exec"), tmp.__dict__)
    sys.modules["torch.multiprocessing"] = tmp
    torch.multiprocessing = tmp
    exec(compile(_TORCH_FN_SRC, torch.__file__, "exec"), torch.__dict__)
    from torch.nn import functional as F
    exec(compile(_F_SRC, F.__file__, "exec"), F.__dict__)
    ta = types.ModuleType("torchaudio.io")
    ta.__file__ = os.path.join(os.path.dirname(base), "torchaudio", "io", "_streaming_media_decoder.py")
    exec(compile(_TORCHAUDIO_SRC, ta.__file__, "exec"), ta.__dict__)
    sys.modules["torchaudio"] = types.ModuleType("torchaudio")
    sys.modules["torchaudio.io"] = ta


_install_standins()

import torch.multiprocessing as mp          # noqa: E402
from torchaudio.io import StreamReader      # noqa: E402
import torchaudio.io as _ta_io              # noqa: E402  (the stand-in's pacing)


# ---------------------------------------------------------------------------------------- the decoder process
CAMERAS = ["rtsp://10.20.4.%d:554/stream1" % i for i in (11, 12, 13, 14)]


def decode_cameras(urls, frames_q):
    torch.cuda.set_device(0)
    _ta_io._live_source_wait.back = frames_q._back
    streams = []
    for cam, url in enumerate(urls):
        reader = StreamReader(url)
        reader.add_video_stream(frames_per_chunk=CHUNK_FRAMES, decoder="hevc_cuvid", hw_accel="cuda:0")
        streams.append((cam, reader.stream()))
    while True:
        for cam, stream in streams:
            (chunk,), pts = next(stream)
            frames_q.put((cam, pts, chunk))


# ---------------------------------------------------------------------------------------- the main process
FP16 = 2


def act(nbytes):
    return torch.empty(nbytes // FP16, dtype=torch.float16, device="cuda")


def vehicles_in_view(pts):
    """(the stand-in's scene) vehicles per frame over the morning: ~20 until 07:25, ~60 from 07:50"""
    minute = (pts - 7 * 3600) / 60.0
    return int(20 + 40 * min(1.0, max(0.0, (minute - 25) / 25.0)))


class YOLOv8Detector(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.backbone = torch.nn.Parameter(torch.empty(43_700_000, dtype=torch.float16, device="cuda"),
                                           requires_grad=False)

    def forward(self, x, frames, pts):
        h = act(x.nbytes * 64 // 3 // 4)          # stem 3->64, stride 2
        h = act(h.nbytes * 2 // 4)                 # 64->128, stride 2
        p3 = act(h.nbytes * 2 // 4)                # 128->256, stride 2
        p4 = act(p3.nbytes * 2 // 4)
        p5 = act(p4.nbytes // 4)
        del h
        head = act((p3.nbytes + p4.nbytes + p5.nbytes) // 2)
        del head
        n = vehicles_in_view(pts)
        return [n] * frames


class VehicleReID(torch.nn.Module):
    """ViT-B/16 on 256x128 vehicle crops: 129 tokens, 768-d embedding"""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.vit = torch.nn.Parameter(torch.empty(86_000_000, dtype=torch.float16, device="cuda"),
                                      requires_grad=False)

    def forward(self, crops, n):
        tokens = n * 129
        h = act(tokens * 768 * FP16)
        for _ in range(12):
            qkv = act(tokens * 3 * 768 * FP16)
            del qkv
            mlp = act(tokens * 3072 * FP16)
            del mlp
        emb = act(n * 768 * FP16)
        emb._shape = (n, 768)
        return emb


REID_BATCH = 256


def crop_and_resize(frames, n):
    """roi_align of n boxes to 256x128"""
    return act(n * 3 * 256 * 128 * FP16)


def cross_camera_report(window_shots):
    """origin-destination matching: every vehicle shot of the interval against every other"""
    emb = torch.nn.functional.normalize(torch.cat(window_shots), dim=1)
    sims = torch.mm(emb, torch.t(emb))
    # ... best match per shot across the other cameras, then counts per (entry, exit) pair
    del sims, emb
    torch.cuda.empty_cache()          # give the big matrix back between reports
    return {}


def main():
    torch.cuda.set_device(0)
    scen_truth.note_every_empty(torch)
    detector = YOLOv8Detector().eval()
    reid = VehicleReID().eval()
    frames_q = mp.Queue()
    ctx = mp.get_context("spawn")
    decoder = ctx.Process(target=decode_cameras, args=(CAMERAS, frames_q), daemon=True)
    decoder.start()

    previous_shots, window_shots, next_report = [], [], 7 * 3600 + 15 * 60
    try:
        while True:
            batch = [frames_q.get(timeout=30) for _ in range(len(CAMERAS))]      # one chunk per camera
            pts = max(item[1] for item in batch)
            with torch.inference_mode():
                frames = torch.cat([item[2] for item in batch])
                del batch
                x = act(len(CAMERAS) * CHUNK_FRAMES * 3 * 1280 * 736 * FP16)      # letterbox 1280, /255, half
                boxes = detector(x, len(CAMERAS) * CHUNK_FRAMES, pts)
                del x
                n = sum(boxes)
                for i in range(0, n, REID_BATCH):
                    m = min(REID_BATCH, n - i)
                    crops = crop_and_resize(frames, m)
                    emb = reid(crops, m)
                    del crops, emb
                del frames
                # new tracks and every 2nd shot of the live ones go to the interval's gallery
                shots = torch.empty(n // 2 * 768, dtype=torch.float16, device="cuda")
                shots._shape = (n // 2, 768)
                window_shots.append(shots)
                if pts >= next_report:
                    # vehicles are matched over the last 30 minutes: this interval and the one before
                    hhmm = "%02d:%02d" % (next_report // 3600, next_report // 60 % 60)
                    cross_camera_report(previous_shots + window_shots)
                    print("report %s: %d shots, main process %.2f GiB allocated" % (
                        hhmm, sum(s._shape[0] for s in previous_shots + window_shots),
                        torch.cuda.memory_allocated() / GiB), flush=True)
                    previous_shots, window_shots, next_report = window_shots, [], next_report + 15 * 60
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise


if __name__ == "__main__":
    main()
