"""dp_finetune.py -- differentially private fine-tuning of a clinical BERT (bert-base, 110M parameters,
fp32, 415 MiB) to tag discharge notes, on one RTX A5000 (24 GB).  Our privacy review wanted the
algorithm spelled out, so we wrote DP-SGD ourselves instead of using Opacus: per-example gradients by
a backward pass per example, clipped to norm C, summed, Gaussian noise added, one AdamW step per lot
of 256 examples (the lot size is fixed by the privacy accounting: sigma=1.1 for epsilon=8):

    for lot in lots:                                    # 256 notes, 256 tokens each
        per_example_grads = []
        for x, y in lot:
            loss = model(x, labels=y).loss
            loss.backward()
            g = torch.cat([p.grad.reshape(-1) for p in params])     # one flat vector per example
            g.mul_(min(1.0, C / g.norm()))                           # clip
            per_example_grads.append(g)
            model.zero_grad(set_to_none=True)
        total = torch.stack(per_example_grads).sum(0) + noise(sigma * C)
        unflatten_into_grads(total, params)
        optimizer.step()

The tiny test lot (8 examples) worked.  With the real lot the first lot dies after about 55
examples, at the torch.cat: every example's clipped gradient is kept as a flat copy of all the
model's gradients (415 MiB each) until the lot ends, and 256 of them would need 104 GiB.
Activations are negligible (batch 1).

An expert: keep no per-example gradients -- clip each one as soon as it exists and add it into a
single running sum (one extra gradient's worth of memory), or use Opacus (vectorised per-sample
gradients with virtual steps / ghost clipping).  Training only LoRA adapters under DP would also shrink
each per-example gradient, but that changes the model.  Not a smaller lot (it is fixed by the privacy
budget), not checkpointing, mixed precision, flash attention or shorter sequences (activations are
tiny), not an 8-bit optimizer (its state is 830 MiB and does not exist yet), not the allocator.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

H = 768
FF = 3072
VOCAB = 30522


def param(nfloats):
    return torch.nn.Parameter(torch.empty(nfloats, dtype=torch.float32, device="cuda"))


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for name in ("query", "key", "value", "attn_out"):
            setattr(self, name + "_weight", param(H * H))
            setattr(self, name + "_bias", param(H))
        self.attn_ln_weight, self.attn_ln_bias = param(H), param(H)
        self.inter_weight, self.inter_bias = param(H * FF), param(FF)
        self.out_weight, self.out_bias = param(FF * H), param(H)
        self.out_ln_weight, self.out_ln_bias = param(H), param(H)

    def forward(self, hidden, seq):
        h = torch.empty(seq * FF * 4, device="cuda")
        h._saved = hidden
        out = torch.empty(seq * H * 4, device="cuda")
        out._saved = h
        return out


class BertForTokenClassification(torch.nn.Module):
    def __init__(self, num_labels=9):
        torch.nn.Module.__init__(self)
        self.word_embeddings = param(VOCAB * H)
        self.position_embeddings = param(512 * H)
        self.token_type_embeddings = param(2 * H)
        self.emb_ln_weight, self.emb_ln_bias = param(H), param(H)
        self.layers = []
        for i in range(12):
            layer = BertLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.classifier_weight, self.classifier_bias = param(H * num_labels), param(num_labels)

    def forward(self, input_ids, seq):
        hidden = torch.empty(seq * H * 4, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, seq)
        loss = torch.empty(512, device="cuda")
        loss._saved = hidden
        loss._params = tuple(self.parameters())
        return loss


def unflatten_into_grads(total, params):
    for p in params:
        p.grad = torch.empty_like(p)


def dp_sgd_step(model, optimizer, lot, clip_norm=1.0, sigma=1.1):
    params = [p for p in model.parameters() if p.requires_grad]
    per_example_grads = []
    for x in lot:
        loss = model(x, 256)
        scen_truth.backward(loss)
        g = torch.empty(sum(p.grad.nbytes for p in params) // 4, dtype=torch.float32, device="cuda")  # torch.cat
        per_example_grads.append(g)
        model.zero_grad(set_to_none=True)
    total = torch.empty(per_example_grads[0].nbytes // 4, dtype=torch.float32, device="cuda")  # stack(...).sum(0)
    unflatten_into_grads(total, params)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main():
    model = BertForTokenClassification(num_labels=9)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    lot_size = 256
    for epoch in range(3):
        for lot_idx in range(40):
            lot = [torch.empty(256 * 8, dtype=torch.uint8, device="cuda") for _ in range(lot_size)]
            dp_sgd_step(model, optimizer, lot)
            del lot


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
