"""asr_service.py -- a transcription API (FastAPI, one model worker) serving Whisper large-v3 in fp16
(1.55B parameters, 2.9 GiB) on a T4 (15 GiB) under torch.inference_mode().  Each request's audio is cut
into 30-second windows decoded as one batch (at most 24 windows, 12 minutes, per batch); each customer
has a LoRA adapter for its vocabulary (r=32, 57 MiB fp16), loaded onto the GPU when the customer's
first request is queued (prefetched by the API thread while the worker runs the request before it) and
kept for the life of the service:

    adapters = {}                                   # customer -> LoRA weights on the GPU
    @app.post("/transcribe")
    async def transcribe(req):
        if req.customer not in adapters:
            adapters[req.customer] = load_adapter(req.customer).half().cuda()
        return await worker.submit(req)             # worker: with torch.inference_mode(): model.generate(...)

Most requests are call recordings of 9 to 11.5 minutes (18 to 23 windows).  It ran fine for three days
(a batch of 24 windows every few minutes, new customers every few hours), then: "CUDA out of memory.
Tried to allocate 2.01 GiB. GPU 0 has a total capacity of 15.00 GiB of which 40 MiB is free. Of the
allocated memory 4.79 GiB is allocated by PyTorch, and 9.67 GiB is reserved by PyTorch but
unallocated."  Restarting the service fixes it for a while.  The 32 adapters loaded by then hold
1.8 GiB; what is missing is a contiguous 2 GiB block: each adapter, loaded while a
batch was running, was carved out of the free rest of a cached segment, and now the segments large
enough for a full batch's attention scores each have an adapter in them.  The allocator can release
only segments with nothing in them.

An expert: fragmentation of the caching allocator in a long-lived process; expandable_segments:True in
PYTORCH_CUDA_ALLOC_CONF (or max_split_size_mb), or load the adapters at startup before any batch runs.
empty_cache cannot release a segment that holds an adapter, the model and batch fit the card (they did
for three days), so a smaller model, quantization or a bigger card are wrong first answers.
"""
import random
import sys

import torch
from torch import nn
import scen_truth

MiB = 1 << 20
heads = 20
frames = 1500            # encoder positions of one 30-second window
d_model = 1280
max_windows = 24


class WhisperModel(nn.Module):
    def __init__(self):
        super().__init__()
        for i in range(64):      # 32 encoder + 32 decoder layers, ~24M parameters each, fp16
            p = nn.Parameter(torch.empty(24 * 1000 * 1000, dtype=torch.float16), requires_grad=False)
            setattr(self, "layer_%d" % i, p)
        self.embed_tokens = nn.Parameter(torch.empty(51866 * d_model, dtype=torch.float16), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def generate(self, windows, adapter=None, while_running=None):
        # the encoder's attention scores (eager attention: windows x heads x 1500 x 1500, fp16), made per
        # layer and freed at once: by far the largest block a batch needs
        scores = torch.empty(windows * heads * frames * frames, dtype=torch.float16)
        if while_running is not None:
            while_running()              # the API thread's work meanwhile: the next request's adapter
        del scores
        return "..."


model = WhisperModel.from_pretrained("openai/whisper-large-v3", torch_dtype=torch.float16)
adapters = {}


def load_adapter(customer):
    return torch.empty(30 * 1000 * 1000, dtype=torch.float16)      # r=32 LoRA on q/k/v/o of 64 layers


def ensure_adapter(customer):
    if customer not in adapters:
        adapters[customer] = load_adapter(customer)


def serve_one(customer, windows, next_customer=None):
    """The worker runs one request; the API thread prefetches the adapter of the next one in the queue
    meanwhile, so that a new customer's first request does not wait for it."""
    ensure_adapter(customer)
    with torch.inference_mode():
        return model.generate(windows, adapter=adapters[customer],
                              while_running=lambda: next_customer and ensure_adapter(next_customer))


def main():
    # three days of traffic, replayed: call-center recordings of 9 to 11.5 minutes, a full 12-minute batch
    # now and then, a new customer's first request every so often (it fails on day three, at request 635)
    rng = random.Random(20261203)
    customers = ["cust-%02d" % i for i in range(40)]
    queue = [(customers[0], max_windows)]                # the warm-up request at startup
    for n in range(800):
        known = min(len(customers), 1 + n // 20)
        windows = max_windows if rng.random() < 0.08 else rng.randint(18, 23)
        queue.append((customers[rng.randrange(known)], windows))
    for i, (customer, windows) in enumerate(queue):
        nxt = queue[i + 1][0] if i + 1 < len(queue) else None
        serve_one(customer, windows, nxt)


scen_truth.note_every_empty(torch)
try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
