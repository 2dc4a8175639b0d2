"""An internal "ask the handbook" RAG chat: a FastAPI app serving Llama-3.1-8B-Instruct (bf16, transformers) on
one NVIDIA L4 (24 GB, 22.49 GiB usable), one request at a time behind a lock.  Each question gets ~6k tokens of
retrieved handbook passages.  The app decodes by hand so it can stream, with a StaticCache per request
(max_cache_len = prompt + max_new_tokens, so the decode step can be compiled later):

    @app.post("/chat")
    async def chat(req: ChatRequest):
        return StreamingResponse(engine.stream(req), media_type="text/event-stream")

    class ChatEngine:
        def stream(self, req):
            state = self.start(req)                  # prefill; self.active[req.id] = state
            for _ in range(req.max_new_tokens):
                token = self.decode_one(state)
                yield self.tokenizer.decode([token])
                if token == EOS: break
            self.finish(req.id)                      # del self.active[req.id]

When the browser tab closes or the user presses "Stop generating" (they do, often, then rephrase), Starlette
closes the generator: GeneratorExit is raised at the `yield` and the line after the loop never runs.  No
try/finally.  The request's state -- its StaticCache -- stays in self.active for good.

Sizes: weights 8.03 B x 2 B = 14.96 GiB; context ~0.5 GiB; ~7 GiB left.  KV per token: 32 layers x 8 KV heads
x 128 x 2 (K, V) x 2 B = 128 KiB, so a 6k-token prompt + 1024 new tokens is a ~0.86 GiB StaticCache
(64 tensors of ~13.7 MiB).  Completed requests give theirs back; every stopped one keeps its ~0.86 GiB.  After
seven stopped streams in the morning, the next question's prefill cannot get its MLP activations / cache
tensors: OOM.  memory_allocated climbs by ~0.86 GiB per stopped request and never comes back.

What an expert says first: a leak across requests, not a size problem -- put the cleanup in a finally (or
handle the disconnect: `except GeneratorExit`/`asyncio.CancelledError`), so self.active drops the state of a
stream that ends any way; as a guard, evict entries of requests whose clients are gone (a bounded dict, a TTL).
Wrong advice: a smaller batch (it is 1), quantization or a bigger GPU (they only delay the crash by a few
stopped streams), shorter contexts, flash-attention, expandable_segments or empty_cache (the memory is live,
held by the dict), inference_mode (already on), training knobs (checkpointing, mixed precision, ZeRO).
"""
import random

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

BF16 = torch.bfloat16

# meta-llama/Llama-3.1-8B-Instruct (config.json)
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
NUM_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
VOCAB = 128256
EOS = 128009

MAX_NEW_TOKENS = 1024


# --- transformers, as far as memory goes (sizes only: the stand-in torch has no shapes) -----------------
class StaticCache(object):
    """transformers.StaticCache(config, max_batch_size, max_cache_len, device, dtype): per layer a key and a
    value tensor of (batch, kv_heads, max_cache_len, head_dim), made up front."""

    def __init__(self, max_batch_size, max_cache_len, device="cuda", dtype=BF16):
        self.max_cache_len = max_cache_len
        n = max_batch_size * NUM_KV_HEADS * max_cache_len * HEAD_DIM
        self.key_cache, self.value_cache = [], []
        for _ in range(NUM_LAYERS):
            self.key_cache.append(torch.empty(n, dtype=dtype, device=device))
            self.value_cache.append(torch.empty(n, dtype=dtype, device=device))


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=BF16))

    def forward(self, x, num_tokens):
        return torch.empty(num_tokens * self.out_features, dtype=BF16)


class LlamaAttention(nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.q_proj = Linear(HIDDEN, NUM_HEADS * HEAD_DIM)
        self.k_proj = Linear(HIDDEN, NUM_KV_HEADS * HEAD_DIM)
        self.v_proj = Linear(HIDDEN, NUM_KV_HEADS * HEAD_DIM)
        self.o_proj = Linear(NUM_HEADS * HEAD_DIM, HIDDEN)

    def forward(self, hidden_states, num_tokens, past_key_values):
        q = self.q_proj(hidden_states, num_tokens)
        k = self.k_proj(hidden_states, num_tokens)
        v = self.v_proj(hidden_states, num_tokens)
        # past_key_values.update(k, v, layer_idx): copied into the static tensors in place; sdpa over them
        out = torch.empty(num_tokens * NUM_HEADS * HEAD_DIM, dtype=BF16)
        del q, k, v
        return self.o_proj(out, num_tokens)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x, num_tokens):
        gate = self.gate_proj(x, num_tokens)
        up = self.up_proj(x, num_tokens)
        h = torch.empty(num_tokens * INTERMEDIATE, dtype=BF16)       # act_fn(gate) * up
        del gate, up
        return self.down_proj(h, num_tokens)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.self_attn = LlamaAttention(layer_idx)
        self.mlp = LlamaMLP()
        self.input_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))
        self.post_attention_layernorm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))

    def forward(self, hidden_states, num_tokens, past_key_values):
        h = self.self_attn(hidden_states, num_tokens, past_key_values)
        return self.mlp(h, num_tokens)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16))
        self.layers = nn.Module()
        for i in range(NUM_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer(i))
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=BF16))
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, num_tokens, past_key_values):
        hidden_states = torch.empty(num_tokens * HIDDEN, dtype=BF16)
        for i in range(NUM_LAYERS):
            hidden_states = getattr(self.layers, str(i))(hidden_states, num_tokens, past_key_values)
        return self.lm_head(hidden_states, 1)      # logits_to_keep=1: the last position only


# --- the app (handbook_chat/engine.py) ------------------------------------------------------------------
class ChatRequest(object):
    def __init__(self, request_id, prompt_tokens, answer_tokens):
        self.id, self.prompt_tokens, self.max_new_tokens = request_id, prompt_tokens, MAX_NEW_TOKENS
        self.answer_tokens = answer_tokens     # replay: when the logged answer hit EOS (the stand-in samples nothing)


class RequestState(object):
    def __init__(self, req, cache):
        self.req, self.cache, self.generated = req, cache, []


class ChatEngine(object):
    def __init__(self):
        self.model = LlamaForCausalLM()
        self.model.eval()
        self.active = {}                       # request id -> RequestState, while streaming

    def start(self, req):
        cache = StaticCache(max_batch_size=1, max_cache_len=req.prompt_tokens + req.max_new_tokens)
        state = self.active[req.id] = RequestState(req, cache)
        with torch.inference_mode():
            self.model(req.prompt_tokens, cache)
        return state

    def decode_one(self, state):
        with torch.inference_mode():
            logits = self.model.lm_head(torch.empty(HIDDEN, dtype=BF16), 1)   # the compiled decode step
        state.generated.append(len(state.generated))
        return EOS if len(state.generated) >= state.req.answer_tokens else state.generated[-1]

    def stream(self, req):
        state = self.start(req)
        for _ in range(req.max_new_tokens):
            token = self.decode_one(state)
            yield token
            if token == EOS:
                break
        self.finish(req.id)

    def finish(self, request_id):
        del self.active[request_id]


def serve_morning(engine):
    """The morning's traffic, replayed from the access log: (prompt tokens, answer length, client read until)."""
    rng = random.Random(7)
    log = []
    for i in range(40):
        prompt = rng.randint(5400, 6600)
        answer = rng.randint(180, 420)
        stopped = i % 3 == 1 or i % 5 == 4          # "Stop generating", or the tab closed
        log.append((prompt, answer, rng.randint(20, 90) if stopped else None))
    for n, (prompt, answer, read_until) in enumerate(log):
        req = ChatRequest("chatcmpl-%04d" % n, prompt, answer)
        gen = engine.stream(req)
        for i, _ in enumerate(gen):
            if read_until is not None and i + 1 >= read_until:
                gen.close()                          # the client went away: GeneratorExit at the yield
                break


def main():
    engine = ChatEngine()
    serve_morning(engine)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
