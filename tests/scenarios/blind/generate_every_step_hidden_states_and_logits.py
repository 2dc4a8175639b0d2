"""score_answers.py -- ranks candidate answers by their sequence log-probability with a 3B Llama-style
model in bf16 (6.2 GiB of weights, vocabulary 128,256) on one 24 GiB card; 32 prompts of 1,536 tokens
per batch, up to 512 new tokens each.  The script asks generate() for everything "just in case":

    out = model.generate(**batch, max_new_tokens=512, do_sample=False,
                         return_dict_in_generate=True,
                         output_scores=True,            # what the ranking needs
                         output_logits=True,            # never read
                         output_hidden_states=True)     # never read
    seq_logprob = model.compute_transition_scores(out.sequences, out.scores).sum(-1)

generate() keeps, for every step until it returns, the processed scores (32 x 128,256 fp32 = 15.7 MiB),
the raw fp32 logits (another 15.7 MiB) and the hidden states of all 29 layer outputs (5.4 MiB), besides
the KV cache (3.5 MiB a step).  The prompt pass alone leaves 8.2 GiB of hidden states (29 x 32 x 1,536
x 3,072 bf16) next to 5.25 GiB of KV cache.  Memory then climbs by about 40 MiB per new token and runs
out about a hundred tokens into the first batch, inside generate(), under no_grad.  Without the hidden
states and the logits the batch needs about 21.5 GiB (weights, KV cache, 512 steps of scores): it fits.

An expert: ask generate() only for what the job reads -- drop output_hidden_states and output_logits
(the scores alone, 15.7 MiB a step, fit; better still, record the chosen token's log-probability at each
step and keep no full-vocabulary tensor at all).  Not inference_mode (generate already runs without
autograd), not the allocator's cache or fragmentation, not quantization first (the weights are a
quarter of the card); a smaller batch would only postpone it.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
KiB = 1 << 10
scen_truth.note_every_empty(torch)

BATCH, PROMPT_LEN, HIDDEN, VOCAB, N_LAYERS = 32, 1536, 3072, 128256, 28
KV_DIM = 8 * 128                                      # grouped-query attention: 8 KV heads of 128


class DynamicCache(object):
    """past_key_values: each layer's keys and values, growing by one position a step."""

    def __init__(self):
        self.layers = [[] for _ in range(N_LAYERS)]

    def update(self, kv, layer_idx):
        self.layers[layer_idx].append(kv)         # keys and values of the new positions


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, idx):
        torch.nn.Module.__init__(self)
        self.idx = idx
        self.weight = torch.nn.Parameter(torch.empty(100 * MiB, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden, past_key_values, seq_len):
        kv = BATCH * seq_len * KV_DIM
        past_key_values.update(torch.empty(2 * kv, dtype=torch.bfloat16, device="cuda"), self.idx)
        return torch.empty(BATCH * seq_len * HIDDEN, dtype=torch.bfloat16, device="cuda")


class ModelOutput(object):
    def __init__(self, logits, past_key_values, hidden_states):
        self.logits, self.past_key_values, self.hidden_states = logits, past_key_values, hidden_states


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [LlamaDecoderLayer(i) for i in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)

    def forward(self, input_ids, past_key_values, seq_len, output_hidden_states=False):
        hidden = torch.empty(BATCH * seq_len * HIDDEN, dtype=torch.bfloat16, device="cuda")
        all_hidden = (hidden,) if output_hidden_states else None
        for layer in self.layers:
            hidden = layer(hidden, past_key_values, seq_len)
            if output_hidden_states:
                all_hidden = all_hidden + (hidden,)
        logits = torch.empty(BATCH * VOCAB, dtype=torch.bfloat16, device="cuda")     # last position only
        return ModelOutput(logits, past_key_values, all_hidden)

    def generate(self, input_ids, max_new_tokens=20, return_dict_in_generate=False, output_scores=False,
                 output_logits=False, output_hidden_states=False):
        with torch.no_grad():
            past_key_values = DynamicCache()
            scores, raw_logits, decoder_hidden_states = [], [], []
            seq_len = PROMPT_LEN
            for step in range(max_new_tokens):
                outputs = self(input_ids, past_key_values, seq_len, output_hidden_states=output_hidden_states)
                next_token_logits = torch.empty(BATCH * VOCAB, dtype=torch.float32, device="cuda")  # .float() copy
                next_token_scores = torch.empty(BATCH * VOCAB, dtype=torch.float32, device="cuda")  # processors
                if output_scores:
                    scores.append(next_token_scores)
                if output_logits:
                    raw_logits.append(next_token_logits)
                if output_hidden_states:
                    decoder_hidden_states.append(outputs.hidden_states)
                del outputs
                seq_len = 1
            return dict(sequences=input_ids, scores=tuple(scores), logits=tuple(raw_logits),
                        hidden_states=tuple(decoder_hidden_states), past_key_values=past_key_values)


def main():
    model = LlamaForCausalLM()
    model.eval()
    ranked = []
    for batch_idx in range(4):
        input_ids = torch.empty(BATCH * PROMPT_LEN * 8, device="cuda")
        out = model.generate(input_ids, max_new_tokens=512, return_dict_in_generate=True,
                             output_scores=True, output_logits=True, output_hidden_states=True)
        ranked.append(len(out["scores"]))
        del out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
