"""An offline RAG answering job (a research group's "parallel context encoding" experiment): for each question
of their eval set, retrieve k=32 passages, lay them side by side with a block-diagonal attention mask (each
passage attends causally to itself only, the question and the answer attend to everything) and answer with
Llama-3.1-8B-Instruct in bf16 on one A100-SXM4-40GB (39.59 GiB usable).  The real code:

    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16,
                                                 attn_implementation="eager").cuda().eval()
    # "sdpa ignores our custom 4D mask" (an old transformers issue they hit once), so eager it is
    for q in questions:
        passages = retriever.search(q, k=32)
        input_ids, position_ids, mask4d = build_parallel_context_inputs(tok, passages, q)   # (1, 1, L, L)
        with torch.no_grad():
            out = model.generate(input_ids, attention_mask=mask4d, position_ids=position_ids, max_new_tokens=128)

Eager attention (transformers' eager_attention_forward) materializes per layer
    attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling      # (1, 32, L, L) bf16
    attn_weights = attn_weights + causal_mask
    attn_weights = softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)
Passages are ~120-170-token FAQ chunks for most questions (L ~ 5k: 1.5 GiB per score tensor, it fits), but this
question retrieves 32 long statute sections (~500 tokens each): L = 16,384.  Then one score tensor is
32 x 16384 x 16384 x 2 B = 16 GiB; the matmul's result fits in the ~22 GiB left beside the weights
(8.03 B x 2 B = 14.96 GiB), the masks (fp32 1 GiB built by the script + bf16 0.5 GiB made by the model) and
the projections, but the `* scaling` copy, another 16 GiB, does not.  OOM at layer 0 of the prefill.

What an expert says first: never materialize L x L attention at 16k: use a fused kernel that takes the
block structure -- flash-attention's varlen API with one cu_seqlens segment per passage (it is exactly
block-diagonal), FlexAttention with a block mask, or SDPA's memory-efficient kernel with the mask (O(L)
memory for the scores).  Alternatively split the attention by query blocks.  Fewer/shorter passages would
also fit but changes the experiment.  Wrong advice: a smaller batch (it is 1), gradient checkpointing or
mixed precision (inference, already bf16), inference_mode (no_grad is on), empty_cache or expandable_segments
(one tensor needs 16 GiB more than is free), quantizing the weights (saves ~10 GiB; the next copy is 16 GiB and
the fp32 softmax 32 GiB), ZeRO/FSDP.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16
F32 = torch.float32

# meta-llama/Llama-3.1-8B-Instruct
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
VOCAB = 128256
TOP_K_PASSAGES = 32


def repeat_kv(hidden_states, n_rep, seq_len):
    """(1, kv_heads, L, d) -> (1, kv_heads * n_rep, L, d): expand + reshape, a copy."""
    return torch.empty(NUM_KV_HEADS * n_rep * seq_len * HEAD_DIM, dtype=BF16)


def eager_attention_forward(module, query, key, value, attention_mask, seq_len, scaling):
    key_states = repeat_kv(key, module.num_key_value_groups, seq_len)
    value_states = repeat_kv(value, module.num_key_value_groups, seq_len)
    scores = torch.empty(NUM_HEADS * seq_len * seq_len, dtype=BF16)       # torch.matmul(query, key_states.T)
    attn_weights = torch.empty(NUM_HEADS * seq_len * seq_len, dtype=BF16)  # ... * scaling
    del scores
    masked = torch.empty(NUM_HEADS * seq_len * seq_len, dtype=BF16)       # attn_weights + causal_mask
    attn_weights = masked
    probs = torch.empty(NUM_HEADS * seq_len * seq_len, dtype=F32)         # softmax(..., dtype=torch.float32)
    attn_weights = torch.empty(NUM_HEADS * seq_len * seq_len, dtype=BF16)  # .to(query.dtype)
    del probs, masked
    attn_output = torch.empty(NUM_HEADS * seq_len * HEAD_DIM, dtype=BF16)  # torch.matmul(attn_weights, value)
    del attn_weights
    return attn_output


class LlamaAttention(nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.num_key_value_groups = NUM_HEADS // NUM_KV_HEADS
        self.scaling = HEAD_DIM ** -0.5
        self.q_proj = nn.Parameter(torch.empty(HIDDEN * NUM_HEADS * HEAD_DIM, dtype=BF16))
        self.k_proj = nn.Parameter(torch.empty(HIDDEN * NUM_KV_HEADS * HEAD_DIM, dtype=BF16))
        self.v_proj = nn.Parameter(torch.empty(HIDDEN * NUM_KV_HEADS * HEAD_DIM, dtype=BF16))
        self.o_proj = nn.Parameter(torch.empty(NUM_HEADS * HEAD_DIM * HIDDEN, dtype=BF16))

    def forward(self, hidden_states, seq_len, attention_mask, past_key_values):
        query = torch.empty(seq_len * NUM_HEADS * HEAD_DIM, dtype=BF16)
        key = torch.empty(seq_len * NUM_KV_HEADS * HEAD_DIM, dtype=BF16)
        value = torch.empty(seq_len * NUM_KV_HEADS * HEAD_DIM, dtype=BF16)
        past_key_values.update(key, value, self.layer_idx)
        attn_output = eager_attention_forward(self, query, key, value, attention_mask, seq_len, self.scaling)
        return torch.empty(seq_len * HIDDEN, dtype=BF16)                  # o_proj


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = nn.Parameter(torch.empty(HIDDEN * INTERMEDIATE, dtype=BF16))
        self.up_proj = nn.Parameter(torch.empty(HIDDEN * INTERMEDIATE, dtype=BF16))
        self.down_proj = nn.Parameter(torch.empty(INTERMEDIATE * HIDDEN, dtype=BF16))

    def forward(self, x, seq_len):
        gate = torch.empty(seq_len * INTERMEDIATE, dtype=BF16)
        up = torch.empty(seq_len * INTERMEDIATE, dtype=BF16)
        h = torch.empty(seq_len * INTERMEDIATE, dtype=BF16)
        del gate, up
        return torch.empty(seq_len * HIDDEN, dtype=BF16)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(layer_idx)
        self.mlp = LlamaMLP()
        self.input_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))
        self.post_attention_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))

    def forward(self, hidden_states, seq_len, attention_mask, past_key_values):
        h = self.self_attn(hidden_states, seq_len, attention_mask, past_key_values)
        return self.mlp(h, seq_len)


class DynamicCache(object):
    """transformers.DynamicCache: per layer the keys and values seen so far (torch.cat as it grows)."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, key, value, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key)
            self.value_cache.append(value)
        else:
            n = self.key_cache[layer_idx].nbytes + key.nbytes
            self.key_cache[layer_idx] = torch.empty(n)
            self.value_cache[layer_idx] = torch.empty(n)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16))
        self.layers = nn.Module()
        for i in range(NUM_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer(i))
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))
        self.lm_head = nn.Parameter(torch.empty(HIDDEN * VOCAB, dtype=BF16))

    def forward(self, seq_len, attention_mask, past_key_values):
        # a custom 4D mask is inverted into the model dtype: 0 where attended, finfo.min elsewhere
        causal_mask = torch.empty(seq_len * seq_len, dtype=BF16) if seq_len > 1 else None
        hidden_states = torch.empty(seq_len * HIDDEN, dtype=BF16)
        for i in range(NUM_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states, seq_len, causal_mask, past_key_values)
        return torch.empty(VOCAB * 4)            # logits of the last position, float32

    def generate(self, input_ids, attention_mask, position_ids, max_new_tokens):
        past_key_values = DynamicCache()
        seq_len = input_ids.num_tokens
        logits = self(seq_len, attention_mask, past_key_values)                    # prefill
        tokens = []
        for _ in range(max_new_tokens):
            logits = self(1, None, past_key_values)                                # decode
            tokens.append(0)
        return tokens


class TokenIds(object):
    """The tokenized prompt (on the GPU as input_ids; sizes only here)."""

    def __init__(self, num_tokens):
        self.num_tokens = num_tokens
        self.ids = torch.empty(num_tokens * 8)                    # int64


def build_parallel_context_inputs(passage_lengths, question_tokens):
    """Passages side by side: positions restart at each passage; a block-diagonal causal mask over the
    passages, the question rows attend to every passage.  Built in float32 (1 = attend), as in the paper's code."""
    seq_len = sum(passage_lengths) + question_tokens
    input_ids = TokenIds(seq_len)
    position_ids = torch.empty(seq_len * 8)
    mask4d = torch.empty(seq_len * seq_len, dtype=F32)           # (1, 1, L, L)
    return input_ids, position_ids, mask4d


def retrieve(question_id):
    """The retriever's top-32 passages for the question, by their token counts (the index is on the CPU)."""
    if question_id == "statutes-0412":
        return [500 + (i * 7) % 13 - 6 for i in range(TOP_K_PASSAGES)]         # 32 long statute sections
    return [120 + (i * 37 + len(question_id) * 11) % 50 for i in range(TOP_K_PASSAGES)]


def main():
    model = LlamaForCausalLM()
    model.eval()
    questions = ["contracts-0007", "contracts-0019", "tax-0102", "statutes-0412", "statutes-0413"]
    answers = {}
    for qid in questions:
        passages = retrieve(qid)
        input_ids, position_ids, mask4d = build_parallel_context_inputs(passages, 384 - sum(passages) % 16)
        with torch.no_grad():
            answers[qid] = model.generate(input_ids, attention_mask=mask4d, position_ids=position_ids,
                                          max_new_tokens=32)
        del input_ids, position_ids, mask4d
    return answers


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
