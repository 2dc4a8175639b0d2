"""eval_dsi.py -- a search research team trained a Differentiable Search Index (DSI: a seq2seq model that
maps a query straight to a document id) on NQ320k with T5-large (738M parameters, fp32 as trained) and
semantic (hierarchical k-means) docids.  The evaluation reproduces the paper's table: Hits@1, Hits@10 and
Hits@100 on the 7,830 dev queries.  Generative retrieval ranks documents by beam search, so Hits@100
needs the 100 best docids per query: num_beams=100, num_return_sequences=100, decoding constrained to
valid docids by a prefix trie.  One A100 40GB (39.5 GiB usable), transformers 4.35:

    model = T5ForConditionalGeneration.from_pretrained(CKPT).cuda().eval()
    loader = DataLoader(dev_queries, batch_size=64, collate_fn=collator)   # 64 as in training
    for batch in loader:
        out = model.generate(input_ids=..., attention_mask=..., max_length=12, num_beams=100,
                             num_return_sequences=100, prefix_allowed_tokens_fn=trie.allowed)
        ranked = tok.batch_decode(out, skip_special_tokens=True) ...

generate() runs without autograd, but beam search turns the batch of 64 queries into 6,400 hypotheses:
the encoder output is repeated 100 times (0.8 GiB) and, at the first decoding step, every decoder layer
caches the cross-attention keys and values of 6,400 x 32 query tokens x 1024 x fp32: 1.56 GiB per layer,
37.5 GiB for the 24 layers, before any docid token is produced.  The first batch fails in the cross-
attention of decoder layer 23 (an 800 MiB request; weights 2.75 GiB, cache 35 GiB).

An expert: the beam width is the metric here (Hits@100 is read off the 100 beams), so it stays; what
is too big is 64 queries x 100 beams at once.  Generate for a few queries at a time (batch 4-8: 400-800
hypotheses, ~2-4 GiB of cache), and/or run the model in bf16 on the A100 (halves the cache and the
weights; T5 is fine in bf16, not in fp16).  Wrong advice: fewer beams (changes what is measured: there
is no Hits@100 with 10 beams), inference_mode/no_grad (generate already runs without autograd),
gradient checkpointing, flash attention (the memory is the KV cache, not attention scores),
expandable_segments/empty_cache (nothing is cached), quantization (changes the model being evaluated),
a preallocated-KV-cache setting (this is HF generate, there is none).
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
D, FF, HEADS, V, NL = 1024, 4096, 16, 32128, 24       # T5-large


def _t(nbytes):
    return torch.empty(nbytes, device="cuda")


# ---- transformers.models.t5 / generation, as far as memory goes (fp32, no_grad)
class Linear(nn.Module):
    def __init__(self, i, o):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(_t(i * o * 4))
        self.o = o

    def forward(self, tokens):
        return _t(tokens * self.o * 4)


class T5Attention(nn.Module):
    def __init__(self, is_cross):
        nn.Module.__init__(self)
        self.q, self.k, self.v, self.o = Linear(D, D), Linear(D, D), Linear(D, D), Linear(D, D)
        self.is_cross = is_cross

    def forward(self, batch, q_len, kv_len, past_key_value=None, use_cache=False):
        query_states = self.q(batch * q_len)
        if past_key_value is not None:
            key_states, value_states = past_key_value
        else:
            key_states = self.k(batch * kv_len)          # project(key_value_states, self.k): encoder side
            value_states = self.v(batch * kv_len)
        scores = _t(batch * HEADS * q_len * kv_len * 4)
        attn_output = self.o(batch * q_len)
        del scores, query_states
        present = (key_states, value_states) if use_cache else None
        return attn_output, present


class T5Block(nn.Module):
    def __init__(self, is_decoder):
        nn.Module.__init__(self)
        self.self_attention = T5Attention(False)
        if is_decoder:
            self.cross_attention = T5Attention(True)
        self.wi, self.wo = Linear(D, FF), Linear(FF, D)
        self.is_decoder = is_decoder

    def forward(self, batch, q_len, src_len, past_key_value=None, use_cache=False):
        self_past = past_key_value[:2] if past_key_value else None
        cross_past = past_key_value[2:] if past_key_value else None
        h, present = self.self_attention(batch, q_len, q_len, self_past, use_cache)
        if self.is_decoder:
            h, cross_present = self.cross_attention(batch, q_len, src_len, cross_past, use_cache)
            present = present + cross_present if use_cache else None
        ff = self.wi(batch * q_len)
        h = self.wo(batch * q_len)
        del ff
        return h, present


class T5Stack(nn.Module):
    def __init__(self, is_decoder):
        nn.Module.__init__(self)
        for i in range(NL):
            setattr(self, "block_%d" % i, T5Block(is_decoder))

    def forward(self, batch, q_len, src_len, past_key_values=None, use_cache=False):
        presents = ()
        h = None
        for i in range(NL):
            past = past_key_values[i] if past_key_values is not None else None
            h, present = getattr(self, "block_%d" % i)(batch, q_len, src_len, past, use_cache)
            if use_cache:
                presents = presents + (present,)
        last_hidden_state = _t(batch * q_len * D * 4)
        return last_hidden_state, presents


class T5ForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.shared = nn.Parameter(_t(V * D * 4))
        self.encoder = T5Stack(False)
        self.decoder = T5Stack(True)
        # lm_head is tied to `shared` (tie_word_embeddings=True for t5-large)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, encoder_hidden_states, batch, src_len, past_key_values=None):
        h, presents = self.decoder(batch, 1, src_len, past_key_values, use_cache=True)
        logits = _t(batch * V * 4)
        return logits, presents

    def beam_search(self, encoder_hidden_states, batch_size, src_len, num_beams, max_length,
                    prefix_allowed_tokens_fn):
        batch_beam_size = batch_size * num_beams
        past_key_values = None
        sequences = _t(batch_beam_size * 8)
        for cur_len in range(1, max_length):
            logits, past_key_values = self(encoder_hidden_states, batch_beam_size, src_len, past_key_values)
            next_token_scores = _t(logits.nbytes)               # log_softmax(logits[:, -1, :], dim=-1)
            del logits
            mask = _t(next_token_scores.nbytes)                 # PrefixConstrainedLogitsProcessor: -inf mask
            next_token_scores = _t(next_token_scores.nbytes)    # + beam_scores[:, None]; then topk(2*num_beams)
            del mask
            sequences = _t(batch_beam_size * (cur_len + 1) * 8)
        return sequences

    def generate(self, input_ids=None, attention_mask=None, batch_size=64, src_len=32, max_length=12,
                 num_beams=1, num_return_sequences=1, prefix_allowed_tokens_fn=None):
        with torch.no_grad():
            encoder_last_hidden_state, _ = self.encoder(batch_size, src_len, src_len)
            # _expand_inputs_for_generation: repeat_interleave(num_beams) of the encoder output and mask
            expanded = _t(encoder_last_hidden_state.nbytes * num_beams)
            del encoder_last_hidden_state
            return self.beam_search(expanded, batch_size, src_len, num_beams, max_length,
                                    prefix_allowed_tokens_fn)


class DocidTrie(object):
    def allowed(self, batch_id, prefix):
        return list(range(10))


# ---- the evaluation
CKPT = "runs/dsi-t5-large-nq320k-semantic/checkpoint-best"
model = T5ForConditionalGeneration.from_pretrained(CKPT).cuda().eval()
trie = DocidTrie()
print("weights %.2f GiB" % (torch.cuda.memory_allocated() / GiB))

hits = {1: 0, 10: 0, 100: 0}
n_queries = 7830
batch_size = 64
try:
    for start in range(0, n_queries, batch_size):
        input_ids = _t(batch_size * 32 * 8)                 # padded to the longest query of the batch
        attention_mask = _t(batch_size * 32 * 8)
        out = model.generate(input_ids=input_ids, attention_mask=attention_mask, batch_size=batch_size,
                             src_len=32, max_length=12, num_beams=100, num_return_sequences=100,
                             prefix_allowed_tokens_fn=trie.allowed)
        print("queries %d-%d done" % (start, start + batch_size))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
