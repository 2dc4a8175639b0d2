"""train_layout.py -- fine-tuning a 130M-parameter document-layout transformer (fp32, AdamW, batch 8)
on a 24 GiB card.  While debugging attention, someone registered a forward hook that keeps every
layer's attention probabilities for plotting, and left it in:

    attn_maps = []
    def keep_attn(module, inputs, output):
        attn_maps.append(output[1])                    # the probabilities, with their graph
    for layer in model.encoder.layer:
        layer.attention.self.register_forward_hook(keep_attn)
    for step, batch in enumerate(loader):
        loss = model(**batch, output_attentions=True).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Each step the hook keeps 12 x 24 MiB of attention probabilities (8 x 12 heads x 256 x 256 fp32)
that nothing frees.  Weights, grads and AdamW state are 2 GiB and a step's activations 6 GiB
(cached): memory climbs 288 MiB a step and a forward pass around step 54 fails.  A leak across
steps.  An expert: remove the hook (or store .detach().cpu() copies, or only every N steps):
release the references; a smaller batch, mixed precision or a bigger card only postpone it.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

attn_maps = []


def keep_attn(module, inputs, output):
    attn_maps.append(output[1])


class SelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(40 * MiB, device="cuda"))
        self.hooks = []

    def register_forward_hook(self, hook):
        self.hooks.append(hook)

    def forward(self, h):
        probs = torch.empty(24 * MiB, device="cuda")        # softmax(q k^T): 8 x 12 x 256 x 256 fp32
        probs._saved = h
        ctx = torch.empty(488 * MiB, device="cuda")           # the rest of the layer's saved activations
        ctx._saved = probs
        out = (ctx, probs)
        for hook in self.hooks:
            hook(self, (h,), out)
        return ctx


class LayoutEncoder(torch.nn.Module):
    def __init__(self, n_layers=12):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))
        self.layer = [SelfAttention() for _ in range(n_layers)]
        for i, l in enumerate(self.layer):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids):
        h = input_ids
        for l in self.layer:
            h = l(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    model = LayoutEncoder().cuda()
    for l in model.layer:
        l.register_forward_hook(keep_attn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-5)
    for step in range(10000):
        input_ids = torch.empty(8 * 512 * 8 * 4, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids
        time.sleep(0.003)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
