"""grpo_math.py -- a hand-written GRPO loop (no TRL) that trains Llama-3.2-3B-Instruct on grade-school
and competition math with a rule-based answer checker as the reward, everything in one process on one
A100 80GB.  The policy is loaded in float32 ("fp32 master weights, bf16 autocast": the author had
loss spikes with pure-bf16 AdamW), the frozen reference model in bf16, gradient checkpointing on:

    policy = AutoModelForCausalLM.from_pretrained(name).cuda()                     # fp32, 12 GiB
    policy.gradient_checkpointing_enable()
    ref = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda().eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6)
    for it, prompts in enumerate(loader):                     # 8 prompts per iteration
        policy.eval()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            seqs = policy.generate(**prompts, do_sample=True, num_return_sequences=16,
                                   max_new_tokens=1280)       # the group: 128 completions at once
        policy.train()
        rewards = check_answers(seqs); adv = group_normalize(rewards)
        with torch.no_grad(): ref_logps = per_token_logps(ref, seqs)
        optimizer.zero_grad()
        for mb in seqs.split(4):
            loss = grpo_loss(per_token_logps(policy, mb), ref_logps, adv) / n_mb
            loss.backward()
        optimizer.step()
        torch.cuda.empty_cache()

Iteration 0 runs: the first rollout has the fp32 weights (12 GiB) and the reference (6 GiB) beside it,
and its KV cache grows to 25.7 GiB (128 sequences x 1,878 tokens x 28 layers x 8 KV heads x 128 x K,V
x bf16), peak 44 GiB; the micro-batched backward fits.  Then optimizer.step() makes AdamW's moments
(24 GiB), and the fp32 gradients (12 GiB) stay: optimizer.zero_grad() is only called after the NEXT
rollout.  So the second rollout starts with 53.9 GiB resident (weights, reference, gradients,
moments) on a card with 79.1 GiB usable: the cache cannot reach its 25.7 GiB even if it were packed
perfectly, and the holes the growing DynamicCache tensors leave in PyTorch's cache (~11 GiB at the
failure) make it fail sooner, ~450 tokens into the completions, in a torch.cat inside generate().

An expert: this is the rollout (generation, autograd off), not the training step: the training
step fits; activations, checkpointing or the micro-batch size are beside the point.  What is in the
way of the KV cache is 12 GiB of gradients nobody needs until the next backward: call
optimizer.zero_grad(set_to_none=True) right after optimizer.step() (or before generate()): the second
rollout then peaks at ~68 GiB; or generate the 128 completions in chunks (e.g. 4 x 32 sequences) so
the KV cache is a quarter of that; an 8-bit AdamW (or offloading the moments) is the bigger lever
after those.  Wrong first advice: gradient checkpointing (already on, and generation saves nothing
for backward), inference_mode (generate already runs without autograd), a shorter max_new_tokens
(truncates the reasoning the reward depends on), flash attention (does not shrink the KV cache),
empty_cache (already called; the allocator also releases its cache before it gives up) or
expandable_segments (the fragmentation is real but secondary: packed perfectly the cache still does
not fit beside 54 GiB), quantizing the policy (it is being trained).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30

# ---- Llama-3.2-3B as transformers lays it out (the stand-in torch has no transformers: the classes
# ---- below are written with transformers' names and call structure; sizes are the real ones) ----
HIDDEN, LAYERS, KV_HEADS, HEAD_DIM, INTER, VOCAB = 3072, 28, 8, 128, 8192, 128256
ATTN_PARAMS = HIDDEN * HIDDEN * 2 + HIDDEN * KV_HEADS * HEAD_DIM * 2      # q, o, k, v
MLP_PARAMS = HIDDEN * INTER * 3                                          # gate, up, down
BF16 = 2


class TokenBatch(object):
    """input_ids on the GPU (int64) and their shape."""

    def __init__(self, rows, length):
        self.rows, self.length = rows, length
        self.ids = torch.empty(rows * length * 8, device="cuda")


def cat(tensors):
    """torch.cat along the sequence dimension: a new bf16 tensor as large as all of them."""
    return torch.empty(sum(t.nbytes for t in tensors) // BF16, dtype=torch.bfloat16, device="cuda")


class DynamicCache(object):
    """transformers.cache_utils.DynamicCache: per layer, the keys and values so far; update() cats."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = cat([self.key_cache[layer_idx], key_states])
            self.value_cache[layer_idx] = cat([self.value_cache[layer_idx], value_states])
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class LlamaAttention(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.qkvo_proj = torch.nn.Parameter(torch.empty(ATTN_PARAMS, dtype=dtype, device="cuda"),
                                            requires_grad=dtype == torch.float32)

    def forward(self, hidden, rows, n, past_key_value=None, layer_idx=0):
        w = self.qkvo_proj
        k = torch.empty(rows * n * KV_HEADS * HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(rows * n * KV_HEADS * HEAD_DIM, dtype=torch.bfloat16, device="cuda")
        if past_key_value is not None:
            k, v = past_key_value.update(k, v, layer_idx)
        out = torch.empty(rows * n * HIDDEN * 2, dtype=torch.bfloat16, device="cuda")   # q; sdpa + o_proj
        del k, v, w
        return out


class LlamaMLP(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.gate_up_down = torch.nn.Parameter(torch.empty(MLP_PARAMS, dtype=dtype, device="cuda"),
                                               requires_grad=dtype == torch.float32)

    def forward(self, hidden, rows, n):
        w = self.gate_up_down
        gate_up = torch.empty(rows * n * INTER * 2, dtype=torch.bfloat16, device="cuda")  # gate_proj, up_proj
        out = torch.empty(rows * n * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del gate_up, w
        return out


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, dtype, idx):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(dtype)
        self.mlp = LlamaMLP(dtype)
        self.idx = idx

    def forward(self, hidden, rows, n, past_key_value=None):
        a = self.self_attn(hidden, rows, n, past_key_value, self.idx)
        out = self.mlp(a, rows, n)
        if torch.is_grad_enabled():
            out._saved = hidden          # gradient checkpointing: only the layer's input is kept
        return out


class LlamaModel(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"),
                                               requires_grad=dtype == torch.float32)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(dtype, i))

    def forward(self, input_ids, past_key_values=None):
        rows, n = input_ids.rows, input_ids.length
        e = self.embed_tokens
        h = torch.empty(rows * n * HIDDEN, dtype=torch.bfloat16, device="cuda")
        if torch.is_grad_enabled():
            h._saved = input_ids.ids
        for i in range(LAYERS):
            h = getattr(self, "layers_%d" % i)(h, rows, n, past_key_values)
        del e
        return h


class CausalLMOutput(object):
    def __init__(self, logits, past_key_values):
        self.logits, self.past_key_values = logits, past_key_values


class LlamaForCausalLM(torch.nn.Module):
    """lm_head tied to embed_tokens (Llama 3.2)."""

    def __init__(self, dtype=torch.float32):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel(dtype)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls(torch_dtype or torch.float32)      # no torch_dtype: float32, as transformers loads

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, past_key_values=None, logits_to_keep=0):
        h = self.model(input_ids, past_key_values)
        positions = 1 if logits_to_keep == 1 else input_ids.length
        logits = torch.empty(input_ids.rows * positions * VOCAB, dtype=torch.bfloat16, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = h
        return CausalLMOutput(logits, past_key_values)

    # GenerationMixin.generate -> _sample, as transformers runs it (autograd off)
    def generate(self, input_ids, do_sample=True, num_return_sequences=1, max_new_tokens=20,
                 temperature=1.0, top_p=1.0):
        with torch.no_grad():
            expanded = TokenBatch(input_ids.rows * num_return_sequences, input_ids.length)
            return self._sample(expanded, max_new_tokens, temperature, top_p)

    def _sample(self, input_ids, max_new_tokens, temperature, top_p):
        rows = input_ids.rows
        cache = DynamicCache()
        out = self(input_ids, past_key_values=cache, logits_to_keep=1)     # prefill
        step = 1
        produced = 0
        while produced < max_new_tokens:
            scores = torch.empty(rows * VOCAB, dtype=torch.float32, device="cuda")   # logits[:, -1].float()
            del out
            probs = torch.empty(rows * VOCAB, dtype=torch.float32, device="cuda")    # softmax -> multinomial
            del probs, scores
            out = self(TokenBatch(rows, step), past_key_values=cache, logits_to_keep=1)
            produced += step
        del out
        return TokenBatch(rows, input_ids.length + max_new_tokens)


# ---- the user's GRPO loop ----
PROMPTS_PER_STEP, GROUP, MAX_NEW = 8, 16, 1280
PROMPT_LEN = 598            # left-padded to this batch's longest prompt
MICRO_BATCH = 4


def per_token_logps(model, seqs):
    out = model(seqs)
    logps = F.log_softmax(out.logits, dim=-1, dtype=torch.float32)    # then gathered at the tokens
    return logps


def grpo_loss(logps, advantages):
    loss = torch.empty(512, device="cuda")
    loss._saved = logps
    loss._params = logps._params
    return loss


def check_answers(seqs):
    return [0.0] * seqs.rows                      # the math verifier runs on the CPU


def main():
    name = "meta-llama/Llama-3.2-3B-Instruct"
    policy = LlamaForCausalLM.from_pretrained(name).cuda()
    policy.gradient_checkpointing_enable()
    ref = LlamaForCausalLM.from_pretrained(name, torch_dtype=torch.bfloat16).cuda().eval()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, weight_decay=0.0)
    print("loaded: %.1f GiB" % (torch.cuda.memory_allocated() / GiB))

    for it in range(1000):
        prompts = TokenBatch(PROMPTS_PER_STEP, PROMPT_LEN)
        policy.eval()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            seqs = policy.generate(prompts, do_sample=True, num_return_sequences=GROUP,
                                   max_new_tokens=MAX_NEW, temperature=0.9)
        policy.train()
        print("it %d: rollout done, peak %.1f GiB" % (it, torch.cuda.max_memory_allocated() / GiB))
        rewards = check_answers(seqs)
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for start in range(0, seqs.rows, MICRO_BATCH):
                lp = per_token_logps(ref, TokenBatch(MICRO_BATCH, seqs.length))
                del lp                             # gathered per token: kept as a few MiB
        optimizer.zero_grad()
        n_mb = seqs.rows // MICRO_BATCH
        for start in range(0, seqs.rows, MICRO_BATCH):
            mb = TokenBatch(MICRO_BATCH, seqs.length)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = grpo_loss(per_token_logps(policy, mb), rewards)
            scen_truth.backward(loss)              # loss.backward()
            del loss, mb
        optimizer.step()
        torch.cuda.empty_cache()                   # "give the memory back before the next rollout"
        print("it %d: step done, %.1f GiB allocated" % (it, torch.cuda.memory_allocated() / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
