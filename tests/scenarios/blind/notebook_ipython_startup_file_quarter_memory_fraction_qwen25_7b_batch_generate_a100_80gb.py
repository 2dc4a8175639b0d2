"""JupyterHub on a lab's shared A100 80 GB: an IPython profile startup file that every kernel runs silently sets
torch.cuda.set_per_process_memory_fraction(0.25); a student's batched Qwen2.5-7B evaluation needs ~29 GiB,
so its first generate() fails at the 20 GiB cap while the card has 48 GiB free.

The setup and the notebook, with real libraries:

    ~/.ipython/profile_default/startup/00-gpu-share.py   (put in the hub's user image by the lab admin;
                                                          IPython runs it in every kernel before cell 1)
         import torch
         if torch.cuda.is_available():
             torch.cuda.set_per_process_memory_fraction(0.25)   # 4 students per A100, no MIG
    [2]  model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype="auto",
                                                      device_map="cuda")
         tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-7B-Instruct", padding_side="left")
    [3]  prompts = [few_shot_prompt(q) for q in medqa["test"]]            # 1,273 questions, ~1,150 tokens each
    [4]  answers = []
         for i in range(0, len(prompts), 64):
             batch = tok(prompts[i:i + 64], return_tensors="pt", padding=True).to("cuda")
             with torch.inference_mode():
                 out = model.generate(**batch, max_new_tokens=512, do_sample=False)
             answers += tok.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)
         -> OutOfMemoryError in the prefill of the first batch: "... 20.00 GiB allowed ..."

What happens.  PyTorch's caching allocator refuses, by itself, any segment that would take its reservation
past fraction x total = 20 GiB; no cudaMalloc fails and nvidia-smi shows the card 60% empty (two other
students' kernels hold 12.5 GiB, this one 19 GiB).  Nothing in the notebook mentions the fraction; only the
error's "20.00 GiB allowed" does.

Sizes (bf16): Qwen2.5-7B-Instruct 7.62 B parameters = 14.2 GiB.  First batch: 64 prompts padded to 1,152
tokens.  Prefill, per layer: hidden states 64 x 1152 x 3584 x 2 B = 504 MiB, the MLP's gate/act/up/product
64 x 1152 x 18944 x 2 B = 2.60 GiB each (three alive at once), K and V 144 MiB per layer kept (3.9 GiB for
28 layers, 5.7 GiB once 512 tokens are decoded).  Without the cap the run peaks at 27.4 GiB allocated,
29.5 GiB reserved: it fits beside the others' 12.5 GiB.  Under the 20 GiB cap it fails in the first decoder
layer's MLP, asking for 2.60 GiB with 18.4 GiB allocated and 0.1 GiB cached.

What an expert says first: the limit is the kernel's memory fraction, not the GPU: raise it for this notebook
(`torch.cuda.set_per_process_memory_fraction(0.4)` in the first cell, after agreeing with the lab, or ask the
admin for a bigger share); to stay inside the quarter instead, generate 16 prompts at a time (~18 GiB).
Wrong advice: a bigger GPU (48 GiB are free on this one), stopping the other students' kernels (they are not
what failed), quantizing the model or offloading it, empty_cache / expandable_segments, inference_mode (already
on), autocast or gradient checkpointing (no training).
"""
import sys
import traceback

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN, INTERMEDIATE, LAYERS, KV_DIM, VOCAB = 3584, 18944, 28, 512, 152064
GEN_BATCH, MAX_NEW_TOKENS = 64, 512


def ipython_profile_startup():
    """~/.ipython/profile_default/startup/00-gpu-share.py, which IPython runs in the kernel before any cell."""
    if torch.cuda.is_available():
        torch.cuda.set_per_process_memory_fraction(0.25)   # 4 students per A100, no MIG


def _t(numel):
    """A bf16 tensor of numel elements on the GPU: an operation's output (the stand-in computes nothing)."""
    return torch.empty(int(numel), dtype=torch.bfloat16)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=False):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.bfloat16))

    def forward(self, x, tokens):
        return _t(tokens * self.out_features)


class Embedding(nn.Module):
    def __init__(self, num, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.bfloat16))

    def forward(self, ids, tokens):
        return _t(tokens * HIDDEN)


class Qwen2RMSNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.bfloat16))

    def forward(self, x, tokens):
        return _t(tokens * HIDDEN)


class ModuleList(nn.Module):
    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class DynamicCache(object):
    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v):
        self.key_cache.append(k)
        self.value_cache.append(v)


class Qwen2Attention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN, bias=True)
        self.k_proj = Linear(HIDDEN, KV_DIM, bias=True)
        self.v_proj = Linear(HIDDEN, KV_DIM, bias=True)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, tokens, cache):
        q = self.q_proj(x, tokens)
        cache.update(self.k_proj(x, tokens), self.v_proj(x, tokens))
        attn = _t(tokens * HIDDEN)                     # sdpa
        del q
        return self.o_proj(attn, tokens)


class Qwen2MLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x, tokens):
        # self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        gate = self.gate_proj(x, tokens)
        act = _t(tokens * INTERMEDIATE)
        del gate
        up = self.up_proj(x, tokens)
        h = _t(tokens * INTERMEDIATE)
        del act, up
        return self.down_proj(h, tokens)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = Qwen2Attention()
        self.mlp = Qwen2MLP()
        self.input_layernorm = Qwen2RMSNorm(HIDDEN)
        self.post_attention_layernorm = Qwen2RMSNorm(HIDDEN)

    def forward(self, x, tokens, cache):
        a = self.self_attn(self.input_layernorm(x, tokens), tokens, cache)
        x = _t(tokens * HIDDEN)                        # residual
        del a
        m = self.mlp(self.post_attention_layernorm(x, tokens), tokens)
        out = _t(tokens * HIDDEN)                      # residual
        del m
        return out


class Qwen2Model(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(VOCAB, HIDDEN)
        self.layers = ModuleList([Qwen2DecoderLayer() for _ in range(LAYERS)])
        self.norm = Qwen2RMSNorm(HIDDEN)

    def forward(self, input_ids, tokens, cache):
        x = self.embed_tokens(input_ids, tokens)
        for layer in self.layers:
            x = layer(x, tokens, cache)
        return self.norm(x, tokens)


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = Qwen2Model()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, attention_mask=None, past_key_values=None):
        tokens = input_ids.nbytes // 8
        h = self.model(input_ids, tokens, past_key_values)
        batch = input_ids.shape[0]
        return self.lm_head(h, batch)                  # logits of the last position only (logits_to_keep=1)

    def generate(self, input_ids, attention_mask=None, max_new_tokens=20, do_sample=False):
        cache = DynamicCache()
        self(input_ids, attention_mask=attention_mask, past_key_values=cache)     # prefill
        batch, prompt_len = input_ids.shape
        sequences = torch.empty(batch * (prompt_len + max_new_tokens) * 8)
        return sequences                                                          # (decoding not reached)


def from_pretrained(name, torch_dtype="auto", device_map="cuda"):
    """AutoModelForCausalLM.from_pretrained: bf16 (the checkpoint's dtype), loaded tensor by tensor onto the GPU."""
    return Qwen2ForCausalLM()


class BatchEncoding(dict):
    def to(self, device):
        return self


def tokenize(prompts, padded_len):
    """tok(prompts, return_tensors="pt", padding=True).to("cuda"): int64 ids and mask, padded to the longest."""
    ids = torch.empty(len(prompts) * padded_len * 8)
    ids.shape = (len(prompts), padded_len)
    mask = torch.empty(len(prompts) * padded_len * 8)
    mask.shape = (len(prompts), padded_len)
    return BatchEncoding(input_ids=ids, attention_mask=mask)


class NotebookShell(object):
    """IPython around each cell: the last expression's value goes to Out[n] and _; an exception is shown and
    kept in sys.last_*.  stop=True: the error ends the run (as `jupyter nbconvert --execute`)."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})

    def run_cell(self, cell, stop=False):
        self.execution_count += 1
        try:
            result = cell()
        except Exception:
            etype, value, tb = sys.exc_info()
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            traceback.print_exception(etype, value, tb, limit=3, file=sys.stderr)
            if stop:
                raise
            return None
        if result is not None:
            print("Out[%d]: %r" % (self.execution_count, result))
            self.user_ns["Out"][self.execution_count] = result
            self.user_ns["_"] = result
        return result


# ---- the notebook's cells --------------------------------------------------------------------------
model = prompts = answers = None
PROMPT_LENGTHS = [1152, 1098, 1131, 1104, 1149, 1087, 1120, 1143, 1079, 1116]   # padded length of each batch


def cell_2_load():
    global model
    model = from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype="auto", device_map="cuda")


def cell_3_prompts():
    global prompts
    prompts = ["few-shot MedQA prompt %d" % i for i in range(1273)]
    return len(prompts)


def cell_4_generate():
    global answers
    answers = []
    for b, i in enumerate(range(0, len(prompts), GEN_BATCH)):
        batch = tokenize(prompts[i:i + GEN_BATCH], PROMPT_LENGTHS[b % len(PROMPT_LENGTHS)]).to("cuda")
        with torch.inference_mode():
            out = model.generate(**batch, max_new_tokens=MAX_NEW_TOKENS, do_sample=False)
        answers += ["answer"] * len(prompts[i:i + GEN_BATCH])
        del out


def main():
    ipython_profile_startup()                # the kernel starts: IPython runs the profile's startup files
    shell = NotebookShell(globals())
    shell.run_cell(lambda: None)             # [1] imports
    shell.run_cell(cell_2_load)
    shell.run_cell(cell_3_prompts)
    shell.run_cell(cell_4_generate, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
