"""embed_corpus.py -- embedding 40M passages for our search index with intfloat/e5-mistral-7b-instruct
(fp16, 13.3 GiB) on an RTX 4090 (24 GB), batch 64, max_length 512, last-token pooling.  I started from
a snippet that pooled a middle layer, kept `output_hidden_states=True` and take the last one:

    model = AutoModel.from_pretrained("intfloat/e5-mistral-7b-instruct", torch_dtype=torch.float16).cuda()
    model.eval()
    with torch.no_grad():
        for batch in loader:                                     # 64 x 512 tokens
            out = model(**batch, output_hidden_states=True)
            emb = last_token_pool(out.hidden_states[-1], batch["attention_mask"])
            emb = F.normalize(emb, dim=-1).cpu()

The first batch fails in the forward pass, in decoder layer 24 of 32, in the MLP ("Tried to allocate
896 MiB", 632 MiB free, 1.6 GiB reserved but unallocated).  The model is 13.3 GiB and there are 24 GB
-- what takes the other 10?  Is it fragmentation?

What an expert sees: output_hidden_states=True makes the model keep the embedding output and every
layer's output until the forward returns -- 33 tensors of 64 x 512 x 4096 fp16, 256 MiB each, 8.25 GiB
-- where a plain forward under no_grad holds one layer's activations at a time.  With them the batch
needs ~24.9 GiB however well packed (weights 13.3 + context + 8.25 + the last layer's MLP, ~2.9), so
the 1.6 GiB of split cache is not the cause and expandable_segments would only move the failure.  Use
out.last_hidden_state (drop output_hidden_states; or a forward hook on the one layer you need): the
batch then peaks at ~3 GiB over the weights.  A smaller batch would also fit, at a throughput cost;
the job is already fp16, already under no_grad, already on SDPA attention; no cache, fragmentation or
other-process problem.
"""
import sys

import torch
from torch import nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
HIDDEN, KV, FFN, LAYERS, VOCAB = 4096, 1024, 14336, 32, 32000


# -- the library (transformers' MistralModel, reduced to what holds memory) ---------------------------
class MistralDecoderLayer(nn.Module):
    def __init__(self, dtype):
        nn.Module.__init__(self)
        self.self_attn = nn.Parameter(torch.empty(2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV, dtype=dtype, device="cuda"))
        self.mlp = nn.Parameter(torch.empty(3 * HIDDEN * FFN, dtype=dtype, device="cuda"))
        self.norms = nn.Parameter(torch.empty(2 * HIDDEN, dtype=dtype, device="cuda"))

    def forward(self, hidden_states, tokens):
        qkv = torch.empty(tokens * (HIDDEN + 2 * KV) * 2, device="cuda")
        attn_output = torch.empty(tokens * HIDDEN * 2, device="cuda")         # SDPA: no score matrix
        del qkv
        gate = torch.empty(tokens * FFN * 2, device="cuda")
        up = torch.empty(tokens * FFN * 2, device="cuda")
        act = torch.empty(tokens * FFN * 2, device="cuda")                    # silu(gate) * up
        del gate, up
        down = torch.empty(tokens * HIDDEN * 2, device="cuda")
        del act, attn_output
        return down


class BaseModelOutputWithPast(object):
    def __init__(self, last_hidden_state, hidden_states):
        self.last_hidden_state = last_hidden_state
        self.hidden_states = hidden_states


class MistralModel(nn.Module):
    def __init__(self, dtype=torch.float32):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=dtype, device="cuda"))
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer(dtype)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=dtype, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=torch.float32):
        return cls(torch_dtype)

    def forward(self, input_ids, attention_mask=None, output_hidden_states=False):
        tokens = input_ids.nbytes // 8
        hidden_states = torch.empty(tokens * HIDDEN * 2, device="cuda")
        all_hidden_states = () if output_hidden_states else None
        for decoder_layer in self.layers:
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            hidden_states = decoder_layer(hidden_states, tokens)
        hidden_states_normed = torch.empty(tokens * HIDDEN * 2, device="cuda")
        del hidden_states
        if output_hidden_states:
            all_hidden_states += (hidden_states_normed,)
        return BaseModelOutputWithPast(hidden_states_normed, all_hidden_states)


AutoModel = MistralModel


# -- the job -----------------------------------------------------------------------------------------
def last_token_pool(last_hidden_states, attention_mask):
    return last_hidden_states.view()


def loader(batch_size=64, max_length=512):
    for _ in range(625000):
        yield {"input_ids": torch.empty(batch_size * max_length * 8, device="cuda"),
               "attention_mask": torch.empty(batch_size * max_length * 8, device="cuda")}


def main():
    model = AutoModel.from_pretrained("intfloat/e5-mistral-7b-instruct", torch_dtype=torch.float16).cuda()
    model.eval()
    batch_size = 64
    done = 0
    with torch.no_grad():
        for batch in loader(batch_size=batch_size):
            out = model(**batch, output_hidden_states=True)
            emb = last_token_pool(out.hidden_states[-1], batch["attention_mask"])
            done += batch_size
            del out, emb
    return done


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
