"""react_agent.py -- a research agent for an equity-analysis team: a hand-written ReAct loop on
Llama-3.1-8B-Instruct (bf16, 8.03B parameters, 14.96 GiB) with transformers 4.43.3, on one NVIDIA
L40S (48 GB; 46068 MiB as nvidia-smi shows it).  The team wrote its own loop instead of calling
generate() because it must stop on "Observation:" and keep one KV cache across the whole
conversation (each turn prefills only what is new: the tool's output), so its code calls the model
directly and samples from the last position:

    cache = DynamicCache()
    with torch.inference_mode():
        for turn in agent:
            new_ids = tokenizer(turn.new_text, return_tensors="pt").input_ids.cuda()
            out = model(input_ids=new_ids, past_key_values=cache, use_cache=True)   # prefill the new text
            next_token_logits = out.logits[:, -1, :]
            ...                                                               # then decode token by token

Tools: web_search (snippets), fetch_url (the page or PDF as markdown, whole), python.  For months the
tool outputs were a few thousand tokens.  Today an analyst asks for the risk factors of a 10-K: the
model calls fetch_url on the filing and the tool returns the whole document, 41,870 tokens.  The
prefill of that observation runs the 32 layers fine (SDPA attention, the KV cache grows to 47.7k
tokens, 5.8 GiB), then LlamaForCausalLM.forward applies lm_head to every one of the 41,870 positions
(logits [1, 41870, 128256] in bf16: 10.0 GiB) and, as transformers 4.40-4.44 do, upcasts them:
`logits = logits.float()`, 20.0 GiB more in one request, with 10.5 GiB free on the card (and 3.2 GiB
cached by PyTorch in split blocks: 13.7 GiB at best).  The loop would then read one row of it.

An expert: the logits of 41,869 of those positions are never used; a prefill needs the last
position's only (128,256 floats, 0.5 MiB).  Ask the model for them alone: run model.model(...) and
apply lm_head to hidden_states[:, -1:], or upgrade transformers and pass num_logits_to_keep=1 (4.45+,
logits_to_keep later; generate() passes it itself from 4.45 on).  Prefilling the
observation in chunks of a few thousand tokens also bounds it.  Then the same card takes observations
several times longer (the KV cache is what grows with them: 128 KiB a token).
Wrong first advice: a smaller batch (the batch is 1), shorter sequences / truncating the tool output
(throws away the filing the analyst asked about, and the KV cache was never the problem), quantizing
the weights or offloading them (the weights are 15 of 45 GiB; the request is one 20 GiB tensor of
outputs nobody reads), mixed precision (the model already runs in bf16: the float32 copy is the
library's), inference_mode / no_grad (the loop already runs under inference_mode), flash attention
(attention is SDPA already and not what fails), gradient checkpointing (no training),
expandable_segments / empty_cache (one 20 GiB request, nothing fragmented), a bigger GPU (an 80 GB card
takes this filing and fails on one twice as long).
"""
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

# Llama-3.1-8B-Instruct (config.json)
HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256


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


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.layer_idx = idx
        self.q_proj = _weight(HIDDEN * HEADS * HEAD_DIM)
        self.k_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM)
        self.v_proj = _weight(HIDDEN * KV_HEADS * HEAD_DIM)
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
        attn = _act(n * HEADS * HEAD_DIM)           # F.scaled_dot_product_attention (flash / mem-efficient)
        del q, k, v
        hidden = _act(n * HIDDEN)                   # o_proj + residual
        del attn
        gate = _act(n * INTER)
        up = _act(n * INTER)
        inter = _act(n * INTER)                     # act_fn(gate) * up
        del gate, up
        hidden = _act(n * HIDDEN)                   # down_proj + residual
        del inter
        return hidden


class CausalLMOutputWithPast(object):
    def __init__(self, logits, past_key_values):
        self.logits = logits
        self.past_key_values = past_key_values


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer(i))
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, attn_implementation="sdpa"):
        print("Loading %s (%s, attn_implementation=%s) on %s" % (name, torch_dtype, attn_implementation, device_map))
        return cls()

    def forward(self, input_ids=None, past_key_values=None, use_cache=True):
        n = input_ids.nbytes // 8                   # int64 ids
        hidden = _act(n * HIDDEN)                   # embed_tokens
        for i in range(LAYERS):
            hidden = getattr(self, "layers_%d" % i)(hidden, n, past_key_values)
        hidden = _act(n * HIDDEN)                   # norm
        logits = _act(n * VOCAB)                    # lm_head(hidden_states): every position
        del hidden
        logits = logits.float()                     # transformers 4.43: "upcast to float" before returning
        return CausalLMOutputWithPast(logits, past_key_values)


class Tokenizer(object):
    def encode_to_cuda(self, n_tokens):
        """tokenizer(text, return_tensors="pt").input_ids.cuda(): int64 ids."""
        return torch.empty(n_tokens, dtype=torch.float64, device="cuda")   # 8 bytes a token, as int64


# the conversation, in tokens, as the tokenizer counted it for the 10-K question
SYSTEM_AND_TOOLS = 3104            # system prompt, the three tool schemas, ReAct format instructions
TURNS = [
    ("user", 262, "What are the new risk factors in ACME Corp's FY2024 10-K compared with FY2023?"),
    ("observation", 2391, "web_search: 10 results for 'ACME Corp 10-K 2024 risk factors'"),
    ("observation", 41870, "fetch_url: https://www.sec.gov/Archives/edgar/data/.../acme-20241231.htm (markdown)"),
]
ACTION_TOKENS = 58                 # "Thought: ... Action: fetch_url Action Input: {...}"


def decode(model, cache, max_new_tokens):
    """The loop's own sampler: one token at a time until "Observation:"."""
    for _ in range(max_new_tokens):
        ids = torch.empty(1, dtype=torch.float64, device="cuda")
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        next_token_logits = out.logits[-1] if isinstance(out.logits, list) else out.logits
        del out, next_token_logits, ids


def run_agent():
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                             device_map="cuda", attn_implementation="sdpa")
    model.eval()
    tok = Tokenizer()
    cache = DynamicCache()
    with torch.inference_mode():
        ids = tok.encode_to_cuda(SYSTEM_AND_TOOLS)
        out = model(input_ids=ids, past_key_values=cache, use_cache=True)
        del out, ids
        for role, n_tokens, text in TURNS:
            print("[%s] %s (%d tokens; context %d)" % (role, text, n_tokens, cache.get_seq_length() + n_tokens))
            new_ids = tok.encode_to_cuda(n_tokens)
            out = model(input_ids=new_ids, past_key_values=cache, use_cache=True)   # prefill the new text
            next_token_logits = out.logits              # out.logits[:, -1, :]
            del out, new_ids, next_token_logits
            decode(model, cache, ACTION_TOKENS)
    return cache


try:
    run_agent()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
