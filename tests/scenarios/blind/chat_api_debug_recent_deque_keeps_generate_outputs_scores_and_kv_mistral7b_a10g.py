"""A chat API keeps the last requests for a /debug/recent endpoint, and with them every GenerateOutput
(per-step scores and the whole past_key_values) on the GPU: the card fills request by request until a
generation fails (NVIDIA A10G 24 GB, Mistral-7B-Instruct-v0.3 bf16).

The real service (FastAPI + transformers, one worker, requests served one at a time):

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    RECENT = collections.deque(maxlen=256)       # "last requests, for the /debug/recent page"

    @app.post("/v1/chat/completions")
    def chat(req: ChatRequest):
        ids = tok.apply_chat_template(req.messages, return_tensors="pt").to("cuda")
        out = model.generate(ids, max_new_tokens=req.max_tokens, do_sample=True,
                             output_scores=True, return_dict_in_generate=True)   # for "logprobs": true
        text = tok.decode(out.sequences[0, ids.shape[1]:], skip_special_tokens=True)
        RECENT.append({"id": req_id, "prompt_ids": ids, "output": out, "text": text})
        return {...}

generate() runs under no_grad; nothing leaks autograd.  But return_dict_in_generate=True hands back
`scores` (one float32 row of the 32,768-token vocabulary per new token: 128 KiB a token) and
`past_key_values` (the DynamicCache: 32 layers x K,V x 8 heads x 128 x bf16 = 128 KiB a token of
prompt + output), and the deque keeps them all.

Sizes (A10G: 23028 MiB = 22.49 GiB; context ~0.5 GiB):
  weights bf16 7.25 B params                                   = 13.5 GiB
  left for KV, scores and activations                          ~  8.5 GiB
  one request: ~1,000-2,400-token RAG prompt + 150-512 new tokens
    KV (prompt+output) x 128 KiB + scores (output) x 128 KiB   ~ 0.2-0.4 GiB kept per request
  after 25 requests the deque holds ~7.6 GiB on the GPU (allocated 21.1 GiB of 22.49); the 26th
  request's prefill fails on a 64 MiB MLP activation (2,356 prompt tokens x 14,336 x bf16) with 24 MiB
  free.  PyTorch's cache holds ~0.57 GiB in holes the DynamicCache's torch.cat growth left in partly
  used segments -- a side effect, 2.5 % of the card; maxlen=256 would let the history reach ~80 GiB.
  The failing request alone needs well under 1 GiB: nothing about it is big.

What an expert says first: memory grows with every request because the debug history keeps GPU
tensors alive; keep only what the page needs, off the GPU (the text, token ids and the chosen tokens'
logprobs as Python floats: out.scores -> .cpu() top-k, drop out.past_key_values), i.e. release the
references -- or, second, bound the history far lower.  Wrong advice: a bigger GPU or quantization (the
leak would fill any card), smaller batches or shorter sequences (requests are single and short),
expandable_segments / empty_cache (the memory is live; the 0.57 GiB of holes would buy two more
requests), inference_mode (generate already runs without grad).
"""
import collections
import random
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


def _report_oom_truth(tp, value, tb):
    if issubclass(tp, torch.cuda.OutOfMemoryError):
        scen_truth.torch_oom_mark()
    sys.__excepthook__(tp, value, tb)


sys.excepthook = _report_oom_truth

VOCAB = 32768
HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
KV_HEADS = 8
HEAD_DIM = 128
DECODE_CHUNK = 64      # the stand-in grows the cache and the scores 64 decode steps at a time


def _weight(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class DynamicCache(object):
    """transformers.DynamicCache: per layer a key and a value tensor, concatenated on as tokens come."""

    def __init__(self):
        self.key_cache = []
        self.value_cache = []

    def update(self, layer_idx, num_tokens):
        per_token = KV_HEADS * HEAD_DIM
        if layer_idx == len(self.key_cache):
            self.key_cache.append(torch.empty(num_tokens * per_token, dtype=torch.bfloat16, device="cuda"))
            self.value_cache.append(torch.empty(num_tokens * per_token, dtype=torch.bfloat16, device="cuda"))
            return
        old = self.key_cache[layer_idx].nbytes // 2 // per_token
        # torch.cat([past, new], dim=-2): a new tensor, the old one freed
        self.key_cache[layer_idx] = torch.empty((old + num_tokens) * per_token, dtype=torch.bfloat16,
                                                device="cuda")
        self.value_cache[layer_idx] = torch.empty((old + num_tokens) * per_token, dtype=torch.bfloat16,
                                                  device="cuda")


class GenerateDecoderOnlyOutput(object):
    def __init__(self, sequences, scores, past_key_values):
        self.sequences = sequences
        self.scores = scores
        self.past_key_values = past_key_values


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        kv = KV_HEADS * HEAD_DIM
        self.q_proj = _weight(HIDDEN * HIDDEN)
        self.k_proj = _weight(HIDDEN * kv)
        self.v_proj = _weight(HIDDEN * kv)
        self.o_proj = _weight(HIDDEN * HIDDEN)
        self.gate_proj = _weight(HIDDEN * INTERMEDIATE)
        self.up_proj = _weight(HIDDEN * INTERMEDIATE)
        self.down_proj = _weight(INTERMEDIATE * HIDDEN)
        self.input_layernorm = _weight(HIDDEN)
        self.post_attention_layernorm = _weight(HIDDEN)

    def forward(self, hidden, num_tokens, cache, layer_idx):
        cache.update(layer_idx, num_tokens)
        attn = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        gate = torch.empty(num_tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        up = torch.empty(num_tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        del gate, up, attn
        return torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(VOCAB * HIDDEN)

    def forward(self, num_tokens, cache):
        hidden = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i, layer in enumerate(self.layers):
            hidden = layer(hidden, num_tokens, cache, i)
        # logits of the last position only (logits_to_keep=1), upcast to float32 for the processors
        return torch.empty(VOCAB, dtype=torch.float32, device="cuda")

    def generate(self, input_ids, max_new_tokens, new_tokens, output_scores=False, return_dict_in_generate=False):
        """GenerationMixin.generate (under torch.no_grad): prefill, then decode until EOS; new_tokens is
        where this request's sampling hit EOS."""
        with torch.no_grad():
            cache = DynamicCache()
            prompt_len = input_ids.nbytes // 8
            logits = self(prompt_len, cache)
            scores = []
            done = 0
            while done < new_tokens:
                step = min(DECODE_CHUNK, new_tokens - done)
                logits = self(step, cache)
                if output_scores:
                    scores.append(torch.empty(step * VOCAB, dtype=torch.float32, device="cuda"))
                done += step
            del logits
            sequences = torch.empty((prompt_len + new_tokens) * 8, device="cuda")     # int64 ids
        if return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences, tuple(scores), cache)
        return sequences


class ChatService(object):
    def __init__(self, model):
        self.model = model
        self.recent = collections.deque(maxlen=256)     # last requests, for the /debug/recent page
        self.served = 0

    def chat_completion(self, request):
        prompt_ids = torch.empty(request["prompt_tokens"] * 8, device="cuda")     # int64, .to("cuda")
        out = self.model.generate(prompt_ids, max_new_tokens=request["max_tokens"],
                                  new_tokens=request["completion_tokens"],
                                  output_scores=True, return_dict_in_generate=True)
        text = "<%d tokens>" % request["completion_tokens"]
        self.recent.append({"id": request["id"], "prompt_ids": prompt_ids, "output": out, "text": text})
        self.served += 1
        return {"id": request["id"], "choices": [{"message": {"role": "assistant", "content": text}}]}


def incoming_requests(seed=11):
    """Replay of Monday morning's traffic: RAG prompts with retrieved passages, logprobs requested by the
    answer-confidence feature."""
    rng = random.Random(seed)
    n = 0
    while True:
        n += 1
        yield {"id": "chatcmpl-%05d" % n, "prompt_tokens": rng.randint(1000, 2400), "max_tokens": 512,
               "completion_tokens": rng.randint(150, 512)}


def main():
    print("loading mistralai/Mistral-7B-Instruct-v0.3 (bf16) ...", flush=True)
    model = MistralForCausalLM().cuda().eval()
    service = ChatService(model)
    for request in incoming_requests():
        service.chat_completion(request)
        if service.served % 5 == 0:
            print("served %d requests" % service.served, flush=True)


if __name__ == "__main__":
    main()
