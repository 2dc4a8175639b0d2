"""Contract summarizer with Phi-3-mini-128k (trust_remote_code, no flash-attn installed -> eager attention) in a
pod on a time-sliced L40S shared with two other pods: short contracts work, a 16k-token master services agreement
needs a 16 GiB attention-score tensor per layer, twice, then a 32 GiB fp32 softmax.  The other pods' 9 GiB are a
red herring: stopping them would not make room for this attention layer.

The real code (summarize_contracts.py, a nightly CronJob requesting a time-sliced nvidia.com/gpu):

    tok = AutoTokenizer.from_pretrained("microsoft/Phi-3-mini-128k-instruct")
    model = AutoModelForCausalLM.from_pretrained("microsoft/Phi-3-mini-128k-instruct", torch_dtype=torch.bfloat16,
                                                 trust_remote_code=True).cuda().eval()
    # log: "`flash-attention` package not found, consider installing for better performance" -> eager attention
    for path in sorted(glob("/contracts/inbox/*.txt")):
        ids = tok.apply_chat_template([{"role": "user", "content": PROMPT + open(path).read()}],
                                      return_tensors="pt").cuda()            # no truncation: the model is 128k
        with torch.inference_mode():
            out = model.generate(ids, max_new_tokens=600, do_sample=False)

Eager attention in the model's remote code, per layer of the prefill:
    attn_weights = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(head_dim)       # 32 x L x L bf16
    attn_weights = attn_weights + causal_mask                                      # another 32 x L x L bf16
    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(v.dtype)   # fp32

The arithmetic (L40S, 46068 MiB; the card is time-sliced: no memory isolation between pods):
  other pods: a Triton server 3.5 GiB and another team's notebook 5.5 GiB   9.0 GiB
  this pod: context 0.5 GiB + Phi-3-mini 3.82B bf16 weights 7.1 GiB         7.6 GiB
  contract of 3,100 tokens: scores 32 x 3100^2 x 2 B = 0.57 GiB -- fine; 6,200 tokens: 2.3 GiB (4.6 GiB for the
  fp32 softmax) -- fine, and the caching allocator keeps ~13 GiB of those blocks
  master services agreement, 16,384 tokens, layer 0 of the prefill:
      q @ k^T  32 x 16384^2 x 2 B = 16.0 GiB  -> fits once the allocator gives its cache back
      + mask   another 16.0 GiB               -> fails: 11.2 GiB free, 23.8 GiB allocated (weights + the scores)
      (softmax in fp32 would then need 32 GiB more)
  Without the other pods there would be 20.2 GiB free at the mask add, and the fp32 softmax after it (32 GiB)
  fails regardless: the layer needs ~64 GiB of transient scores, more than the whole card minus the model.

What an expert says first: the prompt's O(L^2) eager attention does not fit on this card at 16k tokens, whoever
else is on it.  Use a fused attention (attn_implementation="sdpa", or install flash-attn so the remote code
uses it: O(L) memory), or cap/chunk the input (truncate, map-reduce summary over sections).
Wrong advice: stopping the other pods first (9 GiB < the ~64 GiB needed), empty_cache / expandable_segments
(a single 16 GiB block), smaller batch (the batch is one prompt), inference mode (on), gradient checkpointing,
quantizing the weights (saves 5 GiB of 7; the scores are the problem).
"""
import os

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "microsoft/Phi-3-mini-128k-instruct"
HIDDEN, INTERMEDIATE, N_LAYERS, N_HEADS, HEAD_DIM, VOCAB = 3072, 8192, 32, 32, 96, 32064
MAX_NEW_TOKENS = 600
INBOX = "/contracts/inbox"
# the night's inbox: (file, tokens after the chat template)
INBOX_TODAY = [("acme_nda_2024.txt", 3100), ("supplier_terms_v7.txt", 6200), ("globex_msa_2019_full.txt", 16384)]


def _bf16(n_elems):
    return torch.empty(n_elems, dtype=torch.bfloat16, device="cuda")


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        nn.Module.__init__(self)
        self.d_in, self.d_out = d_in, d_out
        self.weight = nn.Parameter(torch.empty(d_in * d_out, dtype=torch.bfloat16, device="cuda"))

    def forward(self, x):
        w = self.weight
        return _bf16(x.nbytes // 2 // self.d_in * self.d_out)


class Phi3RMSNorm(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16, device="cuda"))

    def forward(self, x):
        w = self.weight
        return _bf16(x.nbytes // 2)


class Phi3Attention(nn.Module):
    """The remote code's eager path (flash_attn not importable)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.qkv_proj = Linear(HIDDEN, 3 * N_HEADS * HEAD_DIM)
        self.o_proj = Linear(N_HEADS * HEAD_DIM, HIDDEN)

    def forward(self, hidden_states, past_key_value, causal_mask):
        q_len = hidden_states.nbytes // 2 // HIDDEN
        qkv = self.qkv_proj(hidden_states)
        k_new = _bf16(q_len * N_HEADS * HEAD_DIM)
        v_new = _bf16(q_len * N_HEADS * HEAD_DIM)
        past_key_value.append((k_new, v_new))
        kv_len = sum(k.nbytes for k, _ in past_key_value) // 2 // (N_HEADS * HEAD_DIM)
        attn_weights = _bf16(N_HEADS * q_len * kv_len)                       # q @ k^T / sqrt(d)
        attn_weights = _bf16(N_HEADS * q_len * kv_len) if causal_mask else attn_weights   # + causal_mask
        probs = torch.empty(N_HEADS * q_len * kv_len * 4, device="cuda")    # softmax(dtype=torch.float32)
        del attn_weights
        attn_weights = _bf16(N_HEADS * q_len * kv_len)                       # .to(value_states.dtype)
        del probs
        attn_output = _bf16(q_len * N_HEADS * HEAD_DIM)
        del attn_weights, qkv
        return self.o_proj(attn_output)


class Phi3MLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_up_proj = Linear(HIDDEN, 2 * INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        up_states = self.gate_up_proj(x)
        act = _bf16(up_states.nbytes // 4)
        del up_states
        return self.down_proj(act)


class Phi3DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = Phi3RMSNorm()
        self.self_attn = Phi3Attention()
        self.post_attention_layernorm = Phi3RMSNorm()
        self.mlp = Phi3MLP()

    def forward(self, hidden_states, past_key_value, causal_mask):
        h = self.self_attn(self.input_layernorm(hidden_states), past_key_value, causal_mask)
        hidden_states = _bf16(h.nbytes // 2)
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        return _bf16(h.nbytes // 2)


class ModuleList(nn.Module):
    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class Phi3Model(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = ModuleList([Phi3DecoderLayer() for _ in range(N_LAYERS)])
        self.norm = Phi3RMSNorm()

    def forward(self, input_ids, past_key_values):
        q_len = input_ids.nbytes // 8
        emb = self.embed_tokens
        hidden_states = _bf16(q_len * HIDDEN)
        causal_mask = q_len > 1
        for layer, past in zip(self.layers, past_key_values):
            hidden_states = layer(hidden_states, past, causal_mask)
        return self.norm(hidden_states)


class Phi3ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = Phi3Model()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, past_key_values):
        hidden = self.model(input_ids, past_key_values)
        last = _bf16(HIDDEN)                              # logits of the last position only
        return self.lm_head(last)

    def generate(self, input_ids, max_new_tokens=20, do_sample=False):
        past_key_values = [[] for _ in range(N_LAYERS)]   # DynamicCache: per layer
        logits = self(input_ids, past_key_values)         # the prefill: every prompt token at once
        tokens = []
        for step in range(max_new_tokens):
            # a decode step: one token through the 32 layers; its keys and values join the cache
            # (a few hundred KiB a token: negligible next to the prefill's attention scores)
            next_id = torch.empty(8, device="cuda")
            past_key_values[-1].append((_bf16(N_LAYERS * N_HEADS * HEAD_DIM), _bf16(N_LAYERS * N_HEADS * HEAD_DIM)))
            tokens.append(next_id)
        return tokens


class Tokenizer(object):
    def apply_chat_template(self, n_tokens):
        return torch.empty(n_tokens * 8, device="cuda")  # int64 ids, moved with .cuda()


def summarize(model, tok, path, n_tokens):
    ids = tok.apply_chat_template(n_tokens)
    with torch.inference_mode():
        out = model.generate(ids, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
    return len(out)


def main():
    print("loading %s (trust_remote_code=True)" % MODEL_ID, flush=True)
    print("`flash-attention` package not found, consider installing for better performance: "
          "No module named 'flash_attn'.", flush=True)
    model = Phi3ForCausalLM().eval()
    tok = Tokenizer()
    for name, n_tokens in INBOX_TODAY:
        path = os.path.join(INBOX, name)
        n = summarize(model, tok, path, n_tokens)
        print("%s: %d prompt tokens, %d summary tokens" % (name, n_tokens, n), flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
