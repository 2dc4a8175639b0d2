"""rerank_service.py -- the reranking stage of a multi-tenant RAG platform: one L40S (48 GB), one
process, BAAI/bge-reranker-v2-gemma (a Gemma-2B with its language-model head: the relevance score
is the logit of the token "Yes" after the prompt).  Retrieval returns the top 50 chunks for a query
and the service scores the 50 (query, chunk) pairs in one call.  The scoring code is the model card's
"using Huggingface transformers" snippet, wrapped in an endpoint:

    model = AutoModelForCausalLM.from_pretrained("BAAI/bge-reranker-v2-gemma").to("cuda").eval()
    yes_loc = tokenizer("Yes", add_special_tokens=False)["input_ids"][0]

    def rerank(query, passages):
        with torch.no_grad():
            inputs = get_inputs([[query, p] for p in passages], tokenizer, max_length=1024)
            scores = model(**inputs, return_dict=True).logits[:, -1, yes_loc].view(-1, ).float()

The snippet asks the causal LM for its logits at EVERY position over the WHOLE 256,000-token vocabulary
and then keeps one number per pair.  The model also loads in float32 (no torch_dtype: 9.3 GiB), so the
logits are float32 too: 50 pairs x L tokens x 256,000 x 4 B.  With the platform's 256-token chunks
(L about 340 after the prompt template) that is 16 GiB, allocated and dropped on every query: the
card has room, and p95 latency was the only symptom.  A new tenant uploaded product manuals chunked
at ~1,000 tokens: get_inputs truncates to max_length=1024 and pads to the longest, so L = 1024 and
the lm_head output is 50 x 1024 x 256,000 x 4 B = 48.8 GiB.  The tenant's first query fails in
lm_head (Tried to allocate 48.83 GiB) with 9.7 GiB allocated (the weights, the final hidden states)
and 15.6 GiB cached from the layers' transients: the request alone is larger than the card.

An expert: the job needs one logit per pair (the last position, the "Yes" row), not 50 x 1024 x
256,000: compute the base model's last hidden state and project only that position, only that row
(`model.model(**inputs).last_hidden_state[:, -1] @ model.lm_head.weight[yes_loc]`, or
`num_logits_to_keep=1` / `logits_to_keep=1` on transformers that have it).  That is 48.8 GiB -> 50
floats.  Then load in bf16 (the FlagEmbedding path uses fp16: 4.7 GiB of weights), and bucket
candidates by length.  Loading in bf16 alone would halve the logits to 24.4 GiB and let this query
through -- 29 GiB allocated to produce 50 numbers -- until top-100 or longer chunks break it again.
Wrong first advice: a bigger GPU (an 80 GB card for a job that needs 50 floats), quantization (the
weights are not what fails), expandable_segments / empty_cache (one request larger than the card),
inference_mode (it already runs under no_grad), flash attention (attention is not what fails),
gradient checkpointing (no training).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

f32 = torch.float32
VOCAB, HIDDEN, INTER, LAYERS, HEAD_DIM = 256_000, 2048, 16_384, 18, 256


# ----------------------------------------------------------------------------------------------
# transformers' GemmaForCausalLM, as far as memory goes (the stand-in computes no values; every tensor
# is the size PyTorch's would be).  Loaded without torch_dtype: float32, as from_pretrained defaults.
class GemmaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(torch.empty(HIDDEN * 8 * HEAD_DIM, dtype=f32, device="cuda"))
        self.k_proj = torch.nn.Parameter(torch.empty(HIDDEN * HEAD_DIM, dtype=f32, device="cuda"))
        self.v_proj = torch.nn.Parameter(torch.empty(HIDDEN * HEAD_DIM, dtype=f32, device="cuda"))
        self.o_proj = torch.nn.Parameter(torch.empty(8 * HEAD_DIM * HIDDEN, dtype=f32, device="cuda"))
        self.gate_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=f32, device="cuda"))
        self.up_proj = torch.nn.Parameter(torch.empty(HIDDEN * INTER, dtype=f32, device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(INTER * HIDDEN, dtype=f32, device="cuda"))

    def forward(self, hidden, n):
        normed = torch.empty(n * HIDDEN, dtype=f32, device="cuda")           # input_layernorm
        q = torch.empty(n * 8 * HEAD_DIM, dtype=f32, device="cuda")
        k = torch.empty(n * HEAD_DIM, dtype=f32, device="cuda")
        v = torch.empty(n * HEAD_DIM, dtype=f32, device="cuda")
        attn = torch.empty(n * 8 * HEAD_DIM, dtype=f32, device="cuda")       # sdpa
        del q, k, v, normed
        hidden = torch.empty(n * HIDDEN, dtype=f32, device="cuda")           # o_proj + residual
        del attn
        normed = torch.empty(n * HIDDEN, dtype=f32, device="cuda")           # post_attention_layernorm
        gate = torch.empty(n * INTER, dtype=f32, device="cuda")
        up = torch.empty(n * INTER, dtype=f32, device="cuda")
        act = torch.empty(n * INTER, dtype=f32, device="cuda")               # gelu(gate) * up
        del gate, up, normed
        out = torch.empty(n * HIDDEN, dtype=f32, device="cuda")              # down_proj + residual
        del act
        return out


class GemmaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=f32, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, GemmaDecoderLayer())

    def forward(self, input_ids, attention_mask):
        n = input_ids["batch"] * input_ids["length"]
        hidden = torch.empty(n * HIDDEN, dtype=f32, device="cuda")           # embed * sqrt(hidden)
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, n)
        return torch.empty(n * HIDDEN, dtype=f32, device="cuda")             # final norm


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class GemmaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = GemmaModel()                                            # lm_head is tied to embed_tokens

    def forward(self, input_ids=None, attention_mask=None, return_dict=True):
        hidden_states = self.model(input_ids, attention_mask)
        n = input_ids["batch"] * input_ids["length"]
        logits = torch.empty(n * VOCAB, dtype=f32, device="cuda")            # self.lm_head(hidden_states).float()
        return CausalLMOutputWithPast(logits)


class Scores(object):
    """logits[:, -1, yes_loc].view(-1, ).float(): one number per pair (a new small tensor)."""

    def __init__(self, logits, batch):
        self.t = torch.empty(batch, dtype=f32, device="cuda")


def _tokenize(pairs, max_length):
    """The model card's get_inputs: prompt template + query + passage, truncated to max_length,
    padded to the longest pair (tokenizer.pad(..., padding=True))."""
    longest = min(max_length, max(48 + q + p for q, p in pairs))
    return {"batch": len(pairs), "length": longest}


# ----------------------------------------------------------------------------------------------
# rerank_service.py
model = GemmaForCausalLM().to("cuda").eval()
yes_loc = 3553


def get_inputs(pairs, max_length=1024):
    return _tokenize(pairs, max_length)


def rerank(query_tokens, passage_tokens):
    with torch.no_grad():
        inputs = get_inputs([(query_tokens, p) for p in passage_tokens], max_length=1024)
        out = model(input_ids=inputs, attention_mask=None, return_dict=True)
        scores = Scores(out.logits, inputs["batch"])
    return scores


def query_stream():
    # existing tenants: 256-token chunks (the platform's default chunker), 50 candidates per query
    for i in range(6):
        yield "acme-support", 18 + i, [230 + (7 * j + 3 * i) % 40 for j in range(50)]
    # the new tenant's manuals, chunked at ~1,000 tokens by their own pipeline
    yield "nordhaus-manuals", 22, [960 + (13 * j) % 70 for j in range(50)]


try:
    for tenant, q, passages in query_stream():
        s = rerank(q, passages)
        print("%-18s 50 candidates reranked; peak %.1f GiB" % (tenant, torch.cuda.max_memory_allocated() / 2.0 ** 30))
        del s
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
