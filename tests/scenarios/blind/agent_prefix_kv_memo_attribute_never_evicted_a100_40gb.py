"""agent_runtime.py -- a ReAct-style agent framework running Llama-3.1-8B-Instruct (bf16, 15 GiB) in
process on an A100 40GB.  To make repeated tool calls cheap, the developer memoizes the prefill of
every prompt prefix it has seen (system prompt + tool schemas + the conversation so far) on the
agent object, keyed by the prefix's hash, and reuses it as past_key_values:

    class Agent:
        def __init__(self, model):
            self.model, self._prefix_kv = model, {}
        def step(self, prompt):
            key = hash(prompt[:-1])
            kv = self._prefix_kv.get(key)
            out = self.model.generate(ids, past_key_values=kv, max_new_tokens=256, return_dict_in_generate=True)
            self._prefix_kv[hash(prompt)] = out.past_key_values       # never evicted

Each turn's prompt is the whole conversation so far, so every entry is a different, longer prefix
(6k -> 8k tokens, 128 KiB a token: 0.75-1 GiB each) and none is ever dropped.  After ~25 tool calls
the dict holds ~23 GiB of KV caches and the next generation's prefill fails.  Generation runs under
inference_mode; the weights and one generation's working set fit with 20 GiB to spare.

An expert: the memory is held by a cache the program keeps -- bound it (an LRU of a few entries,
keep only the latest prefix, or move stale entries to the CPU) -- not a smaller batch, quantization
or a bigger GPU; empty_cache cannot free tensors the dict references.
"""
import sys

import torch
import torch.nn as nn
import scen_truth

MiB = 1 << 20
KV_PER_TOKEN = 128 * 1024           # 32 layers x 2 (k, v) x 8 kv heads x 128 dims x bf16
scen_truth.note_every_empty(torch)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(501 * MiB, dtype=torch.bfloat16), requires_grad=False)
        for i in range(32):
            setattr(self, "layers_%d" % i, nn.Parameter(torch.empty(208 * MiB, dtype=torch.bfloat16), requires_grad=False))
        self.lm_head = nn.Parameter(torch.empty(501 * MiB, dtype=torch.bfloat16), requires_grad=False)

    def generate(self, prompt_len, past_key_values=None, max_new_tokens=256, return_dict_in_generate=True):
        total = prompt_len + max_new_tokens
        hidden = torch.empty(prompt_len * 4096 * 2 * 4)                          # prefill activations
        layers = []                                                             # the new KV cache, per layer
        for _ in range(32):
            layers.append(torch.empty(total * KV_PER_TOKEN // 32))
        logits = torch.empty(128256 * 4)
        del hidden
        return {"sequences": None, "past_key_values": layers}


class Agent(object):
    def __init__(self, model):
        self.model = model
        self._prefix_kv = {}

    def step(self, turn, prompt_len):
        kv = self._prefix_kv.get(turn - 1)
        out = self.model.generate(prompt_len, past_key_values=kv, max_new_tokens=256)
        self._prefix_kv[turn] = out["past_key_values"]         # memoized for the next call, never evicted
        return out


def main():
    agent = Agent(LlamaForCausalLM().eval())
    with torch.inference_mode():
        for turn in range(200):
            prompt_len = 6000 + 80 * turn                     # the conversation grows each tool call
            agent.step(turn, prompt_len)
    return 0


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
