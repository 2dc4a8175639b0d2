"""chat_server.py -- a telecom's customer-support assistant: Mistral-7B-Instruct-v0.3 (bf16, 13.5 GiB) behind
FastAPI on one L4 (24 GB, 22 GiB usable), one uvicorn worker.  The first version had a plain /v1/chat endpoint
(model.generate, which runs under torch.no_grad).  For the web widget the team added token streaming with a
hand-written decode loop (their own stop strings and a per-token profanity filter) and Server-Sent Events:

    model = AutoModelForCausalLM.from_pretrained(MODEL, torch_dtype=torch.bfloat16, device_map="cuda")
    model.eval()

    def stream_reply(input_ids, max_new_tokens):
        past = DynamicCache()
        ids = input_ids
        for _ in range(max_new_tokens):
            out = model(input_ids=ids, past_key_values=past, use_cache=True)
            past = out.past_key_values
            ids = out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
            if ids.item() == tokenizer.eos_token_id:
                break
            yield f"data: {json.dumps({'token': tokenizer.decode(ids[0])})}\\n\\n"

    @app.post("/v1/chat/stream")
    def chat_stream(req: ChatRequest):
        with torch.no_grad():
            input_ids = tokenizer.apply_chat_template(req.messages, add_generation_prompt=True,
                                                      return_tensors="pt").to("cuda")
            return StreamingResponse(stream_reply(input_ids, req.max_tokens), media_type="text/event-stream")

`stream_reply(...)` only creates the generator: its body runs when Starlette iterates the response, after
chat_stream has returned and the `with torch.no_grad()` block is over (and on whichever of Starlette's
threadpool threads resumes it: grad mode is per thread).  So every decoding step runs with autograd on (the parameters from
from_pretrained require grad; model.eval() does not change that).  Each step's graph is reachable from the
KV cache the next step extends, so nothing a step saved for backward is freed until the reply ends: the
prefill's activations (3 GiB for a 460-token prompt) and, per token, every layer's saved inputs including
the key/value tensors repeated to 32 heads for attention: 16 KiB per layer per position in the context, so
each new token keeps ~240 MiB more, rising.  Tested with "hi" and max_tokens=64 it worked.  In production,
short replies ("Sure, anything else?") go through; the first long answer dies 23 tokens in, with CUDA out of
memory in the middle of a decoding step (a 3.8 MiB request: 8.4 GiB of the card are live tensors besides
the weights); uvicorn logs "Exception in ASGI application", the widget shows half a
sentence.  (A no_grad reply of 500 tokens would need ~120 MiB of KV cache.)

An expert: the decode loop runs with autograd on because the generator runs outside the no_grad block: put
the inference mode on the generator itself (@torch.inference_mode() on stream_reply, which PyTorch re-enters
at every resumption of a generator, whatever thread resumes it; or a with-block around each step's forward,
not around a yield), or stream from model.generate with a TextIteratorStreamer.  Then the step's activations are freed at once and the cache grows by 128 KiB per
token.  Not a smaller or preallocated KV cache, shorter prompts or max_tokens, quantization, a bigger GPU,
gradient checkpointing, expandable_segments or empty_cache: the memory is autograd's, held by live graphs.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 32768

# --------------------------------------------------------------------------------------------------------------
# What transformers' MistralForCausalLM, DynamicCache and Starlette's StreamingResponse do, sized as the real
# ones (the stand-in torch has no nn.Linear, no attention and no web server).  An operation's output is in its
# inputs' autograd graph when autograd is on (torch._derive, Module.__call__), and `_saved` is what PyTorch's
# autograd node keeps for backward: freed with the graph, never under no_grad / inference_mode.


def _bf16(elements):
    return torch.empty(elements, dtype=torch.bfloat16, device="cuda")


def _op(elements, inputs, saves=None, dtype=torch.bfloat16):
    out = torch.empty(elements, dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        out._saved = saves
        torch._derive(out, *inputs)
    return out


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.out_features = n_out
        self.weight = torch.nn.Parameter(_bf16(n_in * n_out))       # requires_grad=True, as loaded

    def forward(self, x, tokens):
        return _op(tokens * self.out_features, (x,), saves=x)


class MistralRMSNorm(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(_bf16(HIDDEN))

    def forward(self, x, tokens):
        return _op(tokens * HIDDEN, (x,), saves=x)


def cat(tensors, elements):
    """torch.cat: a new tensor; CatBackward saves no input, it only links the inputs' graphs (an earlier
    cat's links, not its data)."""
    out = _bf16(elements)
    if torch.is_grad_enabled():
        links = []
        for t in tensors:
            if t is not None:
                links.extend(t._saved if getattr(t, "_is_cat", False) else (t,))
        out._saved, out._is_cat = tuple(links), True
        torch._derive(out, *[t for t in tensors if t is not None])
    return out


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache, self.seen = [None] * LAYERS, [None] * LAYERS, [0] * LAYERS

    def get_seq_length(self, layer_idx=0):
        return self.seen[layer_idx]

    def update(self, key_states, value_states, layer_idx, tokens):
        n = self.seen[layer_idx] + tokens
        self.key_cache[layer_idx] = cat((self.key_cache[layer_idx], key_states), n * KV_HEADS * HEAD_DIM)
        self.value_cache[layer_idx] = cat((self.value_cache[layer_idx], value_states), n * KV_HEADS * HEAD_DIM)
        self.seen[layer_idx] = n
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


def repeat_kv(states, ctx):
    """(b, 8, ctx, 128) -> (b, 32, ctx, 128): expand + reshape, a copy 4x the cache's size."""
    return _op(ctx * HEADS * HEAD_DIM, (states,))


def scaled_dot_product_attention(q, k, v, tokens):
    """Its backward needs q, k, v (the efficient kernels save them and the log-sum-exp)."""
    return _op(tokens * HIDDEN, (q, k, v), saves=(q, k, v))


class MistralAttention(torch.nn.Module):
    def __init__(self, layer_idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = layer_idx
        self.q_proj = Linear(HIDDEN, HEADS * HEAD_DIM)
        self.k_proj = Linear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.v_proj = Linear(HIDDEN, KV_HEADS * HEAD_DIM)
        self.o_proj = Linear(HEADS * HEAD_DIM, HIDDEN)

    def forward(self, hidden_states, tokens, past_key_value):
        query_states = self.q_proj(hidden_states, tokens)
        key_states = self.k_proj(hidden_states, tokens)
        value_states = self.v_proj(hidden_states, tokens)
        key_states, value_states = past_key_value.update(key_states, value_states, self.layer_idx, tokens)
        ctx = past_key_value.get_seq_length(self.layer_idx)
        key_states = repeat_kv(key_states, ctx)
        value_states = repeat_kv(value_states, ctx)
        attn_output = scaled_dot_product_attention(query_states, key_states, value_states, tokens)
        return self.o_proj(attn_output, tokens)


class MistralMLP(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, x, tokens):
        gate = self.gate_proj(x, tokens)
        up = self.up_proj(x, tokens)
        act = _op(tokens * INTER, (gate,), saves=gate)               # silu
        prod = _op(tokens * INTER, (act, up), saves=(act, up))       # act_fn(gate) * up
        return self.down_proj(prod, tokens)


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self, layer_idx):
        torch.nn.Module.__init__(self)
        self.input_layernorm = MistralRMSNorm()
        self.self_attn = MistralAttention(layer_idx)
        self.post_attention_layernorm = MistralRMSNorm()
        self.mlp = MistralMLP()

    def forward(self, hidden_states, tokens, past_key_value):
        residual = hidden_states
        hidden_states = self.input_layernorm(hidden_states, tokens)
        hidden_states = self.self_attn(hidden_states, tokens, past_key_value)
        hidden_states = _op(tokens * HIDDEN, (residual, hidden_states), saves=(residual, hidden_states))
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states, tokens)
        hidden_states = self.mlp(hidden_states, tokens)
        return _op(tokens * HIDDEN, (residual, hidden_states), saves=(residual, hidden_states))


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(_bf16(VOCAB * HIDDEN))
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer(i)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = MistralRMSNorm()
        self.lm_head = Linear(HIDDEN, VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return cls()

    def forward(self, input_ids=None, past_key_values=None, use_cache=True):
        tokens = input_ids.tokens
        hidden_states = _op(tokens * HIDDEN, (self.embed_tokens,))           # embedding lookup
        for layer in self.layers:
            hidden_states = layer(hidden_states, tokens, past_key_values)
        hidden_states = self.norm(hidden_states, tokens)
        logits = self.lm_head(hidden_states, tokens)
        logits = _op(tokens * VOCAB, (logits,), dtype=torch.float32)         # logits.float()
        return CausalLMOutputWithPast(logits, past_key_values)


class TokenIds(object):
    """input_ids (1, tokens) int64 on the GPU."""

    def __init__(self, tokens, token_id=None):
        self.tokens = tokens
        self.t = torch.empty(tokens * 8, dtype=torch.uint8, device="cuda")
        self.token_id = token_id

    def to(self, device):
        return self

    def item(self):
        return self.token_id


class _Logits(object):
    """What the real logits' argmax gives: the replies the model writes for the replayed conversations."""
    replies = []

    @classmethod
    def argmax_next(cls, step):
        return TokenIds(1, token_id=EOS if step >= cls.replies[0] else 1000 + step)


EOS = 2


class Tokenizer(object):
    eos_token_id = EOS

    def apply_chat_template(self, messages, add_generation_prompt=True, return_tensors="pt"):
        return TokenIds(sum(m["tokens"] for m in messages))

    def decode(self, ids):
        return "tok%d" % ids.token_id


class StreamingResponse(object):
    def __init__(self, content, media_type=None):
        self.body_iterator = content
        self.media_type = media_type


def serve(app_route, request):
    """uvicorn + Starlette: call the endpoint, then send the body as it is produced; an exception while
    streaming is logged ("Exception in ASGI application") and the connection closed; the server goes on."""
    sent = 0
    try:
        response = app_route(request)
        for chunk in response.body_iterator:
            sent += 1
        print("INFO:     %s - \"POST /v1/chat/stream HTTP/1.1\" 200 OK (%d tokens streamed, reserved %.1f GiB)"
              % (request["client"], sent, torch.cuda.memory_reserved() / (1 << 30)))
    except Exception:
        import traceback
        sys.stderr.write("ERROR:    Exception in ASGI application (after %d tokens streamed)\n" % sent)
        traceback.print_exc()
        return False
    finally:
        _Logits.replies.pop(0)
    return True


# --------------------------------------------------------------------------------------------------------------
# chat_server.py
tokenizer = Tokenizer()
model = MistralForCausalLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3", torch_dtype=torch.bfloat16,
                                           device_map="cuda")
model.eval()


def stream_reply(input_ids, max_new_tokens):
    past = DynamicCache()
    ids = input_ids
    for step in range(max_new_tokens):
        out = model(input_ids=ids, past_key_values=past, use_cache=True)
        past = out.past_key_values
        ids = _Logits.argmax_next(step)        # out.logits[:, -1, :].argmax(dim=-1, keepdim=True)
        if ids.item() == tokenizer.eos_token_id:
            break
        yield "data: {\"token\": \"%s\"}\n\n" % tokenizer.decode(ids)


def chat_stream(req):
    with torch.no_grad():
        input_ids = tokenizer.apply_chat_template(req["messages"], add_generation_prompt=True,
                                                  return_tensors="pt").to("cuda")
        return StreamingResponse(stream_reply(input_ids, req.get("max_tokens", 1024)), media_type="text/event-stream")


def chat_stream_traced(req):
    """(test scaffolding: the simulator's truth mark at the failure, then the error goes on as it would)"""
    response = chat_stream(req)

    def body():
        try:
            for chunk in response.body_iterator:
                yield chunk
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark()
            raise
    return StreamingResponse(body(), response.media_type)


SYSTEM = {"role": "system", "tokens": 310}        # policies, tone, escalation rules
conversations = [
    ("widget-7f3a", [SYSTEM, {"role": "user", "tokens": 38}], 11),                 # "Sure, anything else?"
    ("widget-91c0", [SYSTEM, {"role": "user", "tokens": 64}, {"role": "assistant", "tokens": 22},
                     {"role": "user", "tokens": 19}], 9),
    ("widget-2b77", [SYSTEM, {"role": "user", "tokens": 150}], 240),               # roaming charges, explained
]
for client, messages, reply_tokens in conversations:
    _Logits.replies.append(reply_tokens)
    serve(chat_stream_traced, {"client": client, "messages": messages, "max_tokens": 1024})
print("INFO:     Shutting down")
sys.exit(0)
