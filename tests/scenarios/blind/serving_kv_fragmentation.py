"""server.py -- an LLM server without a paged KV cache (plain HF generate behind a request queue,
continuous batching of its own): each request gets a KV cache tensor of its own length, prompts
vary from a few hundred to several thousand tokens, and requests finish out of order:

    model = AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.bfloat16).cuda()   # 15 GiB
    warmup(model, max_batch)                  # one max-size pass: 8 x 1 GiB, freed (cached)
    while True:
        for req in scheduler.admit():
            req.kv = torch.empty(kv_bytes(req.prompt_len + req.max_new))   # odd sizes
            prefill(req)                                                   # temporaries
        decode_step(active)                                                # temporaries
        for req in finished(): del req.kv

After some hundreds of scheduler steps the cached segments are peppered with live KV tensors of odd
sizes.  A long prompt's prefill needs one 1.1 GiB block for its attention scores: PyTorch caches
3.1 GiB it is not using and the card has 0.8 GiB free, but no free block is larger than 0.9 GiB.  An expert: the textbook
fragmentation case -- PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb); not
a leak (live memory is flat), no other process, not a bigger GPU.
"""
import random
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def load_weights():
    weights = []
    for _ in range(60):
        weights.append(torch.empty(256 * MiB, device="cuda"))          # 15 GiB bf16
    return weights


def warmup():
    """One pass at the maximum batch (what the server profiles at start): freed, cached."""
    acts = []
    for _ in range(8):
        acts.append(torch.empty(1024 * MiB, device="cuda"))
    del acts


class Request(object):
    def __init__(self, rid, prompt_len, max_new):
        self.rid, self.prompt_len, self.max_new = rid, prompt_len, max_new
        self.kv = None


def kv_bytes(tokens):
    return tokens * 40 * 1024 + 3 * 1024 * 1024 // 2            # 40 KiB per token (bf16, GQA) + slack


def prefill(req):
    scores = torch.empty(req.prompt_len * req.prompt_len * 20, device="cuda")     # attention scores
    hidden = torch.empty(req.prompt_len * 16 * 1024 + 4 * MiB, device="cuda")
    return scores, hidden


def serve(steps):
    rng = random.Random(3)
    active = []
    rid = 0
    with torch.inference_mode():
        for step in range(steps):
            for _ in range(rng.choice((0, 0, 1, 1, 2))):
                rid += 1
                long = rng.random() < 0.03
                plen = rng.randint(6000, 9000) if long else rng.randint(200, 3000)
                req = Request(rid, plen, rng.randint(64, 1024))
                req.kv = torch.empty(kv_bytes(req.prompt_len + req.max_new), device="cuda")
                tmp = prefill(req)
                del tmp
                active.append(req)
            step_tmp = torch.empty(len(active) * 2 * MiB + 1 * MiB, device="cuda")
            del step_tmp
            for req in list(active):
                if rng.random() < 0.02:
                    active.remove(req)
                    req.kv = None
            time.sleep(0.001)


def main():
    weights = load_weights()
    warmup()
    serve(20000)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
