"""G-Eval style LLM-as-judge on SummEval with Llama-3.1-8B-Instruct on an L40S (48 GB): 20 sampled
judgements per summary with HF generate, 16 prompts per call.

The real script (geval_judge.py, transformers 4.46, bf16, SDPA attention):

    judge = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    tok.padding_side = "left"
    for batch in chunked(summeval_items, 16):                      # 1,600 (article, summary) pairs
        prompts = [GEVAL_COHERENCE.format(doc=it.article, summary=it.summary) for it in batch]
        enc = tok(prompts, return_tensors="pt", padding=True).to("cuda")
        out = judge.generate(**enc, do_sample=True, temperature=1.0, top_p=1.0,
                             num_return_sequences=20, max_new_tokens=8)      # <- OOM in the prefill
        scores = parse_scores(tok.batch_decode(out[:, enc.input_ids.shape[1]:]))

The pilot run used greedy decoding (one judgement per summary, 16 prompts per call) and went
through.  Following the G-Eval paper the user switched to n=20 samples per prompt to average the
score distribution.  HF generate implements num_return_sequences by repeating every prompt 20 times
before the prefill (_expand_inputs_for_generation): the 16 prompts become 320 rows, and the first
batch (instructions + CNN/DM article + summary, left-padded to its longest, 1,334 tokens) is one
prefill over 320 x 1,334 = 426,880 tokens.

Sizes: the weights are 14.96 GiB of bf16, the CUDA context ~0.5 GiB; the L40S has 45 GiB, so
~29.5 GiB are left for the prefill.  In decoder layer 0 the hidden states, the residual sum and the
normed copy are 3 x 3.26 GiB (426,880 x 4096 x 2 B), the DynamicCache keeps that layer's K and V
(1.63 GiB; 52 GiB for all 32 layers), and the MLP's gate_proj output is 426,880 x 14336 x 2 B =
11.4 GiB.  act_fn(gate) asks for another 11.4 GiB with 6.6 GiB free and fails (the MLP would still
need a third 11.4 GiB for act * up).  The greedy pilot was 1/20th of every one of these numbers.

What an expert says first: the effective batch is 16 x 20 = 320 sequences -- cut the prompts per
generate call (1 prompt -> 20 rows: 3.3 GiB of cache for all layers, 0.7 GiB per MLP temporary), or,
better for G-Eval, stop sampling: one forward pass per prompt and read the next-token probabilities of
the score tokens "1".."5" (G-Eval's probability-weighted score), which is 1 row per prompt.
Wrong advice: inference_mode (generate already runs under no_grad), gradient checkpointing (no
backward), expandable_segments / empty_cache (live cache and temporaries exceed the card, the cache
holds almost nothing), quantizing the judge (saves ~10 GiB; the pass needs far more).
"""
import random

import torch

import scen_truth

scen_truth.note_every_empty(torch)

JUDGE = "meta-llama/Llama-3.1-8B-Instruct"
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 128256, 1024
N_ITEMS = 1600                 # SummEval: 100 CNN/DM articles x 16 system summaries
batch_size = 16                # prompts per generate() call
num_return_sequences = 20      # G-Eval: n=20 samples per prompt
MAX_NEW_TOKENS = 8


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


class RMSNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = _bf16(HIDDEN)

    def forward(self, x, tokens):
        return torch.empty_like(x)


class DynamicCache(object):
    """transformers.DynamicCache: one key and one value tensor per layer."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def update(self, k, v, layer_idx):
        self.key_cache.append(k)
        self.value_cache.append(v)


class LlamaAttention(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = idx
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, tokens, past_key_values):
        q = self.q_proj(x, tokens)
        k = self.k_proj(x, tokens)
        v = self.v_proj(x, tokens)
        past_key_values.update(k, v, self.layer_idx)
        attn = torch.empty_like(q)                       # F.scaled_dot_product_attention (memory-efficient)
        del q
        return self.o_proj(attn, tokens)


class LlamaMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, x, tokens):
        act = torch.empty_like(self.gate_proj(x, tokens))      # act_fn(gate_proj(x))
        up = self.up_proj(x, tokens)
        h = torch.empty_like(up)                                # act * up
        del act, up
        return self.down_proj(h, tokens)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.input_layernorm = RMSNorm()
        self.self_attn = LlamaAttention(idx)
        self.post_attention_layernorm = RMSNorm()
        self.mlp = LlamaMLP()

    def forward(self, hidden_states, tokens, past_key_values):
        normed = self.input_layernorm(hidden_states, tokens)
        attn_out = self.self_attn(normed, tokens, past_key_values)
        del normed
        hidden_states = torch.empty_like(hidden_states)         # residual add
        del attn_out
        normed = self.post_attention_layernorm(hidden_states, tokens)
        mlp_out = self.mlp(normed, tokens)
        del normed
        out = torch.empty_like(hidden_states)                   # residual add
        del mlp_out
        return out


class LlamaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _bf16(VOCAB * HIDDEN)
        self.layers = ModuleList([LlamaDecoderLayer(i) for i in range(LAYERS)])
        self.norm = RMSNorm()

    def forward(self, input_ids, tokens, past_key_values):
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16)  # embed_tokens(input_ids)
        for layer in self.layers:
            h = layer(h, tokens, past_key_values)
        return self.norm(h, tokens)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Linear(HIDDEN, VOCAB)
        self.generation_config = {"do_sample": False, "num_return_sequences": 1}

    def forward(self, input_ids, rows, seq_len, past_key_values):
        hidden = self.model(input_ids, rows * seq_len, past_key_values)
        return self.lm_head(hidden, rows)            # logits_to_keep=1: the last position of each row only

    def generate(self, input_ids, rows, seq_len, do_sample=True, temperature=1.0, num_return_sequences=1,
                 max_new_tokens=20):
        """GenerationMixin.generate (under torch.no_grad): the inputs repeated num_return_sequences
        times, the prefill over all rows, then one token at a time."""
        with torch.no_grad():
            expanded = torch.empty(rows * num_return_sequences * seq_len * 8)   # repeat_interleave, int64
            n = rows * num_return_sequences
            cache = DynamicCache()
            logits = self(expanded, n, seq_len, cache)
            for step in range(max_new_tokens):
                logits = self(torch.empty(n * 8), n, 1, cache)
            return torch.empty(n * (seq_len + max_new_tokens) * 8)


def load_summeval():
    """The tokenized G-Eval coherence prompts: instructions + CNN/DM article + summary (lengths as the
    Llama-3.1 tokenizer gives them; articles run 400-1,000 words)."""
    rng = random.Random(11)
    return [rng.randint(690, 1480) for _ in range(N_ITEMS)]


def main():
    judge = LlamaForCausalLM()
    judge.eval()
    items = load_summeval()
    results = []
    for start in range(0, len(items), batch_size):
        lens = items[start:start + batch_size]
        seq_len = max(lens)                                  # left padding to the batch's longest
        enc = torch.empty(len(lens) * seq_len * 8)           # input_ids, int64
        out = judge.generate(enc, len(lens), seq_len, do_sample=True, temperature=1.0,
                             num_return_sequences=num_return_sequences, max_new_tokens=MAX_NEW_TOKENS)
        results.append(out.nbytes)
        del out, enc
    print("judged", len(results))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
