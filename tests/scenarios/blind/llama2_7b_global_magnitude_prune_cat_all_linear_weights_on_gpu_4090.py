"""One-shot global magnitude pruning baseline (50% unstructured) of Llama-2-7B, on a 24 GB RTX 4090,
for a compression paper's table ("magnitude vs Wanda vs SparseGPT").

The real script (prune_magnitude_global.py, transformers 4.44):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-7b-hf", torch_dtype=torch.float16,
                                                 device_map="cuda")
    print("dense ppl", eval_ppl(model, wikitext2_test, seqlen=4096))
    linears = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    with torch.no_grad():
        # torch.quantile refuses inputs above 16M elements, so: one flat vector and kthvalue
        scores = torch.nn.utils.parameters_to_vector(m.weight for m in linears).abs_()
        threshold = torch.kthvalue(scores.float(), int(0.5 * scores.numel())).values
        for m in linears:
            m.weight[m.weight.abs() <= threshold] = 0
    print("pruned ppl", eval_ppl(model, wikitext2_test, seqlen=4096))

Sizes: the 32 decoder layers hold 6.48B linear weights (4 x 4096^2 + 3 x 4096 x 11008 per layer) = 12.06 GiB
in fp16; embed_tokens and lm_head 2 x 32000 x 4096 x 2 B = 0.49 GiB; CUDA context 0.5 GiB: 13.05 GiB of
the card's 23.99 GiB.  The dense perplexity pass (batch 1 x 4096 tokens, no_grad) runs fine and leaves
only cached blocks.  parameters_to_vector then torch.cat's every linear weight into one flat fp16 vector:
"Tried to allocate 12.06 GiB" with 10.9 GiB free -> torch.OutOfMemoryError on that line.  (Had it fit,
scores.float() would ask for 24 GiB more and kthvalue for a sort buffer on top.)

What an expert says first: the global score vector is a second full copy of the model's linear weights
(and in fp32 a double one); it cannot sit beside the model on a 24 GB card.  Find the global threshold
without materialising it: a histogram of |w| accumulated layer by layer (torch.histc per weight), or the
quantile of a random sample of ~10M weights, or compute it on the CPU (weights are 12 GiB of RAM); then
prune layer by layer on the GPU.
Wrong advice: smaller batch, shorter sequences, gradient checkpointing, flash-attention, mixed precision
(no forward is running; already fp16), expandable_segments/empty_cache (the free memory is simply too
small), 8-bit optimizer/LoRA/ZeRO (no training).
"""
import scen_truth
import torch
from torch import nn
from torch.nn import functional as F

scen_truth.note_every_empty(torch)

MODEL = "meta-llama/Llama-2-7b-hf"
HIDDEN, INTERMEDIATE, N_LAYERS, VOCAB = 4096, 11008, 32, 32000
SEQLEN = 4096
SPARSITY = 0.5


def new_tensor(n, dtype=torch.float16):
    return torch.empty(n, dtype=dtype, device="cuda")


# ---- transformers' Llama, as far as memory goes ----------------------------------------------------------
class Linear(nn.Module):
    """nn.Linear(in, out, bias=False) in fp16."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new_tensor(in_features * out_features))

    def forward(self, x, tokens):
        return new_tensor(tokens * self.out_features)


class LlamaRMSNorm(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(new_tensor(HIDDEN))

    def forward(self, x, tokens):
        return new_tensor(tokens * HIDDEN)


class LlamaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, HIDDEN)
        self.v_proj = Linear(HIDDEN, HIDDEN)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, h, tokens):
        q, k, v = self.q_proj(h, tokens), self.k_proj(h, tokens), self.v_proj(h, tokens)
        attn = new_tensor(tokens * HIDDEN)               # sdpa (flash kernel)
        return self.o_proj(attn, tokens)


class LlamaMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, h, tokens):
        g, u = self.gate_proj(h, tokens), self.up_proj(h, tokens)
        return self.down_proj(new_tensor(tokens * INTERMEDIATE), tokens)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm()
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm()
        self.mlp = LlamaMLP()

    def forward(self, x, tokens):
        h = self.self_attn(self.input_layernorm(x, tokens), tokens)
        x = new_tensor(tokens * HIDDEN)
        h = self.mlp(self.post_attention_layernorm(x, tokens), tokens)
        return new_tensor(tokens * HIDDEN)


class Embedding(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(new_tensor(VOCAB * HIDDEN))

    def forward(self, ids, tokens):
        return new_tensor(tokens * HIDDEN)


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding()
        for i in range(N_LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.norm = LlamaRMSNorm()

    def forward(self, ids, tokens):
        h = self.embed_tokens(ids, tokens)
        for i in range(N_LAYERS):
            h = getattr(self, "layers_%d" % i)(h, tokens)
        return self.norm(h, tokens)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, ids, tokens):
        h = self.model(ids, tokens)
        return self.lm_head(h, tokens)

    def named_modules(self):
        out, todo = [], [("", self)]
        while todo:
            prefix, m = todo.pop(0)
            out.append((prefix, m))
            for k, child in m._modules.items():
                todo.append(((prefix + "." + k) if prefix else k, child))
        return out


def from_pretrained(name, torch_dtype, device_map):
    return LlamaForCausalLM()


# ---- the script --------------------------------------------------------------------------------------------
def parameters_to_vector(parameters):
    """torch.nn.utils.parameters_to_vector: torch.cat of every parameter viewed as 1-D (one new tensor)."""
    parameters = list(parameters)
    return new_tensor(sum(p.nbytes for p in parameters) // 2)


def eval_ppl(model, n_batches, seqlen):
    nlls = []
    with torch.no_grad():
        for i in range(n_batches):
            ids = torch.empty(seqlen * 8, device="cuda")       # input_ids, int64
            logits = model(ids, seqlen)
            logits32 = torch.empty(logits.nbytes * 2, device="cuda")   # logits.float()
            loss = F.cross_entropy(logits32, ids)
            nlls.append(float(0.0))                            # loss.item()
            del logits, logits32, loss, ids
    return 5.47


def global_magnitude_prune(model, sparsity):
    linears = [m for n, m in model.named_modules() if isinstance(m, Linear) and n != "lm_head"]
    with torch.no_grad():
        # torch.quantile refuses inputs above 16M elements, so: one flat vector and kthvalue
        scores = parameters_to_vector(m.weight for m in linears)
        threshold = torch.empty(scores.nbytes * 2, device="cuda")     # scores.abs_().float() for kthvalue
        for m in linears:
            mask = torch.empty(m.weight.nbytes // 2, dtype=torch.uint8, device="cuda")
            del mask
    return threshold


def main():
    model = from_pretrained(MODEL, torch_dtype=torch.float16, device_map="cuda")
    print("dense ppl", eval_ppl(model, n_batches=4, seqlen=SEQLEN))
    global_magnitude_prune(model, SPARSITY)
    print("pruned ppl", eval_ppl(model, n_batches=4, seqlen=SEQLEN))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
