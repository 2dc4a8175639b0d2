"""A home-grown multiple-choice eval harness (lm-eval style loglikelihood scoring) for Mistral-7B-v0.3 on
an RTX 4090: batches in dataset order, padded to each batch's longest, plus a 2 MiB slice of every
batch kept on the GPU for a calibration report.

The real script (mc_suite.py, transformers 4.44, bf16, SDPA):

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.3", torch_dtype=torch.bfloat16,
                                                 device_map="cuda").eval()
    calib = defaultdict(list)                        # task -> first-answer-token distributions
    for task in ["arc_challenge", "hellaswag", "winogrande", "mmlu", "truthfulqa_mc2", ...]:
        reqs = build_requests(task, limit=300)       # (context + choice) per answer option, dataset order
        for batch in chunked(reqs, 32):
            enc = tok([r.text for r in batch], padding="longest", return_tensors="pt").to("cuda")
            with torch.no_grad():
                logits = model(**enc).logits                                        # bf16
                logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)           # <- OOM (mmlu)
                cont_lp = logp.gather(-1, targets).mul(cont_mask).sum(-1)
                calib[task].append(logits[rows, ctx_len - 1])    # 32 x 32768 bf16 = 2 MiB, stays on GPU
            scores.extend(cont_lp.tolist())

Unlike lm-eval (which sorts requests longest-first), this harness batches requests in dataset order,
so the padded length jumps from task to task and batch to batch (ARC ~160, HellaSwag ~180,
WinoGrande ~60, MMLU's 5-shot prompts up to ~700 tokens), and each batch's logits (32 x T x 32768 x
2 B) and fp32 log-probs (twice that) are blocks of a different size.  The only thing kept per batch
is a 2 MiB bf16 copy of the first-answer-token distribution (190 MiB after 95 batches).  But each
such copy is carved, by the caching allocator's best fit, out of the cached remainder of some
earlier batch's logits or log-prob block, so the segment around it can never be released again, and
its free rest is smaller than the next longer batch needs.

Sizes: RTX 4090, 24 GiB; weights 13.5 GiB bf16 (7.25B), CUDA context ~0.5 GiB.  At MMLU's 8th batch
(32 prompts padded to 700 tokens) the log_softmax output asks for 32 x 700 x 32768 x 4 B = 2.73 GiB
while PyTorch holds 7.9 GiB reserved but unallocated in half-used segments and the driver has
0.5 GiB free.  Live memory is 15.1 GiB (weights, this batch's 1.37 GiB of logits, the kept slices):
the job needs ~18 GiB of a 24 GiB card.

What an expert says first: classic fragmentation -- the memory is there, just not in one piece.
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (no code change); and fix the harness: sort the
requests by length (as lm-eval's Collator does, longest first) and move the kept distributions to
the CPU (.cpu()) so nothing long-lived sits inside the activation segments.
Wrong advice: a smaller batch or a bigger GPU (live memory is ~60% of the card), quantization,
inference_mode (already under no_grad), empty_cache (the allocator already released every free
segment before raising; the held ones are pinned by the kept slices).
"""
import random

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL = "mistralai/Mistral-7B-v0.3"
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 32768, 1024
batch_size = 32
LIMIT = 300                        # docs per task (--limit 300: the nightly smoke suite)
TASKS = [                          # (task, answer options per doc, prompt tokens lo..hi)
    ("arc_challenge", 4, 60, 160),
    ("hellaswag", 4, 90, 180),
    ("winogrande", 2, 30, 60),
    ("mmlu", 4, 60, 700),
    ("truthfulqa_mc2", 8, 40, 300),
    ("piqa", 2, 40, 120),
]


def _bf16(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"))


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList: children under the keys "0" ... "n-1"."""

    def __init__(self, modules):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        torch.nn.Module.__init__(self)
        self.out_features = d_out
        self.weight = _bf16(d_in * d_out)

    def forward(self, x, tokens):
        return torch.empty(tokens * self.out_features, dtype=torch.bfloat16)


class MistralAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, tokens):
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        attn = torch.empty_like(q)                  # F.scaled_dot_product_attention
        del q, k, v
        return self.o_proj(attn, tokens)


class MistralMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, x, tokens):
        g = self.gate_proj(x, tokens)
        u = self.up_proj(x, tokens)
        out = self.down_proj(g, tokens)             # down_proj(act_fn(gate) * up)
        del g, u
        return out


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = MistralAttention()
        self.mlp = MistralMLP()

    def forward(self, h, tokens):
        a = self.self_attn(h, tokens)
        return self.mlp(a, tokens)


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _bf16(VOCAB * HIDDEN)
        self.layers = ModuleList([MistralDecoderLayer() for _ in range(LAYERS)])
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, tokens):
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)
        for layer in self.layers:
            h = layer(h, tokens)
        return self.lm_head(h, tokens)              # logits, bf16


def build_requests(task, options, lo, hi):
    """The tokenized (context + answer option) requests of a task, in dataset order: lengths as the
    Mistral tokenizer gives them for the first LIMIT docs."""
    rng = random.Random("%s-%d" % (task, LIMIT))
    return [rng.randint(lo, hi) for _ in range(LIMIT * options)]


def score_batch(model, lens, calib):
    b, T = len(lens), max(lens)
    with torch.no_grad():
        input_ids = torch.empty(b * T * 8)                          # int64, padding="longest"
        logits = model(input_ids, b * T)
        logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
        cont_lp = torch.empty(b * T, dtype=torch.float32)           # gather * mask
        calib.append(torch.empty(b * VOCAB, dtype=torch.bfloat16))  # logits[rows, ctx_len - 1]
        scores = [0.0] * b                                          # cont_lp.sum(-1).tolist()
        del logits, logp, cont_lp, input_ids
    return scores


def main():
    model = MistralForCausalLM()
    model.eval()
    calib = {}
    results = {}
    for task, options, lo, hi in TASKS:
        reqs = build_requests(task, options, lo, hi)
        calib[task] = []
        scores = []
        for start in range(0, len(reqs), batch_size):
            scores.extend(score_batch(model, reqs[start:start + batch_size], calib[task]))
        results[task] = len(scores)
        print("%-16s %5d requests" % (task, len(scores)))
    print("calibration report over", sum(len(v) for v in calib.values()), "batches")


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
