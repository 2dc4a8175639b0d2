"""pdf_to_md.py -- a Kubernetes Job that turns a law firm's scanned PDFs into markdown with a
Qwen2-VL-7B-based OCR model (olmOCR-style: one page image in, the page's text out), bf16 (15.5 GiB),
transformers' generate, on one H100 80GB HBM3 (79.6 GiB).  Pages go in batches of 80, greedy, with
max_new_tokens=16384 ("dense tables can be long").  The author made the batch loop "OOM-proof":

    def transcribe(pages):
        try:
            with torch.inference_mode():
                return generate(model, pages, max_new_tokens=16384)
        except torch.cuda.OutOfMemoryError:
            torch.cuda.empty_cache()
            half = len(pages) // 2
            return transcribe(pages[:half]) + transcribe(pages[half:])      # retry, INSIDE the except

Ordinary pages stop after 1-2k tokens (batch 40 peaked at 30 GiB).  Batch 41 holds a 60-page appendix
of dense financial tables: the model loops on repeated table rows up to max_new_tokens, and all 80 rows
of the batch keep their KV cache until the longest row finishes -- the cache reaches ~63 GiB and the
next step's cache growth fails.  The handler then retries with 40 pages while still inside the except
block: the live exception's traceback holds the failed generate call's frames, so its 63 GiB of KV
cache is still referenced, empty_cache frees nothing of it, and the half-size retry fails within its
first chunks; so do 20, 10, 5, 2 and 1 page(s), each nested in the last one's handler ("During handling
of the above exception, another exception occurred"), and the job dies on a single page's 28 MiB
request -- not on the first failure.

An expert: first, retry outside the except block (set a flag / return a sentinel, leave the handler,
drop the references, then empty_cache and split); then make the batches fit -- group pages by expected
length or cap max_new_tokens per page.  Wrong first advice: empty_cache (it is already called, and the
memory is referenced), a bigger GPU or quantization (the retry would fit if the first attempt's memory
were released), expandable_segments (nothing is fragmented), inference_mode (already on).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
KV_PER_TOKEN = 28 * 2 * 512 * 2            # layers x (k, v) x 4 kv heads x 128 x bf16 = 56 KiB
CHUNK = 512                                # DynamicCache grows; modelled here 512 positions at a time


class Qwen2VLForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.visual = torch.nn.Parameter(torch.empty(675 * MiB, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        for i in range(28):
            setattr(self, "layers_%d" % i, torch.nn.Parameter(
                torch.empty(233 * MiB, dtype=torch.bfloat16, device="cuda"), requires_grad=False))
        self.lm_head = torch.nn.Parameter(torch.empty(152_064 * 3584, dtype=torch.bfloat16, device="cuda"),
                                          requires_grad=False)


def generate(model, pages, max_new_tokens):
    """model.generate(**inputs): prefill the page images (~1,300 vision tokens each), then decode until
    every row is done; the rows that finished early keep their cache (padding) until the longest ends."""
    rows = len(pages)
    longest = min(max(p["tokens"] for p in pages), max_new_tokens)
    past_key_values = []
    for pos in range(0, 1300 + longest, CHUNK):
        past_key_values.append(torch.empty(rows * CHUNK * KV_PER_TOKEN, device="cuda"))
        logits = torch.empty(rows * 152_064 * 4, device="cuda")          # last position, upcast to fp32
        del logits
    return ["# page %d\n..." % p["page"] for p in pages]


def transcribe(pages):
    try:
        with torch.inference_mode():
            return generate(model, pages, max_new_tokens=16384)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        if len(pages) == 1:
            raise
        torch.cuda.empty_cache()
        half = len(pages) // 2
        return transcribe(pages[:half]) + transcribe(pages[half:])


def batches():
    page = 0
    for b in range(40, 42):
        batch = []
        for i in range(80):
            page += 1
            dense = b == 41 and i >= 20                    # the appendix of financial tables
            batch.append({"page": page, "tokens": 20_000 if dense else 900 + 37 * (i % 30)})
        yield b, batch


model = Qwen2VLForConditionalGeneration().eval()
for b, pages in batches():
    out = transcribe(pages)
    print("batch", b, "pages", len(out), "peak %.1f GiB" % (torch.cuda.max_memory_allocated() / GiB))
sys.exit(0)
