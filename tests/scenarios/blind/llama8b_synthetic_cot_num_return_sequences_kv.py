"""make_cot_data.py -- synthetic chain-of-thought data for our math tutor: Llama-3.1-8B-Instruct samples
4 solutions per problem (we keep the ones whose final answer checks out).  One H100 80 GB, bf16 weights
(15 GiB), sdpa, plain transformers generate() with the default DynamicCache:

    for problems in batched(dataset, 64):
        enc = tok(problems, return_tensors="pt", padding=True).to("cuda")       # ~600 tokens, left-padded
        out = model.generate(**enc, do_sample=True, temperature=0.8, top_p=0.95,
                             num_return_sequences=4, max_new_tokens=4096)

64 problems x 4 samples = 256 sequences decoded together.  Short answers were fine in the pilot
(max_new_tokens=512).  With 4096 the job dies in the first batch after about 1080 new tokens: the
KV cache grows by 256 sequences x 128 KiB (32 layers, 8 KV heads x 128, bf16, keys and values) = 32 MiB
per token, 52.5 GiB for the 1680 tokens at the failure, on top of the 15 GiB of weights; each layer's
cache is re-made one token longer at every step (torch.cat), which also leaves ~11 GiB of split
remainders in PyTorch's cache, and the whole batch decodes until the longest sample stops.  The full
4096 tokens would need 147 GiB of KV cache: no allocator setting closes that.

An expert: fewer sequences in flight per generate() call (16 problems x 4, or num_return_sequences
spread over calls) and/or a cap on max_new_tokens that matches the answers; better, run this with a
paged-KV engine (vLLM/SGLang: continuous batching, memory for tokens that exist, finished sequences
leave the batch) -- the standard tool for offline sampling at this scale.  A quantized or offloaded KV
cache is a fallback.  There are no beams (num_beams=1), autograd is already off (generate runs under
no_grad), the weights are not the problem, and checkpointing/mixed precision/the allocator's settings
do nothing for a KV cache.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

VOCAB = 128256
HIDDEN = 4096
LAYERS = 32
KV_PER_TOKEN_PER_LAYER = 2 * 8 * 128 * 2          # keys and values, 8 KV heads x 128, bf16: 4 KiB


class Linear(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)


class DynamicCache(object):
    """transformers' DynamicCache: per layer, keys and values concatenated with each step's."""

    def __init__(self):
        self.layers = [None] * LAYERS

    def update(self, layer_idx, new_tokens, batch):
        past = self.layers[layer_idx]
        n = (past.nbytes if past is not None else 0) + new_tokens * batch * KV_PER_TOKEN_PER_LAYER
        self.layers[layer_idx] = torch.empty(n, dtype=torch.uint8, device="cuda")     # torch.cat
        return self.layers[layer_idx]


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.idx = idx
        self.self_attn = Linear(80 * MiB)           # q, k, v, o (GQA)
        self.mlp = Linear(336 * MiB)                # gate, up, down (14336)

    def forward(self, hidden, past_key_values, new_tokens, batch):
        past_key_values.update(self.idx, new_tokens, batch)
        if new_tokens > 1:                          # prefill: the MLP's gate/up activations of the prompts
            up = torch.empty(new_tokens * batch * 14336 * 2 * 2, dtype=torch.uint8, device="cuda")
            del up
        return hidden


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(VOCAB * HIDDEN * 2)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer(i)
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = Linear(VOCAB * HIDDEN * 2)

    def forward(self, new_tokens, batch, past_key_values):
        hidden = torch.empty(new_tokens * batch * HIDDEN * 2, dtype=torch.uint8, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, past_key_values, new_tokens, batch)
        return torch.empty(batch * VOCAB * 2, dtype=torch.uint8, device="cuda")      # last position, bf16

    def generate(self, input_len, batch_size, do_sample=True, num_return_sequences=1, max_new_tokens=20,
                 num_beams=1):
        """transformers' GenerationMixin._sample, as far as memory goes."""
        with torch.no_grad():
            sequences = batch_size * num_return_sequences      # _expand_inputs_for_generation
            past_key_values = DynamicCache()
            new = input_len
            for step in range(max_new_tokens):
                logits = self(new, sequences, past_key_values)
                next_token_logits = torch.empty(sequences * VOCAB, dtype=torch.float32, device="cuda")
                del logits
                # top_p: sort the scores (values + int64 indices), then softmax and multinomial
                sorted_logits = torch.empty(sequences * VOCAB, dtype=torch.float32, device="cuda")
                sorted_indices = torch.empty(sequences * VOCAB * 8, dtype=torch.uint8, device="cuda")
                del sorted_logits, sorted_indices
                probs = torch.empty(sequences * VOCAB, dtype=torch.float32, device="cuda")
                del probs, next_token_logits
                new = 1
            return past_key_values


def main():
    model = LlamaForCausalLM()
    model.eval()
    batch_size = 64
    for batch in range(200):
        out = model.generate(600, batch_size, do_sample=True, num_return_sequences=4, max_new_tokens=4096)
        del out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
