"""sft_lora.py -- LoRA fine-tuning of a 2.5B-parameter Gemma-style model (vocabulary 256,000) on a
24 GiB card: base weights frozen in bf16 (4.7 GiB), rank-16 adapters on every projection, AdamW on
the adapters, gradient checkpointing on, micro-batch 4 x 2048 tokens.  The model's forward, as the
transformers version in use writes it, upcasts the logits to float32 before the loss:

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.bfloat16).cuda()
    model = get_peft_model(model, LoraConfig(r=16, target_modules="all-linear"))
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)    # only the adapters require grad
    for batch in loader:
        out = model(**batch)        # inside: logits = lm_head(h).float(); loss = cross_entropy(logits, labels)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()

With 8192 tokens per micro-batch and 256k entries per token, the logits are 3.9 GiB in bf16, 7.8 GiB
once upcast, and cross_entropy's log_softmax makes another 7.8 GiB fp32 tensor: that allocation
fails in the first step, with 6.4 GiB free.  Everything else is small: weights 4.7 GiB,
checkpointed layer inputs 0.6 GiB, adapters 75 MiB (their AdamW state twice that).  Training
(adapters require grad, AdamW exists), first step, nothing cached, nothing grows, nothing else on the card.
An expert: never materialise the full fp32 logits: a fused linear + cross-entropy kernel (Liger's
fused linear cross-entropy, cut-cross-entropy) or the loss computed over chunks of tokens, or a
smaller micro-batch with more accumulation steps.  Checkpointing and bf16 are on already, the
optimizer state is negligible, LoRA is already used.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
HIDDEN, KV, FFN, LAYERS, VOCAB = 2048, 256, 16384, 18, 256000
MB, SEQ = 4, 2048
TOKENS = MB * SEQ
scen_truth.note_every_empty(torch)


# bf16 tensors: the stand-in sizes tensors in bytes and types each one by the default dtype when it is
# made, so bf16 ones are made with the default dtype set to bfloat16 (what from_pretrained(...,
# torch_dtype=torch.bfloat16) does while it builds the model); compiled as part of torch's file (as
# scen_truth's wrappers are) so that the failing Python line stays the program's.
_BF16 = """
def bf16_empty(nbytes):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return torch.empty(nbytes, device="cuda")
    finally:
        torch.set_default_dtype(prev)
"""
_ns = {"torch": torch}
exec(compile(_BF16, torch.__file__, "exec"), _ns)
bf16_empty = _ns["bf16_empty"]


def frozen(numel):
    return torch.nn.Parameter(bf16_empty(numel * 2), requires_grad=False)


def adapter(n_in, n_out):
    return (torch.nn.Parameter(torch.empty(n_in * 16 * 4, device="cuda")),        # lora_A, fp32
            torch.nn.Parameter(torch.empty(16 * n_out * 4, device="cuda")))        # lora_B


class GemmaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        shapes = {"q_proj": (HIDDEN, HIDDEN), "k_proj": (HIDDEN, KV), "v_proj": (HIDDEN, KV),
                  "o_proj": (HIDDEN, HIDDEN), "gate_proj": (HIDDEN, FFN), "up_proj": (HIDDEN, FFN),
                  "down_proj": (FFN, HIDDEN)}
        for name, (i, o) in shapes.items():
            setattr(self, name, frozen(i * o))
            a, b = adapter(i, o)
            setattr(self, name + "_lora_A", a)
            setattr(self, name + "_lora_B", b)

    def forward(self, h):
        out = bf16_empty(TOKENS * HIDDEN * 2)      # checkpointed: only the input stays
        out._saved = h
        return out


class GemmaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = frozen(VOCAB * HIDDEN)                 # tied with the LM head
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, GemmaLayer())

    def forward(self, input_ids, labels):
        h = bf16_empty(TOKENS * HIDDEN * 2)
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layers_%d" % i)(h)
        logits = bf16_empty(TOKENS * VOCAB * 2)   # lm_head(h), bf16
        logits._saved = h
        logits = upcast(logits)
        loss = cross_entropy(logits, labels)
        loss._params = tuple(p for p in self.parameters() if p.requires_grad)
        return loss


def upcast(t):
    """logits.float(): a new fp32 tensor, kept by autograd for the loss."""
    out = torch.empty(t.nbytes * 2, device="cuda")
    out._saved = t
    return out


def cross_entropy(logits, labels):
    logp = torch.empty(logits.nbytes, device="cuda")          # log_softmax over the vocabulary, fp32
    logp._saved = logits
    loss = torch.empty(512, device="cuda")
    loss._saved = logp
    return loss


def main():
    model = GemmaForCausalLM().cuda()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for step in range(3000):
        input_ids = torch.empty(TOKENS * 8, device="cuda")
        labels = torch.empty(TOKENS * 8, device="cuda")
        loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
