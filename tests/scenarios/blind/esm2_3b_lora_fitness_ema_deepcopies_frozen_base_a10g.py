"""finetune_dms.py -- LoRA fine-tuning of ESM-2 3B (esm2_t36_3B_UR50D, fp32 as from_pretrained gives it,
10.6 GiB) to predict deep-mutational-scanning fitness, on an AWS g5 instance (A10G, 24 GB).  Gradient
checkpointing on, LoRA rank 8 on query/value, a regression head; the user added a weight EMA because a
paper on fitness prediction reported it stabilises Spearman:

    model = EsmForSequenceClassification.from_pretrained("facebook/esm2_t36_3B_UR50D", num_labels=1)
    model.gradient_checkpointing_enable()
    model = get_peft_model(model, LoraConfig(r=8, target_modules=["query", "value"])).cuda()
    ema = EMA(model, decay=0.999)              # class EMA: self.shadow = copy.deepcopy(model)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    for batch in loader:                       # batch_size = 4, proteins cropped to 1024 residues
        loss = mse(model(**batch).logits, batch["fitness"]); loss.backward()
        optimizer.step(); ema.update(model); optimizer.zero_grad()

copy.deepcopy(model) copies the whole PEFT model, the frozen 3B base included: a second 10.6 GiB on the
card, to average ~5 MiB of adapter weights that are the only ones that ever change.  The two copies
leave 0.8 GiB of the A10G; the first forward fails in the first encoder layer.  Without the shadow,
11.4 GiB would be free for the checkpointed forward (stored layer inputs 1.4 GiB + one layer ~1.8 GiB).

An expert: the EMA shadow duplicates weights that are frozen: average only the trainable (LoRA + head)
parameters (or keep the shadow on the CPU); then the job fits as it is.  Not a smaller batch or
checkpointing (already on), not LoRA (it is LoRA), not an 8-bit optimizer (its state is a few MiB),
not empty_cache.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN = 2560
FFN = 10240
HEADS = 40
LAYERS = 36
batch_size = 4
max_length = 1024


def linear_weight(cin, cout, trainable=False):
    return torch.nn.Parameter(torch.empty(cin * cout * 4, device="cuda"), requires_grad=trainable)


class LoraLinear(torch.nn.Module):
    """peft.tuners.lora.Linear: the frozen base weight plus lora_A / lora_B."""

    def __init__(self, cin, cout, r=8):
        torch.nn.Module.__init__(self)
        self.weight = linear_weight(cin, cout)
        self.lora_A = linear_weight(cin, r, trainable=True)
        self.lora_B = linear_weight(r, cout, trainable=True)

    def forward(self, x):
        out = torch.empty(batch_size * max_length * HIDDEN * 4, device="cuda")
        out._saved = x
        return out


class EsmSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = LoraLinear(HIDDEN, HIDDEN)
        self.key = linear_weight(HIDDEN, HIDDEN)
        self.value = LoraLinear(HIDDEN, HIDDEN)
        self.dense = linear_weight(HIDDEN, HIDDEN)

    def forward(self, x):
        q = self.query(x)
        k = torch.empty(batch_size * max_length * HIDDEN * 4, device="cuda")
        v = self.value(x)
        scores = torch.empty(batch_size * HEADS * max_length * max_length * 4, device="cuda")    # eager softmax(QK^T)
        probs = torch.empty(batch_size * HEADS * max_length * max_length * 4, device="cuda")
        ctx = torch.empty(batch_size * max_length * HIDDEN * 4, device="cuda")
        ctx._saved = probs
        return ctx


class EsmLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = EsmSelfAttention()
        self.intermediate = linear_weight(HIDDEN, FFN)
        self.output = linear_weight(FFN, HIDDEN)

    def forward(self, x):
        a = self.attention(x)
        inter = torch.empty(batch_size * max_length * FFN * 4, device="cuda")
        act = torch.empty(batch_size * max_length * FFN * 4, device="cuda")
        out = torch.empty(batch_size * max_length * HIDDEN * 4, device="cuda")
        out._saved = x                      # checkpointed: only the layer's input is kept for backward
        return out


class EsmEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gradient_checkpointing = True           # model.gradient_checkpointing_enable()
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, EsmLayer())

    def forward(self, h):
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        return h


class EsmForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = linear_weight(33, HIDDEN)
        self.encoder = EsmEncoder()
        self.classifier = linear_weight(HIDDEN, 1, trainable=True)

    def forward(self, input_ids):
        h = torch.empty(batch_size * max_length * HIDDEN * 4, device="cuda")
        h._saved = input_ids
        h = self.encoder(h)
        logits = torch.empty(batch_size * 4, device="cuda")
        logits._saved = h
        return logits


class EMA(object):
    """Exponential moving average of the weights, evaluated at each epoch's end."""

    def __init__(self, model, decay=0.999):
        self.decay = decay
        self.shadow = copy.deepcopy(model)
        for p in self.shadow.parameters():
            p.requires_grad_(False)

    def update(self, model):
        with torch.no_grad():
            for s, p in zip(self.shadow.parameters(), model.parameters()):
                pass                # s.mul_(decay).add_(p, alpha=1 - decay)


def main():
    model = EsmForSequenceClassification().cuda()
    model.train()
    ema = EMA(model, decay=0.999)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-4)
    for step in range(100000):
        input_ids = torch.empty(batch_size * max_length * 8, device="cuda")
        fitness = torch.empty(batch_size * 4, device="cuda")
        logits = model(input_ids)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = logits._params
        scen_truth.backward(loss)
        optimizer.step()
        ema.update(model)
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, input_ids, fitness


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
