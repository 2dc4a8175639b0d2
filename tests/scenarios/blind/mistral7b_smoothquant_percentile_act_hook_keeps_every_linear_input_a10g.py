"""Activation statistics for a W8A8 (SmoothQuant-style) export of Mistral-7B-Instruct-v0.3, on an AWS g5
(one NVIDIA A10G, 24 GB, 22.5 GiB usable).

SmoothQuant's own get_act_scales() keeps one running per-channel max per nn.Linear.  The user wanted
99.9th-percentile scales instead of the max ("outliers blow up the int8 range"), so they changed the hook
to keep the activations and compute the percentile at the end.  The real script (act_stats.py):

    act_dict = defaultdict(list)

    def stat_input_hook(m, x, y, name):
        if isinstance(x, tuple):
            x = x[0]
        act_dict[name].append(x.detach().view(-1, x.shape[-1]))      # percentile later

    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3",
                                                 torch_dtype=torch.bfloat16, device_map="cuda")
    for name, m in model.named_modules():
        if isinstance(m, nn.Linear):
            m.register_forward_hook(functools.partial(stat_input_hook, name=name))
    with torch.no_grad():
        for i in tqdm(range(512)):                                    # pile-val, 512 tokens each
            input_ids = tokenizer(texts[i], return_tensors="pt", max_length=512,
                                  truncation=True).input_ids.to("cuda")
            model(input_ids)
    act_scales = {k: torch.quantile(torch.cat(v).abs().float(), 0.999, dim=0) for k, v in act_dict.items()}

Sizes: the model in bf16 is 13.5 GiB (6.98B linear weights + 2 x 32000 x 4096 embeddings), plus 0.5 GiB of
CUDA context: 8.5 GiB left.  Each 512-token sample makes the hooks keep, per decoder layer, the
input_layernorm output (4 MiB, shared by the q/k/v hooks: the views have one storage), the attention
output (o_proj input, 4 MiB), the post_attention_layernorm output (gate/up input, 4 MiB) and the
act(gate)*up product (down_proj input, 512 x 14336 x 2 B = 14 MiB): 26 MiB x 32 layers + the lm_head input
= about 836 MiB per sample, kept for good in act_dict.  Memory rises by that much every iteration and
the 10th sample (i = 9) of 512 fails: a 14 MiB MLP activation inside the forward, with
21.4 GiB allocated, 8 MiB free and 0.6 GiB of small holes in partly used cache segments.  A batch of one
512-token sample needs only tens of MiB of activations; nothing about the model or the batch is too big.

What an expert says first: the hook keeps every Linear's full input of every calibration sample;
512 samples would need ~420 GiB.  Reduce inside the hook (running per-channel abs max as SmoothQuant does,
or a per-channel histogram / a fixed-size reservoir for the percentile), or move what must be kept to
the CPU (x.detach().cpu(), after subsampling rows).
Wrong advice: smaller batch or shorter sequences (batch 1 of 512 tokens already), quantizing the model or
a bigger GPU, gradient checkpointing / mixed precision / flash-attention, expandable_segments or
empty_cache (live tensors), inference_mode (already no_grad).
"""
import collections
import functools

import scen_truth
import torch
from torch import nn

scen_truth.note_every_empty(torch)

MODEL = "mistralai/Mistral-7B-Instruct-v0.3"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 4096, 14336, 1024, 32, 32768
NUM_SAMPLES, SEQ_LEN = 512, 512

act_dict = collections.defaultdict(list)


def new_tensor(shape, dtype=torch.bfloat16):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


def view(t, *shape):
    """t.view(*shape): the same storage (the stand-in keeps the shape it was asked for beside it)."""
    v = t.view(*shape)
    v.shape = shape
    return v


# ---- transformers' Mistral modules, as far as memory goes -----------------------------------------------
class HookedModule(nn.Module):
    """nn.Module with register_forward_hook, as torch.nn.Module has it."""

    def __init__(self):
        nn.Module.__init__(self)
        object.__setattr__(self, "_forward_hooks", [])

    def register_forward_hook(self, hook):
        self._forward_hooks.append(hook)

    def __call__(self, *args, **kwargs):
        out = nn.Module.__call__(self, *args, **kwargs)
        for hook in self._forward_hooks:
            hook(self, args, out)
        return out

    def named_modules(self, prefix=""):
        yield prefix, self
        for k, child in self._modules.items():
            for item in child.named_modules((prefix + "." + k) if prefix else k):
                yield item


class Linear(HookedModule):
    def __init__(self, in_features, out_features):
        HookedModule.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new_tensor((out_features, in_features)))

    def forward(self, x):
        return new_tensor(x.shape[:-1] + (self.out_features,))


class MistralRMSNorm(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.weight = nn.Parameter(new_tensor((HIDDEN,)))

    def forward(self, x):
        return new_tensor(x.shape)


class MistralAttention(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, h):
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        q, k = new_tensor(q.shape), new_tensor(k.shape)          # rotary embeddings
        attn_output = new_tensor(q.shape)                        # sdpa
        return self.o_proj(attn_output)


class MistralMLP(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        gate, up = self.gate_proj(x), self.up_proj(x)
        return self.down_proj(new_tensor(gate.shape))           # act_fn(gate) * up


class MistralDecoderLayer(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.input_layernorm = MistralRMSNorm()
        self.self_attn = MistralAttention()
        self.post_attention_layernorm = MistralRMSNorm()
        self.mlp = MistralMLP()

    def forward(self, hidden_states):
        h = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = new_tensor(hidden_states.shape)         # residual + h
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        return new_tensor(hidden_states.shape)                  # residual + h


class Embedding(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.weight = nn.Parameter(new_tensor((VOCAB, HIDDEN)))

    def forward(self, ids):
        return new_tensor(ids.shape + (HIDDEN,))


class Layers(HookedModule):
    def __init__(self, n):
        HookedModule.__init__(self)
        for i in range(n):
            setattr(self, str(i), MistralDecoderLayer())


class MistralModel(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.embed_tokens = Embedding()
        self.layers = Layers(N_LAYERS)
        self.norm = MistralRMSNorm()

    def forward(self, input_ids):
        h = self.embed_tokens(input_ids)
        for layer in self.layers._modules.values():
            h = layer(h)
        return self.norm(h)


class MistralForCausalLM(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.model = MistralModel()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids):
        return self.lm_head(self.model(input_ids))


def from_pretrained(name, torch_dtype, device_map):
    return MistralForCausalLM()


# ---- act_stats.py ------------------------------------------------------------------------------------------
def stat_input_hook(m, x, y, name):
    if isinstance(x, tuple):
        x = x[0]
    act_dict[name].append(view(x.detach(), -1, x.shape[-1]))      # percentile later


def load_calibration_texts(n):
    return ["pile-val document %d" % i for i in range(n)]


def tokenize(text, max_length):
    return new_tensor((1, max_length), dtype=torch.float32)        # input_ids (int64 in torch)


def collect_act_stats(model, texts):
    with torch.no_grad():
        for i in range(NUM_SAMPLES):
            input_ids = tokenize(texts[i], max_length=SEQ_LEN)
            model(input_ids)
    return {k: None for k in act_dict}


def main():
    model = from_pretrained(MODEL, torch_dtype=torch.bfloat16, device_map="cuda")
    for name, m in model.named_modules():
        if isinstance(m, Linear):
            m.register_forward_hook(functools.partial(stat_input_hook, name=name))
    texts = load_calibration_texts(NUM_SAMPLES)
    act_scales = collect_act_stats(model, texts)
    torch.save(act_scales, "act_scales/mistral-7b-p999.pt")


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
