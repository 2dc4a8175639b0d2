"""Gradual magnitude pruning of Llama-3.2-1B during fine-tuning with torch.nn.utils.prune on an A100 40GB: the
dense warm-up runs, the first pruning step adds an fp32 mask and a recomputed fp32 weight for every Linear, and the
next training step runs out of memory.

The real program (`gmp_finetune.py`, Zhu & Gupta's cubic sparsity schedule to 50 %, masks from torch.nn.utils.prune):

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=torch.float32).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    targets = [(m, "weight") for n, m in model.named_modules() if isinstance(m, nn.Linear) and n != "lm_head"]
    for step, batch in enumerate(loader):                      # 6 x 2048 tokens
        if step >= PRUNE_START and step % PRUNE_EVERY == 0:
            for m, name in targets:
                prune.l1_unstructured(m, name, amount=increment(step))     # layer-wise magnitude
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss           # apply_liger_kernel_to_llama(): fused linear cross-entropy
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

torch.nn.utils.prune reparametrizes each pruned tensor: the Parameter `weight` becomes `weight_orig` (the same
tensor, so the optimizer goes on training it), a buffer `weight_mask` of the weight's dtype and shape (float32:
as big as the weight) is registered, and a forward pre-hook recomputes `weight = weight_orig * weight_mask` before
every forward -- a third fp32 copy, kept as a plain attribute of the module between steps and saved by autocast's
bf16 cast for backward.

Sizes: Llama-3.2-1B has 1.24 B parameters; fp32 4.60 GiB, of which the 112 Linear weights of the 16 layers are
3.63 GiB (the tied 128256 x 2048 embedding is not pruned).  AdamW's moments 9.21 GiB, gradients 4.60 GiB, the
bf16 casts of the weights under autocast 1.82 GiB.  Activations at 6 x 2048 tokens: ~0.92 GiB per layer (the MLP's
12288 x 8192 bf16 intermediates are 192 MiB each), 14.7 GiB for the 16 layers; Liger's fused linear cross-entropy
never makes the logits but computes the lm_head weight's fp32 gradient (0.98 GiB) during the forward.  Dense, the
steps peak at 35.3 GiB allocated (35.8 GiB with the 0.5 GiB context) of the card's 40 GiB.  The first pruning step
(step 25) adds the masks (3.63 GiB) and the computed weights (3.63 GiB) at once; the next forward still ends
(37.9 GiB allocated), and its backward fails while making the gradients (a 64 MiB MLP weight gradient on the
autograd thread) with 39.4 GiB allocated and 17 MiB cached.

What an expert says first: the pruning reparametrization triples the pruned weights -- keep boolean masks
(1 byte per weight) and apply them in place after each optimizer step (`w.data.mul_(mask)`; or prune.remove() right
after each pruning step and re-apply the masks to the weights and their gradients), which removes 6.3 GiB; gradient
checkpointing or a smaller micro-batch with accumulation also makes room.  Wrong advice: inference_mode or
torch.no_grad (training), expandable_segments or empty_cache (all of it is live), foreign processes, quantization
(the weights being pruned are trained in fp32 on purpose), teacher/no_grad fixes.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "meta-llama/Llama-3.2-1B"
HIDDEN, INTERMEDIATE, N_LAYERS, VOCAB = 2048, 8192, 16, 128256
N_HEADS, N_KV_HEADS, HEAD_DIM = 32, 8, 64
BATCH_SIZE, SEQ_LEN = 6, 2048
PRUNE_START, PRUNE_EVERY, FINAL_SPARSITY, PRUNE_END = 25, 25, 0.5, 500
MAX_STEPS = 2000


ITEMSIZE = {torch.float32: 4, torch.bfloat16: 2}


def new(numel, dtype=torch.float32):
    return torch.empty(numel, dtype=dtype, device="cuda")


def numel(x):
    return x.nbytes // ITEMSIZE[x.dtype]


class prune(object):
    """torch.nn.utils.prune, as far as l1_unstructured goes."""

    @staticmethod
    def l1_unstructured(module, name, amount):
        if name + "_orig" not in module._parameters:
            orig = module._parameters.pop(name)
            module.weight_orig = orig                                   # register_parameter(name + "_orig", orig)
            module._forward_pre_hooks.append(prune.apply_mask)
        orig = module.weight_orig
        importance = new(numel(orig))                                  # torch.abs(t)
        topk = new(int(numel(orig) * amount) * 8, torch.uint8)          # torch.topk(...).indices (int64)
        mask = new(numel(orig))                                        # default_mask.clone(); mask[topk] = 0
        del importance, topk
        module.register_buffer(name + "_mask", mask)
        prune.apply_mask(module)

    @staticmethod
    def apply_mask(module):
        w = new(numel(module.weight_orig))                             # weight_orig * weight_mask
        w._saved = (module.weight_orig, module._buffers["weight_mask"])
        w._params = (module.weight_orig,)
        module.__dict__["weight"] = w


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new(in_features * out_features))
        self._forward_pre_hooks = []

    def __call__(self, *args, **kwargs):
        for hook in self._forward_pre_hooks:
            hook(self)
        return nn.Module.__call__(self, *args, **kwargs)

    def forward(self, x):
        w = self.weight
        w_bf16 = new(self.in_features * self.out_features, torch.bfloat16)   # autocast's cast of the weight
        out = new(numel(x) // self.in_features * self.out_features, torch.bfloat16)
        out._saved = (x, w_bf16, w)
        return out


class LlamaRMSNorm(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(new(width))

    def forward(self, x):
        out = new(numel(x), torch.bfloat16)
        out._saved = x
        return out


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        kv = N_KV_HEADS * HEAD_DIM
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.q_proj, self.k_proj = Linear(HIDDEN, HIDDEN), Linear(HIDDEN, kv)
        self.v_proj, self.o_proj = Linear(HIDDEN, kv), Linear(HIDDEN, HIDDEN)
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.gate_proj, self.up_proj = Linear(HIDDEN, INTERMEDIATE), Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        h = self.input_layernorm(x)
        q, k, v = self.q_proj(h), self.k_proj(h), self.v_proj(h)
        attn = new(numel(q), torch.bfloat16)                     # sdpa (flash), saved with q, k, v
        attn._saved = (q, k, v)
        o = self.o_proj(attn)
        h2 = self.post_attention_layernorm(o)
        g, u = self.gate_proj(h2), self.up_proj(h2)
        act = new(numel(g), torch.bfloat16)                      # silu(g) * u
        act._saved = (g, u)
        out = self.down_proj(act)
        out._saved = (out._saved, x)
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(new(VOCAB * HIDDEN))
        self.layers = nn.Module()
        for i in range(N_LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = LlamaRMSNorm(HIDDEN)

    def forward(self, tokens):
        x = new(tokens * HIDDEN)
        for i in range(N_LAYERS):
            x = getattr(self.layers, str(i))(x)
        h = self.norm(x)
        return fused_linear_cross_entropy(h, self.embed_tokens, tokens)


def fused_linear_cross_entropy(h, lm_head_weight, tokens):
    """liger_kernel's LigerFusedLinearCrossEntropyLoss (the model is patched with apply_liger_kernel_to_llama): the
    logits are made chunk by chunk and never kept; the gradients of the input and of the lm_head weight are
    computed during the forward and kept for backward."""
    grad_weight = new(VOCAB * HIDDEN)                                  # torch.zeros_like(weight), fp32
    grad_input = new(tokens * HIDDEN, torch.bfloat16)
    chunk = -(-tokens // -(-VOCAB // HIDDEN))                          # ceil(BT / ceil(V / H))
    for start in range(0, tokens, chunk):
        logits_chunk = new(min(chunk, tokens - start) * VOCAB)         # fp32 logits of the chunk, then their grad
        del logits_chunk
    loss = new(1)
    loss._saved = (h, grad_input, grad_weight)
    loss._params = (lm_head_weight,)
    return loss


def sparsity_at(step):
    """Zhu & Gupta: s_t = s_f * (1 - (1 - (t - t0) / (n * dt)) ** 3)."""
    t = min(1.0, float(step - PRUNE_START + PRUNE_EVERY) / (PRUNE_END - PRUNE_START))
    return FINAL_SPARSITY * (1.0 - (1.0 - t) ** 3)


def main():
    model = LlamaForCausalLM()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    targets = [(m, "weight") for m in model.modules() if isinstance(m, Linear)]
    tokens = BATCH_SIZE * SEQ_LEN
    done = 0.0
    for step in range(MAX_STEPS):
        if step >= PRUNE_START and step % PRUNE_EVERY == 0 and step <= PRUNE_END:
            target = sparsity_at(step)
            amount = (target - done) / (1.0 - done)
            for m, name in targets:
                prune.l1_unstructured(m, name, amount=amount)
            done = target
            print("step %d: pruned to %.1f%% sparsity" % (step, 100 * target))
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss
        if step % 20 == 0:
            print("step %d" % step, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
