"""summarize.py -- a freelance paralegal runs Llama-3.1-8B-Instruct locally on a gaming laptop (Lenovo Legion,
GeForce RTX 4060 Laptop GPU with 8 GB, 32 GB of RAM, Ubuntu 24.04) to summarize documents she may not upload
anywhere.  She followed a "run Llama 3 on 8 GB" blog post: 4-bit NF4 with bitsandbytes, batch 1, SDPA attention:

    bnb = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4", bnb_4bit_use_double_quant=True,
                             bnb_4bit_compute_dtype=torch.bfloat16)
    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", quantization_config=bnb,
                                                 device_map="cuda:0", attn_implementation="sdpa")
    ids = tok.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt").to("cuda")
    out = model.generate(ids, max_new_tokens=800, do_sample=False)

The model takes 5.3 GiB (4-bit linear layers, with the embedding and the lm_head in bf16).  E-mails and two-page
letters (under 2,000 tokens) summarize fine.  A 31-page tenancy agreement, 8,200 tokens with the instructions,
fails in the prefill, in the MLP of the first decoder layer: "Tried to allocate 224.22 MiB" (gate_proj's
[8200, 14336] bf16 output) with 208 MiB free.

What she does not see: when she installed the NVIDIA driver, the PRIME profile was left on "performance"
(prime-select nvidia), so the whole desktop renders on the RTX 4060, not on the Intel iGPU: nvidia-smi lists
/usr/lib/xorg/Xorg (486 MiB), gnome-shell (212 MiB), Firefox's GPU process (690 MiB: a YouTube tab and a web
mail client with hardware acceleration), VS Code (118 MiB) and Slack (64 MiB): 1.5 GiB of the 8 GB card held by
other processes.  The summarizer itself holds 6.3 GiB with its CUDA context.  Alone on the card, the
8,200-token prefill (1 GiB of KV cache for 32 layers, under 1 GiB of transient MLP activations and dequantized
weights) fits in the 2.35 GiB that would be free after loading.

An expert, after one look at nvidia-smi: the memory is in other processes.  Switch the laptop to on-demand PRIME
(sudo prime-select on-demand, log out and in: the desktop moves to the iGPU and the dGPU is left to CUDA), or at
least close Firefox / turn off its hardware acceleration, then rerun.  Wrong first advice: a bigger GPU or a
cloud model (the point is to keep the documents local, and the job fits this card), more quantization (already
4-bit), CPU offload (device_map with CPU layers: an 8B model at a few tokens per second, for nothing), a smaller
batch (it is 1), inference_mode (generate already runs without autograd), empty_cache or expandable_segments
(this process caches almost nothing), restarting the script (the desktop keeps its memory), truncating the
contract to a shorter context (it loses the clauses she needs summarized), anything about training.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gap: bitsandbytes' Linear4bit and torch.nn.Embedding / LlamaRMSNorm (C++ / CUDA kernels: their outputs
# are made inside the libraries).  Compiled as part of torch's file so that the failing Python line stays the
# program's own (the model's forward), as in a real traceback.
_NN = """
class Linear4bit(torch.nn.Module):
    '''bitsandbytes.nn.Linear4bit (NF4, double quantization): the weight packed two values a byte, plus the
    quantization state; a prefill of many tokens dequantizes the weight to the compute dtype for the matmul.'''
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        n = in_features * out_features
        self.weight = torch.nn.Parameter(torch.empty(n // 2, dtype=torch.uint8, device="cuda"), requires_grad=False)
        self.quant_state = torch.empty(n // 64 + n // (64 * 256) * 4, dtype=torch.uint8, device="cuda")
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x, tokens):
        w = torch.empty(self.in_features * self.out_features, dtype=torch.bfloat16, device="cuda")  # dequantize_4bit
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        del w
        return out


class Embedding(torch.nn.Module):
    def __init__(self, num, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(num * d, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
        self.d = d

    def forward(self, ids, tokens):
        return torch.empty(tokens * self.d, dtype=torch.bfloat16, device="cuda")


class RMSNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
        self.d = d

    def forward(self, x, tokens):
        return torch.empty(tokens * self.d, dtype=torch.bfloat16, device="cuda")


def bf16(n):
    return torch.empty(n, dtype=torch.bfloat16, device="cuda")
"""
_ns = {"torch": torch}
exec(compile(_NN, torch.__file__, "exec"), _ns)
Linear4bit, Embedding, RMSNorm, _bf16 = _ns["Linear4bit"], _ns["Embedding"], _ns["RMSNorm"], _ns["bf16"]
# ----

GiB = 1 << 30
MiB = 1 << 20


class DynamicCache(object):
    """transformers' DynamicCache: each layer's keys and values, grown as tokens come."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, k, v, layer_idx):
        self.key_cache.append(k)
        self.value_cache.append(v)
        return k, v


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, d=4096, kv=1024, ff=14336):
        torch.nn.Module.__init__(self)
        self.input_layernorm = RMSNorm(d)
        self.q_proj = Linear4bit(d, d)
        self.k_proj = Linear4bit(d, kv)
        self.v_proj = Linear4bit(d, kv)
        self.o_proj = Linear4bit(d, d)
        self.post_attention_layernorm = RMSNorm(d)
        self.gate_proj = Linear4bit(d, ff)
        self.up_proj = Linear4bit(d, ff)
        self.down_proj = Linear4bit(ff, d)
        self.d, self.kv = d, kv

    def forward(self, hidden, n, cache, idx):
        h = self.input_layernorm(hidden, n)
        q = self.q_proj(h, n)
        k = self.k_proj(h, n)
        v = self.v_proj(h, n)
        q_rot, k_rot = _bf16(n * self.d), _bf16(n * self.kv)       # apply_rotary_pos_emb
        del q, k
        k_rot, v = cache.update(k_rot, v, idx)
        attn = _bf16(n * self.d)                                    # F.scaled_dot_product_attention (GQA, causal)
        del q_rot, h
        o = self.o_proj(attn, n)
        del attn
        hidden = _bf16(n * self.d)                                  # residual
        del o
        h = self.post_attention_layernorm(hidden, n)
        # LlamaMLP: self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))
        gate = self.gate_proj(h, n)
        act = _bf16(n * 14336)                                     # silu
        del gate
        up = self.up_proj(h, n)
        prod = _bf16(n * 14336)
        del act, up
        mlp = self.down_proj(prod, n)
        del prod
        out = _bf16(n * self.d)
        del mlp, hidden
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, layers=32, vocab=128256, d=4096):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(vocab, d)
        for i in range(layers):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.norm = RMSNorm(d)
        self.lm_head = Embedding(vocab, d)     # bf16 [128256, 4096], not quantized (llm_int8_skip_modules)
        self.num_layers, self.vocab = layers, vocab

    def forward(self, input_ids, n, cache):
        hidden = self.embed_tokens(input_ids, n)
        for i in range(self.num_layers):
            hidden = getattr(self, "layers_%d" % i)(hidden, n, cache, i)
        last = self.norm(hidden, 1)
        return torch.empty(self.vocab, dtype=torch.float32, device="cuda")   # logits of the last token

    def generate(self, input_ids, n_prompt, max_new_tokens=800):
        """GenerationMixin.generate: runs under torch.no_grad(); the prefill, then one token at a time."""
        with torch.no_grad():
            cache = DynamicCache()
            logits = self.forward(input_ids, n_prompt, cache)
            return logits, cache


def load_model():
    # AutoModelForCausalLM.from_pretrained(..., quantization_config=bnb, device_map="cuda:0")
    model = LlamaForCausalLM()
    model.eval()
    return model


DOCUMENTS = [
    ("inbox/2024-11-03_landlord_email.eml", 1430),
    ("inbox/deposit_dispute_letter.pdf", 1890),
    ("contracts/tenancy_agreement_31p.pdf", 8200),
]


def main():
    model = load_model()
    print("Llama-3.1-8B-Instruct (nf4): %.2f GiB on cuda:0, %.2f GiB free on the card" % (
        torch.cuda.memory_allocated() / GiB, torch.cuda.mem_get_info()[0] / GiB))
    for path, n_tokens in DOCUMENTS:
        ids = torch.empty(n_tokens * 8, device="cuda")    # apply_chat_template(...).to("cuda"): int64 ids
        logits, cache = model.generate(ids, n_tokens, max_new_tokens=800)
        print("%s: %d prompt tokens, summarized" % (path, n_tokens))
        del logits, cache, ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
