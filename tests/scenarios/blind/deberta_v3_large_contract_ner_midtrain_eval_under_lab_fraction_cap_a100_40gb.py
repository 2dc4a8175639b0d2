"""train_ner.py -- token classification (contract clauses: parties, dates, amounts; 41 labels) with
DeBERTa-v3-large (435M parameters), fp32 + AdamW, batch 16 x 512, on a lab A100 40GB that the
student now has to herself.  The lab's shared `labutils/gpu.py`, imported first by every script,
still does what it did when two students split the card last year:

    torch.cuda.set_per_process_memory_fraction(0.5)      # "be nice: half the A100 each"

Training fits under that cap: weights 1.6 GiB, gradients 1.6 GiB, AdamW moments 3.2 GiB and
~11 GiB of saved activations at the peak of a step: ~18 GiB of the 20 GiB allowed, flat for 500
steps.  At step 500 the loop evaluates in place (correctly, under torch.no_grad(), model.eval()),
with eval batch 256 "because there are no gradients": each layer's disentangled attention makes
three fp32 score blocks (c2c, c2p, p2c) and their softmax for 256 x 16 heads x 512 x 512, 4 GiB
each, ~16 GiB at once beside the 4.8 GiB of weights and AdamW moments.  PyTorch's own allocator
refuses the softmax's 4 GiB in the first layer (it even frees its cache and retries) -- the card
itself still has ~22 GiB free.

What the user says: "it trains fine and dies in evaluate(), with 22 GiB free in nvidia-smi -- is
the eval batch too big?"  What an expert says first: the process limits itself to half the card:
remove (or raise) set_per_process_memory_fraction(0.5) from labutils now that the card is not
shared, and the evaluation fits (~21.5 GiB at its peak, on a 40 GiB card).  Wrong advice: a smaller eval batch (a
work-around for a cap no longer needed), inference_mode (no_grad is already on), other processes
(there are none), empty_cache or the allocator's settings, a bigger card.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)
torch.cuda.set_per_process_memory_fraction(0.5)          # labutils.gpu.share_politely()
MiB = 1 << 20
LAYERS, D, HEADS, SEQ = 24, 1024, 16, 512
TRAIN_BATCH, EVAL_BATCH = 16, 256
eval_every = 500


class DebertaLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(48 * MiB, device="cuda"))

    def forward(self, h, batch):
        scores = torch.empty(batch * HEADS * SEQ * SEQ * 4, device="cuda")     # c2c + c2p + p2c attention
        if torch.is_grad_enabled():
            hidden = torch.empty(batch * SEQ * D * 4 * 8, device="cuda")
            scores._saved = h
            hidden._saved = scores
            return hidden
        c2p = torch.empty(batch * HEADS * SEQ * SEQ * 4, device="cuda")          # disentangled terms, fp32
        p2c = torch.empty(batch * HEADS * SEQ * SEQ * 4, device="cuda")
        probs = torch.empty(batch * HEADS * SEQ * SEQ * 4, device="cuda")        # softmax of their sum
        del scores, c2p, p2c
        out = torch.empty(batch * SEQ * D * 4, device="cuda")
        del probs
        return out


class DebertaV2ForTokenClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = nn.Parameter(torch.empty(128100 * D * 4, device="cuda"))
        self.rel_embeddings = nn.Parameter(torch.empty(512 * D * 4, device="cuda"))
        self.encoder = nn.Module()
        for i in range(LAYERS):
            setattr(self.encoder, "layer%d" % i, DebertaLayer())
        self.classifier = nn.Parameter(torch.empty(D * 41 * 4, device="cuda"))

    def forward(self, input_ids, batch):
        self.embeddings
        h = torch.empty(batch * SEQ * D * 4, device="cuda")
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self.encoder, "layer%d" % i)(h, batch)
        self.classifier
        logits = torch.empty(batch * SEQ * 41 * 4, device="cuda")
        logits._saved = h
        return logits


def evaluate(model):
    model.eval()
    preds = []
    with torch.no_grad():
        for _ in range(40):
            input_ids = torch.empty(EVAL_BATCH * SEQ * 8, device="cuda")
            logits = model(input_ids, EVAL_BATCH)
            preds.append(0)                                   # logits.argmax(-1).cpu()
            del logits, input_ids
    model.train()
    return preds


def main():
    model = DebertaV2ForTokenClassification().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(1, 6001):
        input_ids = torch.empty(TRAIN_BATCH * SEQ * 8, device="cuda")
        logits = model(input_ids, TRAIN_BATCH)
        loss = torch._derive(torch.empty(4, device="cuda"), logits)
        loss._saved = logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        del input_ids, logits, loss
        if step % 100 == 0:
            print("step %d  reserved %.1f GiB" % (step, torch.cuda.memory_reserved() / (1 << 30)))
        if step % eval_every == 0:
            evaluate(model)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
