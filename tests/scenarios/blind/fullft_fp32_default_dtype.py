"""sft.py -- full fine-tuning of a 3B-parameter causal LM on one 24 GiB card, from a recipe designed
for bf16 weights (pure bf16 training, a paged 8-bit AdamW, gradient checkpointing): ~18 GiB.  The
script loads the bf16 checkpoint without torch_dtype, so transformers materialises it in float32:

    model = AutoModelForCausalLM.from_pretrained("org/lm-3b")          # checkpoint: bf16, 6 GB
    model.gradient_checkpointing_enable()                              #   -> fp32 in memory, 11.25 GiB
    model.cuda()
    optimizer = bnb.optim.PagedAdamW8bit(model.parameters(), lr=1e-5)
    for batch in loader:
        loss = model(**batch).loss
        loss.backward()                                                # fp32 grads: 11.25 GiB more
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

fp32 weights (11.25 GiB) + the checkpointed activations (1.25 GiB) fit; the first backward's fp32
gradients do not: the card runs out near the end of the first backward.  An expert: load in the
checkpoint's dtype (torch_dtype=torch.bfloat16), which halves weights and gradients and is what
the recipe assumed; quantizing the weights is no option for a full fine-tune, and a smaller batch
or checkpointing (already on) do not touch weights and gradients.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(224 * MiB, device="cuda"))

    def forward(self, h):
        out = torch.empty(40 * MiB, device="cuda")          # the checkpoint boundary kept for backward
        out._saved = h
        return out


class CausalLM(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(n_layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids):
        h = torch.empty(40 * MiB, device="cuda")
        for layer in self.layers:
            h = layer(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def from_pretrained(path, torch_dtype=None):
    """AutoModelForCausalLM.from_pretrained: without torch_dtype the weights are float32."""
    return CausalLM()


def main():
    model = from_pretrained("org/lm-3b")
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)   # bnb.optim.PagedAdamW8bit in the recipe
    for step in range(1000):
        input_ids = torch.empty(4 * 2048 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
