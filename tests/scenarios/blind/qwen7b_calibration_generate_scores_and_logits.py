"""calibrate_answers.py -- we are measuring how confident Qwen2.5-7B-Instruct is token by token on our
support-answer set, to flag low-confidence spans for human review.  One RTX 4090 (24 GB), bf16 weights
(14.2 GiB), sdpa attention, batches of 16 prompts (about 380 tokens, left-padded):

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16,
                                                 device_map="cuda")
    out = model.generate(**batch, max_new_tokens=1024, do_sample=False,
                         return_dict_in_generate=True, output_scores=True, output_logits=True)
    probs = torch.stack(out.scores, 1).softmax(-1)      # later: the chosen token's probability

It ran fine on a 20-prompt smoke test with max_new_tokens=128.  On the real set it dies after roughly
360 generated tokens of the first batch, in the middle of generate().

What happens: with output_scores and output_logits, generate() keeps, for every step, the processed
scores AND the raw logits of the last position, each [16, 152064] in float32 (9.3 MiB), on the GPU,
until it returns: 18.6 MiB per generated token, 6.5 GiB after 360 tokens (all 1024 would need 19
GiB).  The KV cache is small here (GQA, 56 KiB per token per sequence: 0.6 GiB at the failure), the
weights fit with room to spare, and the allocator's few GiB of split remainders are a side effect.

An expert: do not keep full-vocabulary scores for every step on the GPU -- drop output_logits (the
scores alone are enough), or better record only what is needed (the chosen token's log-probability,
a top-k) per step (a LogitsProcessor that writes it out, or compute_transition_scores on CPU copies),
moving it to the CPU.  A smaller batch only delays it; the KV cache, beams (there are none),
quantizing the weights, autograd (generate runs under no_grad) and the allocator's settings are not
the problem.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

VOCAB = 152064
HIDDEN = 3584
LAYERS = 28
KV_PER_TOKEN_PER_LAYER = 2 * 4 * 128 * 2          # k and v, 4 kv heads x 128, bf16: 2 KiB


class Linear(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, dtype=torch.uint8, device="cuda"),
                                         requires_grad=False)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Linear(58 * MiB)           # q, k, v, o (GQA)
        self.mlp = Linear(388 * MiB)                # gate, up, down (18944 intermediate)

    def forward(self, hidden, layer_cache, new_tokens, batch):
        # DynamicCache.update: torch.cat((past, new), dim=-2) for this layer's keys and values
        past = layer_cache[0]
        n = (past.nbytes if past is not None else 0) + new_tokens * batch * KV_PER_TOKEN_PER_LAYER
        layer_cache[0] = torch.empty(n, dtype=torch.uint8, device="cuda")
        del past
        if new_tokens > 1:                          # prefill: the MLP's gate/up activations of the prompt
            up = torch.empty(new_tokens * batch * 18944 * 2 * 2, dtype=torch.uint8, device="cuda")
            del up
        return hidden


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(VOCAB * HIDDEN * 2)
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = Linear(VOCAB * HIDDEN * 2)

    def forward(self, new_tokens, batch, cache):
        hidden = torch.empty(new_tokens * batch * HIDDEN * 2, dtype=torch.uint8, device="cuda")
        for layer, layer_cache in zip(self.layers, cache):
            hidden = layer(hidden, layer_cache, new_tokens, batch)
        # logits of the last position only (num_logits_to_keep=1), bf16
        return torch.empty(batch * VOCAB * 2, dtype=torch.uint8, device="cuda")

    def generate(self, input_len, batch, max_new_tokens, return_dict_in_generate=False, output_scores=False,
                 output_logits=False, num_beams=1):
        """transformers' GenerationMixin._sample, as far as memory goes."""
        with torch.no_grad():
            cache = [[None] for _ in range(LAYERS)]
            scores = ()
            raw_logits = ()
            new = input_len
            for step in range(max_new_tokens):
                logits = self(new, batch, cache)
                # next_token_logits = outputs.logits[:, -1, :].to(copy=True, dtype=torch.float32)
                next_token_logits = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")
                del logits
                # next_token_scores = logits_processor(input_ids, next_token_logits)  (repetition_penalty 1.05)
                next_token_scores = torch.empty(batch * VOCAB, dtype=torch.float32, device="cuda")
                if return_dict_in_generate:
                    if output_scores:
                        scores += (next_token_scores,)
                    if output_logits:
                        raw_logits += (next_token_logits,)
                del next_token_logits, next_token_scores
                new = 1
            return {"scores": scores, "logits": raw_logits}


def main():
    model = Qwen2ForCausalLM()
    model.eval()
    prompts_per_batch = 16
    for batch_idx in range(40):
        out = model.generate(384, prompts_per_batch, max_new_tokens=1024, return_dict_in_generate=True,
                             output_scores=True, output_logits=True)
        del out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
