"""Speculative-decoding summarizer for earnings-call transcripts on an L4: the acceptance log keeps every round's draft KV.

The real program (summarize_calls.py, transformers 4.35, autoawq) is a hand-rolled speculative decoder:

    target = AutoModelForCausalLM.from_pretrained("hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4",
                                                  torch_dtype=torch.float16, device_map="cuda:0")
    draft = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B-Instruct",
                                                 torch_dtype=torch.bfloat16, device_map="cuda:0")
    class SpeculativeSummarizer:
        def __init__(self, target, draft, k=5):
            self.acceptance_log = []                 # added for the acceptance-rate plot in the notebook
        @torch.inference_mode()
        def summarize(self, prompt_ids, max_new_tokens=256):
            t_out = self.target(prompt_ids, use_cache=True); d_out = self.draft(prompt_ids, use_cache=True)
            while produced < max_new_tokens:
                for _ in range(self.k):              # the draft proposes k tokens, one forward each
                    d_out = self.draft(tok, past_key_values=d_out.past_key_values, use_cache=True)
                t_out = self.target(proposed, past_key_values=t_out.past_key_values, use_cache=True)
                n = accepted(...)                    # rejection sampling; caches cropped to the accepted prefix
                self.acceptance_log.append({"round": r, "accepted": n, "draft_probs": q,
                                            "draft_past": d_out.past_key_values})      # <- the leak
    for call in transcripts: summaries.append(spec.summarize(tokenize(call)))

With the legacy tuple caches every forward returns new K/V tensors (torch.cat of the old and the new
positions), so each log entry pins that round's whole draft cache.  Nobody needed the cache in the log:
the notebook only reads "accepted".

Sizes (L4, 24 GiB; context ~0.5 GiB):
  * target Llama-3.1-8B AWQ int4: 3.7 GiB packed linears + 1 GiB embeddings + 1 GiB lm_head = 5.7 GiB;
    draft Llama-3.2-1B bf16: 2.3 GiB;
  * target KV 128 KiB per token (32 layers x 8 kv heads x 128 x 2 x 2 B), draft KV 32 KiB per token
    (16 layers x 8 x 64 x 2 x 2 B);
  * transcripts of 3.1k, 9.2k and 14k tokens, 256-token summaries, k = 5, ~3.4 tokens produced per round
    (~75 rounds per call);
  * the log keeps 32 KiB x context per round: ~100 MiB per round in the first call (7.3 GiB after its
    73 rounds), ~290 MiB per round in the second; the 7th round of the second call fails on an 18 MiB
    target K/V concat with 9 GiB in the log, 7.9 GiB of weights, ~2.5 GiB of live caches, and ~3.8 GiB
    cached in partly used 20 MiB segments (the 1-10 MiB draft K/V tensors are carved from 20 MiB
    segments, and the ones the log pins keep those segments from being returned).
Everything the job needs at once fits in ~10 GiB: the models, one target cache and one draft cache.

What an expert says first: memory grows every round because the acceptance log keeps references to
each round's draft cache: log numbers only (accepted counts, n.item()), or cap it (a deque of scalars).
Wrong advice: quantize further (the target is already int4); expandable_segments or empty_cache first
(the cached 3.8 GiB is a side effect of the pinned tensors; reclaiming it buys ~13 rounds of a call that
needs 75, and the next transcript is longer); inference_mode (already on); shorter transcripts or a
smaller/quantized KV cache (they only move the failure); gradient checkpointing; a bigger GPU.
"""
import collections

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

TARGET_ID = "hugging-quants/Meta-Llama-3.1-8B-Instruct-AWQ-INT4"
DRAFT_ID = "meta-llama/Llama-3.2-1B-Instruct"
TRANSCRIPT_TOKENS = [3100, 9200, 14000]        # Q3 calls: small-cap, bank, conglomerate (with the Q&A)
MAX_NEW_TOKENS = 256
NUM_SPECULATIVE = 5
ACCEPT_PATTERN = [3, 2, 5, 1, 3, 2, 4, 0]      # accepted draft tokens per round, as the job logs them

MiB = 1024 * 1024


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in torch has none)."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class DecoderLayer(nn.Module):
    """One Llama decoder layer: its weights (int4-packed for AWQ, bf16 for the draft) and, per forward,
    the new K/V of the layer: torch.cat((past_k, k), dim=-2) -- a new tensor each call."""

    def __init__(self, weight_bytes, kv_bytes_per_token, mlp_bytes_per_token, weight_dtype):
        nn.Module.__init__(self)
        itemsize = 1 if weight_dtype == torch.uint8 else 2
        self.qkv_o = nn.Parameter(torch.empty(weight_bytes // 3 // itemsize, dtype=weight_dtype), requires_grad=False)
        self.mlp = nn.Parameter(torch.empty(2 * weight_bytes // 3 // itemsize, dtype=weight_dtype), requires_grad=False)
        self.kv_bytes_per_token = kv_bytes_per_token        # for K (and again for V)
        self.mlp_bytes_per_token = mlp_bytes_per_token

    def forward(self, hidden, new_tokens, layer_past):
        past_len = 0 if layer_past is None else layer_past[0].nbytes // self.kv_bytes_per_token
        k = torch.empty((past_len + new_tokens) * self.kv_bytes_per_token // 2, dtype=torch.bfloat16)
        v = torch.empty((past_len + new_tokens) * self.kv_bytes_per_token // 2, dtype=torch.bfloat16)
        inter = torch.empty(new_tokens * self.mlp_bytes_per_token // 2, dtype=torch.bfloat16)   # act(gate) * up
        out = torch.empty(hidden.nbytes // 2, dtype=torch.bfloat16)
        del inter
        return out, (k, v)


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class LlamaForCausalLM(nn.Module):
    def __init__(self, name, layers, hidden, vocab, layer_weight_bytes, kv_bytes_per_token, mlp_bytes_per_token,
                 weight_dtype, tied_embeddings):
        nn.Module.__init__(self)
        self.name_or_path = name
        self.hidden, self.vocab = hidden, vocab
        self.embed_tokens = nn.Parameter(torch.empty(vocab * hidden, dtype=torch.bfloat16), requires_grad=False)
        self.layers = ModuleList([DecoderLayer(layer_weight_bytes, kv_bytes_per_token, mlp_bytes_per_token,
                                               weight_dtype) for _ in range(layers)])
        if not tied_embeddings:
            self.lm_head = nn.Parameter(torch.empty(vocab * hidden, dtype=torch.float16), requires_grad=False)

    def forward(self, new_tokens, past_key_values=None, logits_for=1):
        hidden = torch.empty(new_tokens * self.hidden, dtype=torch.bfloat16)
        presents = []
        for i, layer in enumerate(self.layers):
            hidden, present = layer(hidden, new_tokens, None if past_key_values is None else past_key_values[i])
            presents.append(present)
        logits = torch.empty(logits_for * self.vocab, dtype=torch.float32)
        return CausalLMOutputWithPast(logits, tuple(presents))


def load_target():
    # AWQ int4: 32 layers x 116 MiB packed (qweight/qzeros/scales), embeddings and lm_head in fp16
    return LlamaForCausalLM(TARGET_ID, 32, 4096, 128256, 116 * MiB, 8 * 128 * 2, 14336 * 2, torch.uint8,
                            tied_embeddings=False)


def load_draft():
    # Llama-3.2-1B bf16: 16 layers x 116 MiB, tied embeddings (128256 x 2048)
    return LlamaForCausalLM(DRAFT_ID, 16, 2048, 128256, 116 * MiB, 8 * 64 * 2, 8192 * 2, torch.bfloat16,
                            tied_embeddings=True)


def crop(past, length):
    """Legacy-cache crop to the accepted prefix: k[:, :, :length] (views of the same storage)."""
    return tuple((k.view(), v.view()) for k, v in past)


class SpeculativeSummarizer(object):
    def __init__(self, target, draft, k=NUM_SPECULATIVE):
        self.target, self.draft, self.k = target, draft, k
        self.acceptance_log = []        # for the acceptance-rate plot in the notebook
        self.rounds = 0

    def summarize(self, prompt_tokens, max_new_tokens=MAX_NEW_TOKENS):
        with torch.inference_mode():
            t_out = self.target(prompt_tokens)
            d_out = self.draft(prompt_tokens)
            produced = 0
            while produced < max_new_tokens:
                for _ in range(self.k):
                    d_out = self.draft(1, past_key_values=d_out.past_key_values)
                q = torch.empty(self.k * self.draft.vocab, dtype=torch.float32)       # draft probabilities
                t_out = self.target(self.k + 1, past_key_values=t_out.past_key_values, logits_for=self.k + 1)
                n = ACCEPT_PATTERN[self.rounds % len(ACCEPT_PATTERN)]
                context = prompt_tokens + produced + n + 1
                t_out.past_key_values = crop(t_out.past_key_values, context)
                d_out.past_key_values = crop(d_out.past_key_values, context)
                self.acceptance_log.append({"round": self.rounds, "accepted": n, "draft_probs": q,
                                            "draft_past": d_out.past_key_values})
                produced += n + 1
                self.rounds += 1
            return produced


def main():
    target = load_target()
    draft = load_draft()
    spec = SpeculativeSummarizer(target, draft)
    summaries = collections.OrderedDict()
    for i, tokens in enumerate(TRANSCRIPT_TOKENS):
        summaries["call_%d" % i] = spec.summarize(tokens)
        print("call %d (%d tokens): %d rounds so far" % (i, tokens, spec.rounds), flush=True)
    return summaries


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
