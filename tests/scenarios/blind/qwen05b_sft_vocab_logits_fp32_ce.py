"""sft_small.py -- full supervised fine-tuning of a 0.5B-parameter Qwen2-style LM (24 layers, hidden
896, vocabulary 151,936, tied embeddings; fp32 master weights, bf16 autocast, gradient
checkpointing on, AdamW) on a 24 GiB card.  "A 0.5B model is tiny", so the team packs 8 x 2048
tokens per micro-batch; the loss is computed the textbook way:

    model.gradient_checkpointing_enable()
    for batch in loader:                                             # 8 x 2048 packed tokens
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model.model(batch["input_ids"]).last_hidden_state
            logits = model.lm_head(hidden)                           # 16384 x 151936, bf16: 4.6 GiB
        loss = F.cross_entropy(logits.float().view(-1, logits.size(-1)), batch["labels"].view(-1))
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The model itself is small: weights 1.9 GiB (AdamW state 3.7 GiB once it exists), the checkpointed
layer inputs 0.7 GiB.  But with 16,384 tokens and 152k entries per token the logits are 4.6 GiB in
bf16, 9.3 GiB after .float(), and cross_entropy's log_softmax makes another 9.3 GiB float32 tensor:
that allocation fails in the first step.  The vocabulary-sized tensors are the largest of the step by
far; nothing leaks, nothing is cached, nothing else is on the card.  An expert: do not materialise
the full float32 logits: a fused linear + cross-entropy (Liger's fused linear cross-entropy,
cut-cross-entropy) or the loss over chunks of tokens; or fewer tokens per micro-batch with more
accumulation.  Checkpointing and bf16 autocast are already on; quantization, LoRA or an 8-bit
optimizer do not touch the logits.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
HIDDEN, VOCAB, LAYERS = 896, 151936, 24
TOKENS = 8 * 2048
scen_truth.note_every_empty(torch)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(7 * MiB, device="cuda"))     # q, k, v, o fp32
        self.gate_proj = torch.nn.Parameter(torch.empty(17 * MiB, device="cuda"))    # 896 x 4864 fp32
        self.up_proj = torch.nn.Parameter(torch.empty(17 * MiB, device="cuda"))
        self.down_proj = torch.nn.Parameter(torch.empty(17 * MiB, device="cuda"))

    def forward(self, h):
        out = torch.empty(TOKENS * HIDDEN * 2, device="cuda")     # checkpointed: only the layer input stays
        out._saved = h
        return out


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN * 4, device="cuda"))  # tied lm_head
        self.layers = [Qwen2DecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layers_%d" % i, l)

    def model(self, input_ids):
        h = torch.empty(TOKENS * HIDDEN * 2, device="cuda")
        h._saved = input_ids
        for l in self.layers:
            h = l(h)
        return h

    def lm_head(self, hidden):
        logits = torch.empty(TOKENS * VOCAB * 2, device="cuda")          # bf16 under autocast
        logits._saved, logits._params = hidden, tuple(self.parameters())
        return logits


def float_(t):
    """logits.float(): a new float32 tensor, kept by autograd for the loss."""
    out = torch.empty(t.nbytes * 2, device="cuda")
    out._saved, out._params = t, t._params
    return out


def cross_entropy(logits, labels):
    """F.cross_entropy: log_softmax over the vocabulary (a float32 tensor as large as its input), then
    the NLL of the labels."""
    logp = torch.empty(logits.nbytes, device="cuda")
    logp._saved, logp._params = logits, logits._params
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = logp, logits._params
    return loss


def main():
    model = Qwen2ForCausalLM().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(20000):
        input_ids = torch.empty(TOKENS * 8, device="cuda")
        labels = torch.empty(TOKENS * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            hidden = model.model(input_ids)
            logits = model.lm_head(hidden)
        loss = cross_entropy(float_(logits), labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, hidden


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
