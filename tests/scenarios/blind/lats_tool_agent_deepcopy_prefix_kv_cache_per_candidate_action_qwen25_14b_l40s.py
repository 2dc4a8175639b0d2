"""lats_agent.py -- a planning agent for an internal IT helpdesk: Language Agent Tree Search (LATS) on
Qwen2.5-14B-Instruct (bf16, 14.77B parameters, 27.5 GiB) with transformers, on one NVIDIA L40S (48 GB;
46068 MiB).  41 tools (ticketing, LDAP, Jira, a Kubernetes read-only API, runbooks search) are listed in
the system prompt: 9.1k tokens before the user says anything.  At each step the agent samples k=5
candidate actions from the same conversation, scores each with a value prompt, and expands the best.
To avoid prefilling the conversation five times, the team's code continues every candidate from the
conversation's KV cache, and keeps each child's cache so that the chosen child can go on without a new
prefill:

    def expand(node, k=5):
        children = []
        with torch.inference_mode():
            for i in range(k):
                branch_cache = copy.deepcopy(node.cache)       # continue from the shared prefix
                action = sample_action(model, branch_cache, temperature=0.8)
                value = score_action(model, branch_cache)       # value prompt on the same cache
                children.append(Node(action, value, cache=branch_cache, parent=node))
        return children

It worked in the demo (2-3k-token conversations: a 0.5 GiB cache per child).  In production the
conversation of a hard ticket reaches 23.5k tokens after eleven tool calls (kubectl describe output,
log excerpts), prefilled once into the root's cache at the start of the expansion: 4.3 GiB (48 layers
x 2 x 8 KV heads x 128 x bf16 = 192 KiB a token).
The first two children (4.3 GiB each, plus their sampled tokens) fit; the third deepcopy fails two
thirds of the way through (layer 17's value tensor, 46 MiB) with 44 MiB free on the card and 0.9 GiB
cached by PyTorch in pieces smaller than that: 27.5 GiB of weights, the root's 4.3 GiB, two full copies
of it in `children` and most of a third.

An expert: the copies are the memory, and they are copies of the same 23.5k tokens.  Do not deep-copy
the prefix per candidate: keep one cache, let each candidate append to it and crop it back to the
prefix length afterwards (DynamicCache.crop(prefix_len)), and keep only each candidate's text and
value; re-extend the chosen child from the shared prefix (its ~100 tokens re-prefill in milliseconds).
Or sample the k candidates as one batch over the prefix (one prefill, the prefix shared, as vLLM's or
SGLang's prefix caching does).  Memory becomes one prefix plus the candidates' own tokens, whatever k.
Fewer candidates (k=2) is a stop-gap that weakens the search.  The 0.9 GiB of cached pieces is not
the cause: were it usable, the third copy would complete and the fourth would fail.
Wrong first advice: quantizing the model or offloading it (the weights fit; the copies grow with k and
with the conversation), a smaller batch (there is none: one candidate at a time), truncating the
conversation (drops the tool outputs the agent reasons over), a smaller preallocated KV cache (nothing
is preallocated), inference_mode (already on), gradient checkpointing or mixed precision (no training,
already bf16), expandable_segments / empty_cache (what is cached is 0.9 GiB against 4.3 GiB a copy; the
copies are alive, referenced by `children`), a bigger GPU (five copies of a 40k-token conversation
are 37 GiB by themselves).
"""
import copy
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.cat and Tensor.float (C functions in PyTorch, no Python frame of their own),
# compiled as part of torch's file so that the failing line of the program stays the program's own.
_GAPS = """
def cat(tensors, dim=0):
    n = 0
    for t in tensors:
        n += t.nbytes
    dt = tensors[0].dtype
    return torch.empty(n // torch._ITEMSIZE[dt], dtype=dt, device=tensors[0].device)

def _float(self):
    if self.dtype == torch.float32:
        return self
    return torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
if not hasattr(torch, "cat"):
    torch.cat = _ns["cat"]
if not hasattr(torch.Tensor, "float"):
    torch.Tensor.float = _ns["_float"]
# ----

# Qwen2.5-14B-Instruct (config.json)
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 5120, 13824, 48, 40, 8, 128, 152064


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def _act(n_elems, dtype=torch.bfloat16):
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class DynamicCache(object):
    """transformers.cache_utils.DynamicCache: per layer a key and a value tensor, grown by torch.cat."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def get_seq_length(self):
        if not self.key_cache:
            return 0
        return self.key_cache[0].nbytes // (2 * KV_HEADS * HEAD_DIM)

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            self.key_cache[layer_idx] = torch.cat([self.key_cache[layer_idx], key_states], dim=-2)
            self.value_cache[layer_idx] = torch.cat([self.value_cache[layer_idx], value_states], dim=-2)
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = idx
        self.q_proj = _weight(HIDDEN * HEADS * HEAD_DIM + HEADS * HEAD_DIM)
        self.k_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.v_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM + KV_HEADS * HEAD_DIM)
        self.o_proj = _weight(HEADS * HEAD_DIM * HIDDEN)
        self.gate_proj = _weight(HIDDEN * INTER)
        self.up_proj = _weight(HIDDEN * INTER)
        self.down_proj = _weight(INTER * HIDDEN)
        self.input_layernorm = _weight(HIDDEN)
        self.post_attention_layernorm = _weight(HIDDEN)

    def forward(self, hidden, n, cache):
        q = _act(n * HEADS * HEAD_DIM)
        k = _act(n * KV_HEADS * HEAD_DIM)
        v = _act(n * KV_HEADS * HEAD_DIM)
        cache.update(k, v, self.layer_idx)
        attn = _act(n * HEADS * HEAD_DIM)           # F.scaled_dot_product_attention
        del q, k, v
        hidden = _act(n * HIDDEN)
        del attn
        gate = _act(n * INTER)
        up = _act(n * INTER)
        inter = _act(n * INTER)
        del gate, up
        hidden = _act(n * HIDDEN)
        del inter
        return hidden


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits = logits
        self.past_key_values = past_key_values


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(i))
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        print("Loading %s (%s) on %s" % (name, torch_dtype, device_map))
        return cls()

    def forward(self, input_ids=None, past_key_values=None, use_cache=True, num_logits_to_keep=0):
        n = input_ids.nbytes // 8
        hidden = _act(n * HIDDEN)
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, n, past_key_values)
        hidden = _act(n * HIDDEN)
        keep = num_logits_to_keep or n
        logits = _act(keep * VOCAB).float()
        del hidden
        return CausalLMOutputWithPast(logits, past_key_values)


def ids_on_gpu(n_tokens):
    return torch.empty(n_tokens, dtype=torch.float64, device="cuda")   # int64 input_ids, 8 bytes a token


class Node(object):
    def __init__(self, action, value, cache, parent=None):
        self.action, self.value, self.cache, self.parent = action, value, cache, parent


def sample_action(model, cache, n_tokens, temperature=0.8):
    for _ in range(n_tokens):
        out = model(input_ids=ids_on_gpu(1), past_key_values=cache, use_cache=True)
        del out
    return "Action: ..."


def score_action(model, cache):
    """The value prompt ("Rate how likely this action resolves the ticket, 1-10"), then 3 tokens."""
    out = model(input_ids=ids_on_gpu(142), past_key_values=cache, use_cache=True, num_logits_to_keep=1)
    del out
    sample_action(model, cache, 3)
    return 7.0


def expand(model, node, k=5, action_tokens=(46, 52, 38, 61, 44)):
    children = []
    with torch.inference_mode():
        for i in range(k):
            branch_cache = copy.deepcopy(node.cache)       # continue from the shared prefix
            action = sample_action(model, branch_cache, action_tokens[i], temperature=0.8)
            value = score_action(model, branch_cache)
            children.append(Node(action, value, cache=branch_cache, parent=node))
            print("  candidate %d: value %.1f, cache %d tokens" % (i, value, branch_cache.get_seq_length()))
    return children


def main():
    model = Qwen2ForCausalLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda")
    model.eval()
    # ticket INC-48213 ("payments-api pods crashloop after the node pool upgrade"), after eleven tool calls:
    # the conversation so far, prefilled once into the root's cache
    conversation_tokens = 23516
    root_cache = DynamicCache()
    with torch.inference_mode():
        out = model(input_ids=ids_on_gpu(conversation_tokens), past_key_values=root_cache, use_cache=True,
                    num_logits_to_keep=1)
        del out
    root = Node("root", 0.0, cache=root_cache)
    print("conversation: %d tokens; root cache %.2f GiB" % (
        root_cache.get_seq_length(), sum(t.nbytes for t in root_cache.key_cache + root_cache.value_cache) / 2.0 ** 30))
    assert root_cache.get_seq_length() == conversation_tokens
    children = expand(model, root, k=5)
    best = max(children, key=lambda c: c.value)
    return best


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
