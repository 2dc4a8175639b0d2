"""Perplexity-vs-context-length sweep of a YaRN-extended Llama-2-7B on an A100 80GB: autograd left on.

The real program (eval_long_ppl.py, run after a YaRN context-extension fine-tune, scale 8 -> 32k):

    model = AutoModelForCausalLM.from_pretrained("ckpt/yarn-llama2-7b-32k", torch_dtype=torch.float16,
                                                 attn_implementation="sdpa", device_map="cuda")
    model.eval()                                  # "eval mode, so no gradients" -- it is not
    ids = tokenizer(pg19_test_book, return_tensors="pt").input_ids          # ~65k tokens
    for max_length in (4096, 8192, 16384, 32768):
        nlls = []
        for begin in range(0, ids.size(1) - max_length + 1, max_length):
            input_ids = ids[:, begin:begin + max_length].to("cuda")
            out = model(input_ids, labels=input_ids)      # no torch.no_grad() around this
            nlls.append(out.loss.item())
        print(max_length, math.exp(sum(nlls) / len(nlls)))
        torch.cuda.empty_cache()                  # "free memory between lengths"

The HF perplexity recipe wraps the forward in torch.no_grad(); this script copied it from a training
notebook's validation cell that relied on model.eval().  eval() only switches dropout off: with
autograd on, every decoder layer keeps what it would need for a backward that never comes.

Sizes (fp16, hidden 4096, MLP 11008, 32 layers, vocab 32000):
  * weights 6.74 B params = 12.6 GiB, CUDA context ~0.5 GiB;
  * activations kept per layer for backward at s tokens: the layer input, both RMSNorm outputs, v and q/k
    after RoPE, the SDPA output, o_proj and down_proj outputs, the residual sums (10 x s x 4096 x 2 B) and
    gate, SiLU(gate), up, SiLU(gate)*up (4 x s x 11008 x 2 B): 0.65 GiB at 4k, 1.3 GiB at 8k, 2.6 GiB at
    16k, 5.2 GiB at 32k;
  * 4k windows peak at ~35 GiB, 8k windows at ~57 GiB (graph + weights + fp32 logits and log-softmax):
    both pass, the graph is freed when `out` goes, and the script empties the cache between lengths;
  * the first 16k window needs 32 x 2.6 = 83 GiB of graph on top of 12.6 GiB of weights: it fails in
    the MLP of layer 26 of 32 on a 344 MiB intermediate (16384 x 11008 x 2 B), with ~79 GiB allocated
    and nothing cached.
Under torch.no_grad() a 16k window needs the weights plus ~1.5 GiB of transients, a 32k one ~3 GiB.

What an expert says first: this is an inference job run with autograd on -- wrap the loop in
torch.inference_mode() (or no_grad); model.eval() does not do it.  Wrong advice: gradient
checkpointing (there is no backward to recompute for), smaller batch (it is one sequence),
expandable_segments / empty_cache (the memory is live), shorter windows (the whole point is to measure
16k and 32k), a bigger GPU or sharding.
"""
import math

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "ckpt/yarn-llama2-7b-32k"
HIDDEN = 4096
INTERMEDIATE = 11008
NUM_LAYERS = 32
VOCAB = 32000
ROPE_SCALING = {"type": "yarn", "factor": 8.0, "original_max_position_embeddings": 4096}
EVAL_LENGTHS = (4096, 8192, 16384, 32768)
BOOK_TOKENS = 65536
BATCH_SIZE = 1


# ---- what transformers' modeling_llama builds (the stand-in torch has no nn.Linear / ModuleList) ----
class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float16))

    def forward(self, x):
        tokens = x.nbytes // (2 * self.in_features)
        out = torch.empty(tokens * self.out_features, dtype=torch.float16)
        if torch.is_grad_enabled():
            out._saved = x                  # autograd keeps the input for the weight's gradient
        return out


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden, dtype=torch.float16))

    def forward(self, x):
        out = torch.empty(x.nbytes // 2, dtype=torch.float16)
        if torch.is_grad_enabled():
            out._saved = x
        return out


class LlamaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, HIDDEN)
        self.v_proj = Linear(HIDDEN, HIDDEN)
        self.o_proj = Linear(HIDDEN, HIDDEN)
        self.rope_scaling = ROPE_SCALING

    def forward(self, hidden_states):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        # apply_rotary_pos_emb with YaRN-scaled cos/sin: new q and k
        q_rot = torch.empty(q.nbytes // 2, dtype=torch.float16)
        k_rot = torch.empty(k.nbytes // 2, dtype=torch.float16)
        # F.scaled_dot_product_attention (memory-efficient kernel): output the size of q
        attn = torch.empty(q.nbytes // 2, dtype=torch.float16)
        if torch.is_grad_enabled():
            attn._saved = (q_rot, k_rot, v)
        return self.o_proj(attn)


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        gate = self.gate_proj(x)
        act = torch.empty(gate.nbytes // 2, dtype=torch.float16)       # act_fn(gate)
        up = self.up_proj(x)
        prod = torch.empty(up.nbytes // 2, dtype=torch.float16)        # act_fn(gate) * up
        if torch.is_grad_enabled():
            act._saved = gate
            prod._saved = (act, up)
        return self.down_proj(prod)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()

    def forward(self, hidden_states):
        residual = hidden_states
        h = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = torch.empty(h.nbytes // 2, dtype=torch.float16)     # residual + h
        if torch.is_grad_enabled():
            hidden_states._saved = (residual, h)
        residual = hidden_states
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        out = torch.empty(h.nbytes // 2, dtype=torch.float16)
        if torch.is_grad_enabled():
            out._saved = (residual, h)
        return out


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float16))
        self.layers = ModuleList([LlamaDecoderLayer() for _ in range(NUM_LAYERS)])
        self.norm = LlamaRMSNorm(HIDDEN)

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8          # int64 ids
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.float16)     # embed_tokens(input_ids)
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states)
        return self.norm(hidden_states)


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, labels=None):
        hidden_states = self.model(input_ids)
        logits = self.lm_head(hidden_states)
        loss = None
        if labels is not None:
            logits32 = torch.empty(logits.nbytes // 2, dtype=torch.float32)   # logits.float()
            if torch.is_grad_enabled():
                logits32._saved = logits
            loss = nn.functional.cross_entropy(logits32, labels)
        return CausalLMOutput(loss, logits)


def from_pretrained(path):
    model = LlamaForCausalLM()           # torch_dtype=torch.float16, device_map="cuda"
    model.config_path = path
    return model


def item(t):
    """loss.item(): the stand-in computes no values."""
    return 2.0


def perplexity_at(model, book_ids_len, max_length):
    nlls = []
    for begin in range(0, book_ids_len - max_length + 1, max_length):
        input_ids = torch.empty(BATCH_SIZE * max_length * 8)   # int64 token ids .to("cuda")
        out = model(input_ids, labels=input_ids)
        nlls.append(item(out.loss))
        del out, input_ids
    return math.exp(sum(nlls) / len(nlls))


def main():
    model = from_pretrained(MODEL_ID)
    model.eval()
    results = {}
    for max_length in EVAL_LENGTHS:
        ppl = perplexity_at(model, BOOK_TOKENS, max_length)
        results[max_length] = ppl
        print("ctx %6d  ppl %.3f" % (max_length, ppl), flush=True)
        torch.cuda.empty_cache()        # "free memory between lengths"
    return results


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
