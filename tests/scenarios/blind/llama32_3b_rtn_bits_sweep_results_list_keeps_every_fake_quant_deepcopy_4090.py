"""RTN weight-only quantization sweep of Llama-3.2-3B on a 24 GB RTX 4090: every fake-quantized copy is kept.

The real program (a notebook turned script, `sweep_rtn.py`):

    base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-3B", torch_dtype=torch.bfloat16).cuda().eval()
    results = []
    for bits, group in [(8, 128), (6, 128), (4, 128), (4, 64), (3, 128)]:
        qmodel = copy.deepcopy(base)                       # on the GPU, like base
        fake_quantize_rtn_(qmodel, bits=bits, group_size=group)   # quantize-dequantize every Linear in place
        ppl = wikitext_ppl(qmodel, test_ids, seqlen=2048, windows=40)   # under torch.no_grad()
        results.append({"bits": bits, "group": group, "ppl": ppl, "model": qmodel})
        print(f"W{bits} g{group}: ppl {ppl:.3f}")
    best = min(results, key=lambda r: r["ppl"] if r["bits"] <= 4 else float("inf"))
    run_lm_eval(best["model"], tasks=["arc_easy", "hellaswag"])   # never reached

The author keeps "model" in each result so that the best 4-bit configuration can be handed to the zero-shot
evaluation at the end without quantizing it again.  Simulated quantization keeps the weights in bf16 (the values
are quantize-dequantized), so each copy is as large as the original.

Sizes (bf16): Llama-3.2-3B has 3.21 B parameters (tied 128256 x 3072 embedding 394 M, 28 layers of 100.7 M) =
6.43 GB = 5.99 GiB.  The card: 24564 MiB (23.99 GiB), 512 MiB of it the CUDA context.  base 5.99 + copy W8 5.99 + copy W6 5.99 =
17.97 GiB live after the second configuration; the perplexity pass itself is small (batch 1 x 2048 tokens: the
bf16 logits 0.49 GiB and their float32 upcast 0.98 GiB, freed after each window).  The third deepcopy (W4 g128)
needs another 5.99 GiB: it fails part way, in copy.deepcopy, on a weight-sized request (an MLP projection,
8192 x 3072 bf16 = 48 MiB), with about 23 GiB held by live tensors, nearly all of them the weights of three models.

What an expert says first: memory grows by one whole model per configuration because `results` keeps every
quantized copy (and `qmodel` keeps the last one while the next deepcopy runs).  Keep only the numbers (or
`qmodel.cpu()` / save the state dict to disk for the best one), `del qmodel` before the next copy; then the sweep
needs base + one copy = 12 GiB.  Wrong advice: a bigger GPU (the sweep would just fail at the fifth config on a
48 GB card), loading in 8/4-bit (the point is to measure the quantization), mixed precision (already bf16),
a smaller batch or gradient checkpointing (batch 1, no training), torch.inference_mode (the evaluation already
runs under no_grad, and the failure is in deepcopy), expandable_segments (the memory is live, not fragmented).
"""
import copy
import math

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "meta-llama/Llama-3.2-3B"
HIDDEN, INTERMEDIATE, N_LAYERS, VOCAB = 3072, 8192, 28, 128256
N_HEADS, N_KV_HEADS, HEAD_DIM = 24, 8, 128
SEQLEN = 2048
EVAL_WINDOWS = 40
CONFIGS = [(8, 128), (6, 128), (4, 128), (4, 64), (3, 128)]
ITEMSIZE = {torch.bfloat16: 2, torch.float16: 2, torch.float32: 4}


def new_activation(rows, width, dtype=torch.bfloat16):
    return torch.empty(rows * width, dtype=dtype, device="cuda")


def rows_of(x, width):
    return x.nbytes // (width * ITEMSIZE[x.dtype])


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16, device="cuda"))

    def forward(self, x):
        return new_activation(rows_of(x, self.in_features), self.out_features)


class LlamaRMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.width = width
        self.weight = nn.Parameter(torch.empty(width, dtype=torch.bfloat16, device="cuda"))

    def forward(self, x):
        return new_activation(rows_of(x, self.width), self.width)


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, N_HEADS * HEAD_DIM)
        self.k_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM)
        self.v_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM)
        self.o_proj = Linear(N_HEADS * HEAD_DIM, HIDDEN)

    def forward(self, x):
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        ctx = new_activation(rows_of(q, N_HEADS * HEAD_DIM), N_HEADS * HEAD_DIM)   # sdpa output
        del q, k, v
        return self.o_proj(ctx)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        g, u = self.gate_proj(x), self.up_proj(x)
        h = new_activation(rows_of(g, INTERMEDIATE), INTERMEDIATE)     # act_fn(g) * u
        del g, u
        return self.down_proj(h)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()

    def forward(self, x):
        h = self.self_attn(self.input_layernorm(x))
        return self.mlp(self.post_attention_layernorm(h))


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = LlamaRMSNorm(HIDDEN)

    def decoder_layers(self):
        return [getattr(self.layers, str(i)) for i in range(N_LAYERS)]

    def forward(self, n_tokens):
        x = new_activation(n_tokens, HIDDEN)
        for layer in self.decoder_layers():
            x = layer(x)
        x = self.norm(x)
        logits = new_activation(n_tokens, VOCAB)             # tied lm_head
        return logits


def load_base_model():
    print("loading %s in bf16 ..." % MODEL_ID)
    model = LlamaForCausalLM()
    return model.eval()


def linear_modules(model):
    return [m for m in model.modules() if isinstance(m, Linear)]


def fake_quantize_rtn_(model, bits, group_size):
    """Round-to-nearest, asymmetric, per group: w <- dequant(quant(w)), in place, weights stay bf16."""
    qmax = 2 ** bits - 1
    for lin in linear_modules(model):
        n = lin.in_features * lin.out_features
        w = lin.weight
        scales = torch.empty(n // group_size, dtype=torch.bfloat16, device="cuda")
        zeros = torch.empty(n // group_size, dtype=torch.bfloat16, device="cuda")
        q = torch.empty(n, dtype=torch.bfloat16, device="cuda")          # (w / s + z).round().clamp(0, qmax)
        del q, scales, zeros, w                                          # result copied into lin.weight
    return qmax


def wikitext_ppl(model, seqlen, windows):
    nlls = []
    with torch.no_grad():
        for i in range(windows):
            logits = model(seqlen)
            shift = torch.empty(seqlen * VOCAB, dtype=torch.float32, device="cuda")   # logits.float()
            nll = torch.empty(1, dtype=torch.float32, device="cuda")
            nlls.append(2.3)
            del logits, shift, nll
    return math.exp(sum(nlls) / len(nlls))


def main():
    base = load_base_model()
    results = []
    for bits, group in CONFIGS:
        qmodel = copy.deepcopy(base)
        fake_quantize_rtn_(qmodel, bits=bits, group_size=group)
        ppl = wikitext_ppl(qmodel, seqlen=SEQLEN, windows=EVAL_WINDOWS)
        results.append({"bits": bits, "group": group, "ppl": ppl, "model": qmodel})
        print("W%d g%d: ppl %.3f" % (bits, group, ppl))
    best = min(results, key=lambda r: r["ppl"] if r["bits"] <= 4 else float("inf"))
    print("best 4-bit config: W%d g%d" % (best["bits"], best["group"]))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
