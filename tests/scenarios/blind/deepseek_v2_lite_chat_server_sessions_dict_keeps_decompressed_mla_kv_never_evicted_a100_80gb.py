"""An internal chat API for DeepSeek-V2-Lite-Chat on one A100 80GB that keeps every conversation's KV cache, forever.

app.py (FastAPI, one worker, transformers with trust_remote_code, bf16):

    model = AutoModelForCausalLM.from_pretrained("deepseek-ai/DeepSeek-V2-Lite-Chat", torch_dtype=torch.bfloat16,
                                                 trust_remote_code=True).cuda().eval()
    SESSIONS = {}                                   # session id -> ChatSession(history, past_key_values)

    @app.post("/chat/{sid}")
    def chat(sid, msg):
        s = SESSIONS.setdefault(sid, ChatSession())
        with torch.inference_mode():
            out = model.generate(new_input_ids(s, msg), past_key_values=s.past_key_values, max_new_tokens=1024,
                                 return_dict_in_generate=True)
        s.past_key_values = out.past_key_values     # "so the next turn does not re-prefill the whole chat"
        ...

Nothing ever removes a session: the team reasoned "MLA compresses the KV cache to 576 values per token per
layer, a few KB".  But the remote modeling code caches the *decompressed* keys and values: K [1, 16, L, 192] and
V [1, 16, L, 128] in bf16, 10 KiB per token per layer, x 27 layers = 270 KiB per token (the MLA latent would
be 31 KiB).  A turn (user message + reply) adds ~700 tokens, ~185 MiB, to its session.

Sizes: 15.7B parameters (26 MoE layers of 64 routed experts of ffn 1408 + 2 shared, MLA attention, vocab
102400) = 29.3 GiB bf16; 80 GiB card, 0.5 GiB CUDA context; ~50 GiB for caches and the passes.  Memory rises
with every turn and never comes back down.  After a morning of traffic (36 conversations, 219 turns) the kept
caches hold ~46 GiB; the torch.cat that grows one long conversation's key cache (10,453 tokens: 62.7 MiB per
layer) fails with 75.3 GiB allocated.  About 4 GiB more are cached in holes -- every cat makes a copy longer
than the block it frees -- which would buy another dozen turns at most; no single request is large.

What an expert says first: the sessions dict is an unbounded cache -- evict (LRU / idle TTL, a byte budget),
or move idle sessions' caches to the CPU, or keep only the text and re-prefill.  Wrong advice: empty_cache /
expandable_segments (everything is live), inference_mode (already on), smaller batch (batch 1), gradient
checkpointing / autocast / ZeRO (no training), a bigger GPU or quantizing the weights (only postpones the same
failure by a few dozen turns).
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "deepseek-ai/DeepSeek-V2-Lite-Chat"


class DeepseekV2Config(object):
    vocab_size = 102400
    hidden_size = 2048
    intermediate_size = 10944
    moe_intermediate_size = 1408
    num_hidden_layers = 27
    first_k_dense_replace = 1
    n_routed_experts = 64
    n_shared_experts = 2
    num_experts_per_tok = 6
    num_attention_heads = 16
    kv_lora_rank = 512
    qk_nope_head_dim = 128
    qk_rope_head_dim = 64
    v_head_dim = 128


class ModuleList(nn.Module):
    """nn.ModuleList (the stand-in torch has none): children under "0", "1", ..."""

    def __init__(self, modules=()):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


def bf16_weight(n):
    return nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def act(tokens, width, dtype=torch.bfloat16):
    return torch.empty(tokens * width, dtype=dtype, device="cuda")


class DynamicCache(object):
    """transformers' DynamicCache: per layer a key and a value tensor, concatenated along the sequence on every
    update (torch.cat makes the longer tensor, the shorter one is dropped)."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []
        self.seen_tokens = 0

    def update(self, key_states, value_states, layer_idx, new_tokens, k_width, v_width):
        if layer_idx == len(self.key_cache):
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            length = self.key_cache[layer_idx].nbytes // 2 // k_width + new_tokens
            self.key_cache[layer_idx] = act(length, k_width)           # torch.cat([old_k, key_states], dim=-2)
            self.value_cache[layer_idx] = act(length, v_width)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class DeepseekV2Attention(nn.Module):
    """MLA: the latent (kv_lora_rank 512 + rope 64) is decompressed by kv_b_proj into 16 heads of K (128 + 64)
    and V (128), and those are what go to the cache."""

    def __init__(self, cfg, layer_idx):
        nn.Module.__init__(self)
        self.cfg, self.layer_idx = cfg, layer_idx
        h, n = cfg.hidden_size, cfg.num_attention_heads
        self.q_head_dim = cfg.qk_nope_head_dim + cfg.qk_rope_head_dim
        self.q_proj = bf16_weight(h * n * self.q_head_dim)
        self.kv_a_proj_with_mqa = bf16_weight(h * (cfg.kv_lora_rank + cfg.qk_rope_head_dim))
        self.kv_a_layernorm = bf16_weight(cfg.kv_lora_rank)
        self.kv_b_proj = bf16_weight(cfg.kv_lora_rank * n * (cfg.qk_nope_head_dim + cfg.v_head_dim))
        self.o_proj = bf16_weight(n * cfg.v_head_dim * h)

    def forward(self, hidden_states, past_key_value, new_tokens):
        cfg, n = self.cfg, self.cfg.num_attention_heads
        k_width, v_width = n * self.q_head_dim, n * cfg.v_head_dim
        q = act(new_tokens, n * self.q_head_dim)
        key_states = act(new_tokens, k_width)             # kv_b_proj(latent) + rope, per head
        value_states = act(new_tokens, v_width)
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, new_tokens,
                                                         k_width, v_width)
        attn_output = act(new_tokens, n * cfg.v_head_dim)
        del q
        return act(new_tokens, cfg.hidden_size)


class DeepseekV2MoE(nn.Module):
    """64 routed experts (stored stacked per layer) + 2 shared experts."""

    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.cfg = cfg
        e, h, f = cfg.n_routed_experts, cfg.hidden_size, cfg.moe_intermediate_size
        self.gate = bf16_weight(e * h)
        self.experts_gate_up = bf16_weight(e * 2 * f * h)
        self.experts_down = bf16_weight(e * f * h)
        self.shared_experts_gate_up = bf16_weight(2 * cfg.n_shared_experts * f * h)
        self.shared_experts_down = bf16_weight(cfg.n_shared_experts * f * h)

    def forward(self, hidden_states, new_tokens):
        cfg = self.cfg
        routed = act(new_tokens * cfg.num_experts_per_tok, 2 * cfg.moe_intermediate_size)
        del routed
        return act(new_tokens, cfg.hidden_size)


class DeepseekV2MLP(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.cfg = cfg
        self.gate_up = bf16_weight(2 * cfg.intermediate_size * cfg.hidden_size)
        self.down = bf16_weight(cfg.intermediate_size * cfg.hidden_size)

    def forward(self, hidden_states, new_tokens):
        inter = act(new_tokens, 2 * self.cfg.intermediate_size)
        del inter
        return act(new_tokens, self.cfg.hidden_size)


class DeepseekV2DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_idx):
        nn.Module.__init__(self)
        self.input_layernorm = bf16_weight(cfg.hidden_size)
        self.self_attn = DeepseekV2Attention(cfg, layer_idx)
        self.post_attention_layernorm = bf16_weight(cfg.hidden_size)
        self.mlp = DeepseekV2MoE(cfg) if layer_idx >= cfg.first_k_dense_replace else DeepseekV2MLP(cfg)

    def forward(self, hidden_states, past_key_value, new_tokens):
        h = self.self_attn(hidden_states, past_key_value, new_tokens)
        return self.mlp(h, new_tokens)


class DeepseekV2ForCausalLM(nn.Module):
    def __init__(self, cfg):
        nn.Module.__init__(self)
        self.config = cfg
        self.embed_tokens = bf16_weight(cfg.vocab_size * cfg.hidden_size)
        self.layers = ModuleList(DeepseekV2DecoderLayer(cfg, i) for i in range(cfg.num_hidden_layers))
        self.norm = bf16_weight(cfg.hidden_size)
        self.lm_head = bf16_weight(cfg.hidden_size * cfg.vocab_size)

    @classmethod
    def from_pretrained(cls, model_id, torch_dtype=None, trust_remote_code=True):
        return cls(DeepseekV2Config())

    def forward(self, new_tokens, past_key_values):
        h = act(new_tokens, self.config.hidden_size)
        for layer in self.layers:
            h = layer(h, past_key_values, new_tokens)
        # the remote code's forward: logits = self.lm_head(hidden_states).float(), every position
        return act(new_tokens, self.config.vocab_size, torch.float32)

    def generate(self, input_len, past_key_values=None, max_new_tokens=1024, reply_len=None):
        """Prefill the new message, then decode.  Each decode step appends one position to every layer's
        cache; the stand-in appends the reply's positions at once, which ends at the same cache."""
        past_key_values = past_key_values if past_key_values is not None else DynamicCache()
        logits = self(input_len, past_key_values)
        del logits
        reply = min(reply_len or max_new_tokens, max_new_tokens)
        logits = self(reply, past_key_values)
        del logits
        return GenerateOutput(past_key_values, reply)


class GenerateOutput(object):
    def __init__(self, past_key_values, new_tokens):
        self.past_key_values = past_key_values
        self.new_tokens = new_tokens


class ChatSession(object):
    def __init__(self, sid):
        self.sid = sid
        self.history = []
        self.past_key_values = None


SESSIONS = {}
model = None


def chat(sid, user_tokens, reply_tokens):
    s = SESSIONS.get(sid)
    if s is None:
        s = SESSIONS[sid] = ChatSession(sid)
    with torch.inference_mode():
        out = model.generate(user_tokens, past_key_values=s.past_key_values, max_new_tokens=1024,
                             reply_len=reply_tokens)
    s.past_key_values = out.past_key_values
    s.history.append((user_tokens, out.new_tokens))
    return out.new_tokens


def todays_traffic(rng):
    """The day's requests as the access log has them: conversations start through the morning and go on for a
    few turns each, interleaved."""
    open_sessions = []
    n = 0
    while True:
        if not open_sessions or rng.random() < 0.18:
            n += 1
            open_sessions.append(["s-%04d" % n, rng.randint(3, 14)])
        s = rng.choice(open_sessions)
        yield s[0], rng.randint(40, 700), rng.randint(120, 800)
        s[1] -= 1
        if s[1] == 0:
            open_sessions.remove(s)


def main():
    global model
    model = DeepseekV2ForCausalLM.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16, trust_remote_code=True)
    model.eval()
    for sid, user_tokens, reply_tokens in todays_traffic(random.Random(11)):
        chat(sid, user_tokens, reply_tokens)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
