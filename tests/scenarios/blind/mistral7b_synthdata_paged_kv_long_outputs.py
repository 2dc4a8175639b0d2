"""gen_synth.py -- synthetic-data generation with a Mistral-7B-class model (bf16, 13 GiB of weights) on
one 48 GiB L40S, with my own batched sampling loop (faster than generate() for this job),
run with plain `LD_PRELOAD=liboomguard.so`:

    model = load_model("mistral-7b-instruct", dtype=torch.bfloat16).cuda()
    with torch.inference_mode():
        for prompts in loader:                        # 64 prompts of 512 tokens per batch
            out = sample(model, prompts, max_new_tokens=4096)

The KV cache is kept like a paged cache: per layer, a list of blocks of 256 tokens (keys and values of
the whole batch, 64 MiB a block with GQA: 8 KV heads x 128 x bf16 x 2), a new block allocated when the
sequence crosses a block boundary.  Until now the outputs were at most 1024 tokens (6 GiB of cache).
For this run I raised max_new_tokens to 4096: 64 sequences x 4608 tokens need 36 GiB of cache next to
the 13 GiB of weights, and the job dies near the end of the first batch, at 3,584 new tokens, when the
layers ask for their 17th block.  Nothing leaks: every block is needed until the batch ends.

An expert: the KV cache for batch x maximum length does not fit.  Bound it -- fewer sequences in
flight or a shorter maximum output (a cache sized for max batch x max length that fits, as vLLM's
scheduler does), or a quantized (fp8) KV cache.  Not a leak (releasing references frees nothing that
is not needed), not fragmentation or the cache of the allocator, not autograd (inference_mode is on);
activation checkpointing is meaningless here.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_LAYERS = 32
BLOCK_TOKENS = 256
KV_BYTES_PER_TOKEN_PER_SEQ = 2 * 8 * 128 * 2      # K and V, 8 KV heads, head dim 128, bf16: 4 KiB per layer
VOCAB = 32000
HIDDEN = 4096


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # attention (q, k, v, o with GQA) and the MLP: 218M parameters in bf16
        self.self_attn = torch.nn.Parameter(torch.empty(42 * MiB, dtype=torch.bfloat16, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(168 * MiB, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden, layer_cache, pos, batch):
        if pos % BLOCK_TOKENS == 0:                       # the sequence enters a new block
            layer_cache.append(torch.empty(batch * BLOCK_TOKENS * KV_BYTES_PER_TOKEN_PER_SEQ // 2,
                                           dtype=torch.bfloat16, device="cuda"))
        return hidden


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))

    def forward(self, tokens, past_key_values, pos, batch):
        hidden = torch.empty(batch * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for layer, layer_cache in zip(self.layers, past_key_values):
            hidden = layer(hidden, layer_cache, pos, batch)
        logits = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")
        return logits


def load_model(name, dtype):
    return MistralForCausalLM()


def sample(model, prompts, max_new_tokens, prompt_len=512):
    batch = len(prompts)
    past_key_values = [[] for _ in range(N_LAYERS)]
    # prefill: the prompt's 512 tokens fill two blocks per layer
    for pos in range(0, prompt_len, BLOCK_TOKENS):
        logits = model(prompts, past_key_values, pos, batch)
    tokens = torch.empty(batch * 8, device="cuda")
    for step in range(max_new_tokens):
        logits = model(tokens, past_key_values, prompt_len + step, batch)
        tokens = torch.empty(batch * 8, device="cuda")          # sampled next tokens
        del logits
    return tokens


def main():
    model = load_model("mistral-7b-instruct", dtype=torch.bfloat16).cuda()
    model.eval()
    loader = [list(range(64)) for _ in range(40)]
    outputs = []
    with torch.inference_mode():
        for prompts in loader:
            out = sample(model, prompts, max_new_tokens=4096)
            outputs.append(out)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
