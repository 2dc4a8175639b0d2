"""extract.py -- batch field extraction from scanned invoices (OCR text in, JSON out) with a 1.5B
instruct model (Qwen2.5-1.5B-Instruct class: bf16 weights 3.1 GiB, vocabulary 151,936) on a 24 GiB
card, 32 documents per batch, a static KV cache for speed.  To attach a confidence to every field the
user asks generate for the scores and computes per-token log-probabilities afterwards:

    out = model.generate(**batch, max_new_tokens=1024, do_sample=False,
                         output_scores=True, return_dict_in_generate=True)
    logprobs = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)

With output_scores=True, generate keeps every step's processed scores: a float32 (32 x 151,936) tensor
per generated token, 18.5 MiB a step, on the GPU until generate returns.  The KV cache is allocated
once; the weights do not move; memory climbs by one scores tensor per token, and ~900 tokens into the
first long batch (a few documents produce long line-item tables) the next step's scores fail.

An expert: generate is keeping the full-vocabulary scores of every step; keep only what is needed --
the chosen token's log-probability, computed at each step (a LogitsProcessor that records it, or
output_logits off and a second scoring pass over the finished sequences), or move each step's
scores off the GPU; a smaller batch only postpones it.  Not the KV cache (static, allocated once), not
beams (greedy), not quantization, not the allocator's settings.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
# the truth mark's request in bytes: scen_truth.note_every_empty notes torch.empty's first argument,
# which the stand-in counts in elements of the dtype given; note the bytes (compiled as part of torch's
# file, as scen_truth's wrapper is, so that the failing Python line stays the program's)
_NOTED_BYTES = """
def noted_bytes(n, *args, **kw):
    dtype = kw.get("dtype", args[0] if args else None)
    _last.update(n=int(n) * _ITEMSIZE[dtype or "uint8"], reserved=torch.cuda.memory_reserved())
    return plain(n, *args, **kw)
"""
_ns = {"_last": scen_truth._last, "torch": torch, "plain": torch.empty, "_ITEMSIZE": torch._ITEMSIZE}
exec(compile(_NOTED_BYTES, torch.__file__, "exec"), _ns)
torch.empty = _ns["noted_bytes"]

L, H, I, V, KV_HEADS, HEAD_DIM = 28, 1536, 8960, 151936, 2, 128


class GenerateDecoderOnlyOutput(object):
    def __init__(self, sequences, scores):
        self.sequences, self.scores = sequences, scores


class StaticCache(object):
    """cache_implementation="static": K and V of every layer for batch x max_cache_len, allocated once."""

    def __init__(self, batch_size, max_cache_len):
        self.key_cache, self.value_cache = [], []
        for _ in range(L):
            self.key_cache.append(torch.empty(batch_size * KV_HEADS * max_cache_len * HEAD_DIM,
                                              dtype=torch.bfloat16, device="cuda"))
            self.value_cache.append(torch.empty(batch_size * KV_HEADS * max_cache_len * HEAD_DIM,
                                                dtype=torch.bfloat16, device="cuda"))


class GenerationMixin(object):
    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False, output_scores=False,
                 return_dict_in_generate=False):
        with torch.no_grad():
            batch_size, prompt_len = input_ids
            past_key_values = StaticCache(batch_size, prompt_len + max_new_tokens)
            return self._sample(batch_size, past_key_values, max_new_tokens, output_scores)

    def _sample(self, batch_size, past_key_values, max_new_tokens, output_scores):
        scores = ()
        sequences = []
        for step in range(max_new_tokens):
            logits = self(batch_size, past_key_values)                       # (batch, vocab) bf16
            next_token_scores = torch.empty(batch_size * V, dtype=torch.float32, device="cuda")  # processed, fp32
            if output_scores:
                scores += (next_token_scores,)
            next_tokens = torch.empty(batch_size * 8, device="cuda")
            sequences.append(next_tokens)
            del logits
        return GenerateDecoderOnlyOutput(sequences, scores)


class Qwen2ForCausalLM(torch.nn.Module, GenerationMixin):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(V * H, dtype=torch.bfloat16, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(L):
            layer = torch.nn.Module()
            layer.qkv = torch.nn.Parameter(torch.empty(H * (H + 2 * KV_HEADS * HEAD_DIM), dtype=torch.bfloat16,
                                                       device="cuda"))
            layer.o_proj = torch.nn.Parameter(torch.empty(H * H, dtype=torch.bfloat16, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty(3 * H * I, dtype=torch.bfloat16, device="cuda"))
            setattr(self.layers, str(i), layer)
        self.training = False

    def forward(self, batch_size, past_key_values):
        hidden = torch.empty(batch_size * H, dtype=torch.bfloat16, device="cuda")
        return torch.empty(batch_size * V, dtype=torch.bfloat16, device="cuda")     # tied lm_head


def batches(n_docs, batch_size=32):
    for start in range(0, n_docs, batch_size):
        yield {"input_ids": (batch_size, 1536), "attention_mask": None}


def main():
    model = Qwen2ForCausalLM()
    model.eval()
    results = []
    for batch in batches(20000):
        out = model.generate(**batch, max_new_tokens=1024, do_sample=False,
                             output_scores=True, return_dict_in_generate=True)
        results.append(len(out.sequences))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
