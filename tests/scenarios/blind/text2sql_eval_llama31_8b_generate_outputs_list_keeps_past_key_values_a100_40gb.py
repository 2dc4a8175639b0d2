"""eval_bird.py -- the nightly regression eval of a data team's text-to-SQL model: a Llama-3.1-8B-Instruct full
fine-tune (bf16, 15.0 GiB) generates SQL for the 1,534 questions of the BIRD dev set, greedy, on one A100-SXM4-
40GB (39.5 GiB usable).  The prompts carry the database schema (CREATE TABLE statements and sample rows), so
they are long: 1,100 to 1,900 tokens after left padding to the longest of the batch.  The SQL is executed
against the SQLite databases afterwards, in a process pool, so the generation loop only collects:

    model = AutoModelForCausalLM.from_pretrained(CKPT, torch_dtype=torch.bfloat16, device_map="cuda")
    tok.padding_side = "left"
    results = []
    with torch.inference_mode():
        for i in range(0, len(questions), 16):
            batch = questions[i:i + 16]
            enc = tok([build_prompt(q) for q in batch], return_tensors="pt", padding=True).to("cuda")
            out = model.generate(**enc, max_new_tokens=256, do_sample=False,
                                 return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
            results.append((batch, enc, out))
    # later: tok.batch_decode(out.sequences[:, enc["input_ids"].shape[1]:]) for each, then execute

return_dict_in_generate=True was copied from a notebook that looked at out.scores; only out.sequences is used.
But the GenerateDecoderOnlyOutput that generate() returns also carries past_key_values, the batch's whole
DynamicCache: 32 layers x keys and values x 16 sequences x (prompt + generated) positions, 128 KiB per
position per sequence -- 3 to 4 GiB per batch, on the GPU, kept by `results` for the rest of the run.  The CI
smoke test (48 questions, 3 batches) passed.  The nightly run fails in the 6th batch, in generate()'s prefill
(the MLP's 770 MiB intermediate for 16 x 1,760 prompt tokens): CUDA out of memory with 18 GiB of the five
earlier batches' caches live (and 2.2 GiB cached in pieces that the growing caches left between them).
Memory rose by a step per batch: 19.0, 22.1, 25.9, 29.9, 33.0 GiB allocated after batches 1 to 5.

An expert: a Python object holds the memory -- the list of generate() outputs, each with its KV cache.  Keep
only what the job uses: out.sequences (moved to the CPU, or decoded right away), or generate() without
return_dict_in_generate (it then returns the sequences alone); then each batch's cache is freed when the
next batch starts and the run needs ~4 GiB beside the weights.  Wrong first advice: a smaller batch, fewer
new tokens or a smaller/preallocated KV cache (they only delay the failure by a few batches), quantization or
a bigger GPU, inference_mode (already on), empty_cache or expandable_segments (the caches are referenced;
packing the 2.2 GiB of pieces would buy one batch).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 8, 128, 128256

# --------------------------------------------------------------------------------------------------------------
# What transformers' LlamaForCausalLM.generate() does with a DynamicCache, sized as the real one (the stand-in
# torch has no Llama and no generate()).  Sizes in elements of bf16.


def _bf16(elements):
    return torch.empty(elements, dtype=torch.bfloat16, device="cuda")


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(_bf16(HIDDEN * HIDDEN))
        self.k_proj = torch.nn.Parameter(_bf16(HIDDEN * KV_HEADS * HEAD_DIM))
        self.v_proj = torch.nn.Parameter(_bf16(HIDDEN * KV_HEADS * HEAD_DIM))
        self.o_proj = torch.nn.Parameter(_bf16(HIDDEN * HIDDEN))
        self.gate_proj = torch.nn.Parameter(_bf16(HIDDEN * INTER))
        self.up_proj = torch.nn.Parameter(_bf16(HIDDEN * INTER))
        self.down_proj = torch.nn.Parameter(_bf16(INTER * HIDDEN))
        self.input_layernorm = torch.nn.Parameter(_bf16(HIDDEN))
        self.post_attention_layernorm = torch.nn.Parameter(_bf16(HIDDEN))

    def forward(self, hidden_states, tokens, past_key_value, layer_idx):
        if tokens == past_key_value.batch:              # a decoding step: one position per sequence
            k, v = past_key_value.update(_bf16(tokens * KV_HEADS * HEAD_DIM), _bf16(tokens * KV_HEADS * HEAD_DIM),
                                         layer_idx)
            return _bf16(tokens * HIDDEN)               # (the step's other temporaries: a few KiB each)
        q = _bf16(tokens * HIDDEN)
        k = _bf16(tokens * KV_HEADS * HEAD_DIM)
        v = _bf16(tokens * KV_HEADS * HEAD_DIM)
        k, v = past_key_value.update(k, v, layer_idx)
        attn = _bf16(tokens * HIDDEN)                   # sdpa (flash): no score matrix
        del q, k, v
        hidden_states = _bf16(tokens * HIDDEN)
        gate = _bf16(tokens * INTER)
        up = _bf16(tokens * INTER)
        act = _bf16(tokens * INTER)
        del gate, up
        down = _bf16(tokens * HIDDEN)
        del act, attn
        return down


class DynamicCache(object):
    def __init__(self, batch):
        self.batch = batch
        self.key_cache, self.value_cache, self.seen = [None] * LAYERS, [None] * LAYERS, [0] * LAYERS

    def update(self, key_states, value_states, layer_idx):
        """torch.cat([self.key_cache[layer_idx], key_states], dim=-2): a new tensor one step longer."""
        n = self.seen[layer_idx] + key_states.nbytes // (2 * KV_HEADS * HEAD_DIM * self.batch)
        self.key_cache[layer_idx] = _bf16(self.batch * n * KV_HEADS * HEAD_DIM)
        self.value_cache[layer_idx] = _bf16(self.batch * n * KV_HEADS * HEAD_DIM)
        self.seen[layer_idx] = n
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class GenerateDecoderOnlyOutput(object):
    def __init__(self, sequences, scores=None, logits=None, attentions=None, hidden_states=None,
                 past_key_values=None):
        self.sequences = sequences
        self.scores, self.logits, self.attentions, self.hidden_states = scores, logits, attentions, hidden_states
        self.past_key_values = past_key_values


class BatchEncoding(dict):
    def to(self, device):
        return self


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(_bf16(VOCAB * HIDDEN))
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = torch.nn.Parameter(_bf16(HIDDEN))
        self.lm_head = torch.nn.Parameter(_bf16(VOCAB * HIDDEN))

    def forward(self, batch, tokens_per_seq, past_key_values):
        tokens = batch * tokens_per_seq
        hidden_states = _bf16(tokens * HIDDEN)
        for i, layer in enumerate(self.layers):
            hidden_states = layer(hidden_states, tokens, past_key_values, i)
        last = _bf16(batch * HIDDEN)
        logits = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")   # last position, .float()
        del hidden_states, last
        return logits

    def generate(self, input_ids=None, attention_mask=None, max_new_tokens=20, do_sample=False,
                 return_dict_in_generate=False, pad_token_id=None):
        with torch.no_grad():                           # GenerationMixin.generate is @torch.no_grad()
            batch, prompt = input_ids.batch, input_ids.length
            past_key_values = DynamicCache(batch)
            logits = self.forward(batch, prompt, past_key_values)
            sequences = _bf16(batch * prompt * 4)        # int64 ids
            for step in range(min(max_new_tokens, input_ids.eos_after) - 1):   # until every sequence has hit EOS
                next_tokens = torch.empty(batch * 8, dtype=torch.uint8, device="cuda")
                sequences = _bf16(batch * (prompt + step + 1) * 4)     # torch.cat([input_ids, next_tokens])
                logits = self.forward(batch, 1, past_key_values)
            del logits
            if return_dict_in_generate:
                return GenerateDecoderOnlyOutput(sequences=sequences, past_key_values=past_key_values)
            return sequences


class _Ids(object):
    """input ids / attention mask (batch, length) int64 on the GPU; eos_after: how many tokens the model's
    greedy answers for this batch take until every sequence has emitted EOS (what the real model decides)."""

    def __init__(self, batch, length, eos_after=None):
        self.batch, self.length, self.eos_after = batch, length, eos_after
        self.t = torch.empty(batch * length * 8, dtype=torch.uint8, device="cuda")


class Tokenizer(object):
    padding_side = "right"
    eos_token_id = 128009

    def __call__(self, prompts, return_tensors=None, padding=False):
        length = max(p["tokens"] for p in prompts)      # padded to the longest of the batch
        eos_after = max(p["sql_tokens"] for p in prompts)
        return BatchEncoding(input_ids=_Ids(len(prompts), length, eos_after), attention_mask=_Ids(len(prompts), length))


# --------------------------------------------------------------------------------------------------------------
# eval_bird.py
CKPT = "/checkpoints/sql-llama-8b-ft/v7"
BATCH = 16
MAX_NEW_TOKENS = 256

tok = Tokenizer()
model = LlamaForCausalLM()                              # AutoModelForCausalLM.from_pretrained(CKPT, bf16, "cuda")
model.eval()
tok.padding_side = "left"


def build_prompt(q):
    return q


def load_bird_dev():
    """1,534 questions; the prompt length is the schema's (longest per batch below), the SQL's length is how
    long the batch's greedy decoding runs until every sequence has emitted EOS."""
    longest = [1870, 1420, 1655, 1900, 1310, 1760, 1590, 1880, 1230, 1700]
    sql_len = [214, 171, 256, 188, 243, 160, 229, 256, 140, 199]
    out = []
    for b in range(96):
        for j in range(BATCH):
            out.append({"id": b * BATCH + j, "tokens": longest[b % 10] - 37 * j, "sql_tokens": sql_len[b % 10]})
    return out[:1534]


questions = load_bird_dev()
results = []
try:
    with torch.inference_mode():
        for i in range(0, len(questions), BATCH):
            batch = questions[i:i + BATCH]
            enc = tok([build_prompt(q) for q in batch], return_tensors="pt", padding=True).to("cuda")
            out = model.generate(**enc, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 return_dict_in_generate=True, pad_token_id=tok.eos_token_id)
            results.append((batch, enc, out))
            print("batch %d/%d done, allocated %.1f GiB" % (i // BATCH + 1, (len(questions) + BATCH - 1) // BATCH,
                                                            torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
