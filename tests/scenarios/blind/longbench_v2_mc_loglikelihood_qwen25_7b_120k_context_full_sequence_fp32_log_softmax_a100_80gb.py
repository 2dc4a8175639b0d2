"""Long-context eval harness scoring LongBench v2 multiple choice by loglikelihood with Qwen2.5-7B-Instruct
(YaRN, 128k) on an A100 80GB: log-probs of every position of a 120k-token context, in fp32.

The real harness (evalsuite/hf_lm.py, modelled on lm-eval's HFLM; transformers 4.46, bf16, SDPA):

    class HFLM:
        def _model_call(self, inps):
            return self.model(inps).logits                                # [1, T, 152064] bf16
        def _loglikelihood_tokens(self, requests):
            for batch in self.collate(requests):                          # longest first, as lm-eval
                logits = self._model_call(batch.inps)
                logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)   # <- OOM, first long request
                for r, cont in zip(batch, batch.conts):
                    yield logp[r.row, r.cont_slice].gather(-1, cont).sum().item()

    lm = HFLM("Qwen/Qwen2.5-7B-Instruct", max_length=131072, batch_size=1)  # rope_scaling yarn x4
    evaluate(lm, ["gpqa_diamond_mc", "longbench_v2_mc"])

GPQA (prompts of ~250 tokens) runs fine.  LongBench v2 contexts are 8k to 2M words; the harness
middle-truncates them to 120,000 tokens (max_length minus room for the answer), and sorts requests
longest first, so the very first request is a 120,000-token context whose answer is one token
(" A" .. " D": the four options share the context and are scored from one forward pass).

Sizes: A100-SXM4-80GB (80 GiB); CUDA context ~0.5 GiB; weights 14.2 GiB bf16.  The forward itself is
fine with SDPA (~21 GiB at its peak: the 6.4 GiB KV cache the output carries, the MLP temporaries).
But the model returns logits for every position: 120,000 x 152,064 x 2 B = 34.0 GiB, and the fp32
log_softmax over all of them asks for 68.0 GiB with 31.2 GiB free.  Of those 120,000 x 152,064
log-probabilities, the score needs 4.

What an expert says first: compute logits only where they are read -- the answer position(s): slice
the hidden states before lm_head (logits_to_keep / num_logits_to_keep = the continuation length) or
at least run the log_softmax on logits[:, -n_cont-1:-1]; scoring the last positions only makes the
head's output 1 x 152,064.  Chunking the log_softmax over positions would also fit.
Wrong advice: truncating the contexts to a shorter max_length (that changes what a long-context
benchmark measures), flash-attention (attention is not what fails; SDPA is already O(T)), a smaller
batch (it is 1), inference_mode (already under no_grad), empty_cache / expandable_segments
(the request is twice the free memory), gradient checkpointing (no backward).
"""
import random

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL = "Qwen/Qwen2.5-7B-Instruct"
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 3584, 18944, 28, 152064, 512
MAX_LENGTH = 131072
TRUNCATE_TO = 120_000
batch_size = 1


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


class Qwen2Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, tokens, cache):
        q = self.q_proj(x, tokens)
        cache.append((self.k_proj(x, tokens), self.v_proj(x, tokens)))   # DynamicCache.update
        attn = torch.empty_like(q)                                        # F.scaled_dot_product_attention
        del q
        return self.o_proj(attn, tokens)


class Qwen2MLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, x, tokens):
        act = torch.empty_like(self.gate_proj(x, tokens))
        up = self.up_proj(x, tokens)
        h = torch.empty_like(up)
        del act, up
        return self.down_proj(h, tokens)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Qwen2Attention()
        self.mlp = Qwen2MLP()

    def forward(self, h, tokens, cache):
        a = self.self_attn(h, tokens, cache)
        h = torch.empty_like(a)                      # residual
        return self.mlp(h, tokens)


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits = logits
        self.past_key_values = past_key_values


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _bf16(VOCAB * HIDDEN)
        self.layers = ModuleList([Qwen2DecoderLayer() for _ in range(LAYERS)])
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, tokens):
        cache = []
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)
        for layer in self.layers:
            h = layer(h, tokens, cache)
        logits = self.lm_head(h, tokens)             # every position (logits_to_keep=0)
        return CausalLMOutputWithPast(logits, cache)


class HFLM(object):
    def __init__(self, pretrained, max_length, batch_size):
        self.model = Qwen2ForCausalLM()
        self.model.eval()
        self.max_length = max_length
        self.batch_size = batch_size

    def _model_call(self, inps, tokens):
        with torch.no_grad():
            return self.model(inps, tokens).logits

    def _loglikelihood_tokens(self, requests):
        results = []
        for ctx_len, n_cont in sorted(requests, reverse=True):              # longest first
            T = min(ctx_len, TRUNCATE_TO) + n_cont
            with torch.no_grad():
                inps = torch.empty(T * 8)                                    # int64 token ids
                logits = self._model_call(inps, T)
                logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
                results.append(0.0)                                          # .gather(...).sum().item()
                del logits, logp, inps
        return results


def load_requests(task):
    """The tokenized (context, answer) requests: GPQA prompts ~250 tokens; LongBench v2 contexts from
    ~8k tokens to far past the window (truncated to TRUNCATE_TO in _loglikelihood_tokens)."""
    rng = random.Random(task)
    if task == "gpqa_diamond_mc":
        return [(rng.randint(150, 420), 1) for _ in range(198)]    # the 4 options share one pass
    return [(int(8000 * 2 ** rng.uniform(0, 8)), 1) for _ in range(503)]


def main():
    lm = HFLM(MODEL, max_length=MAX_LENGTH, batch_size=batch_size)
    for task in ["gpqa_diamond_mc", "longbench_v2_mc"]:
        reqs = load_requests(task)
        scores = lm._loglikelihood_tokens(reqs)
        print("%-16s %d requests" % (task, len(scores)))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
