"""ESM-2 650M thermostability fine-tune on a lab A100 80GB that two students share by agreement: each job caps
itself at half the card with torch.cuda.set_per_process_memory_fraction(0.5).  Tonight the other student runs
ColabFold (JAX), which knows nothing of the pact and preallocates JAX's default 75% of the card.  This job fails
in its first forward pass with ~19 GiB in use -- far below its own 40 GiB cap.

The real code (finetune_esm2_tm.py):

    torch.cuda.set_per_process_memory_fraction(0.5)      # lab rule: half the A100 each
    model = EsmForSequenceClassification.from_pretrained("facebook/esm2_t33_650M_UR50D", num_labels=1).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:                                 # 12 sequences, padded to 512 residues
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

The neighbour: `colabfold_batch --num-models 5 targets.fasta out/` started an hour earlier with no XLA_* variables:
JAX preallocates 75% of the total memory at its first operation (60 GiB, plus its context) and keeps it.

The arithmetic (A100 80GB, 81920 MiB):
  ColabFold (another user's process, JAX arena)     ~60.5 GiB
  this job: context 0.5 GiB, fp32 weights 2.4 GiB (650M params)
  batch 12 x 512 activations (33 layers x ~0.52 GiB, eager attention probabilities included) ~17.2 GiB
  -> 60.5 + 0.5 + 2.4 + 17.2 = 80.6 GiB > 80: the first forward pass fails in layer 31 of 0-32, on a 15 MiB
  activation with 12 MiB free and 18.9 GiB allocated.
  The whole step (+ 2.4 GiB gradients + 4.8 GiB AdamW) is ~27 GiB: it fits this job's 40 GiB cap, and it ran
  fine last week when the card was shared with a PyTorch job that kept to its half.

What an expert says first: another process holds 60 GiB -- 75% of the card, JAX's default preallocation, not
its agreed half.  Get it to honour the split (XLA_PYTHON_CLIENT_MEM_FRACTION=0.45, or
XLA_PYTHON_CLIENT_PREALLOCATE=false) or wait for it; this job is well inside its own cap.
Wrong advice: raising this job's memory fraction (the cap is not what failed: the card is full), empty_cache /
expandable_segments (first step, nothing cached), treating it as a second framework in this process (this process
is PyTorch only; the JAX arena is the other student's process), a leak, inference mode.
"""
import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "facebook/esm2_t33_650M_UR50D"
HIDDEN, FFN, N_LAYERS, N_HEADS, VOCAB = 1280, 5120, 33, 20, 33
BATCH_SIZE = 12
MAX_LEN = 512
MEMORY_FRACTION = 0.5          # the lab's rule for the shared A100


def _param(n):
    return nn.Parameter(torch.empty(n * 4, device="cuda"))


def _act(n_elems, saved, dtype=torch.bfloat16):
    t = torch.empty(n_elems * torch._ITEMSIZE[dtype], device="cuda")
    t._dtype = dtype
    t._saved = saved
    return t


class EsmSelfAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.query = _param(HIDDEN * HIDDEN + HIDDEN)
        self.key = _param(HIDDEN * HIDDEN + HIDDEN)
        self.value = _param(HIDDEN * HIDDEN + HIDDEN)

    def forward(self, hidden_states, batch, seq):
        w = self.query, self.key, self.value
        tok = batch * seq
        q = _act(tok * HIDDEN, hidden_states)
        k = _act(tok * HIDDEN, q)                            # rotary-embedded keys
        v = _act(tok * HIDDEN, k)
        scores = _act(batch * N_HEADS * seq * seq, v)        # q @ k^T (eager attention)
        probs = _act(batch * N_HEADS * seq * seq, scores)    # softmax (dropout off)
        return _act(tok * HIDDEN, probs)


class EsmLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn_layer_norm = _param(2 * HIDDEN)
        self.attention = EsmSelfAttention()
        self.attn_output = _param(HIDDEN * HIDDEN + HIDDEN)
        self.layer_norm = _param(2 * HIDDEN)
        self.intermediate = _param(HIDDEN * FFN + FFN)
        self.output = _param(FFN * HIDDEN + HIDDEN)

    def forward(self, hidden_states, batch, seq):
        tok = batch * seq
        w = self.attn_layer_norm, self.attn_output, self.layer_norm, self.intermediate, self.output
        ln = _act(tok * HIDDEN, hidden_states)
        ctx = self.attention(ln, batch, seq)
        h = _act(tok * HIDDEN, ctx, torch.float32)           # residual stream
        ln2 = _act(tok * HIDDEN, h)
        inter = _act(tok * FFN, ln2)                         # dense
        act = _act(tok * FFN, inter)                         # gelu
        out = _act(tok * HIDDEN, act)
        return _act(tok * HIDDEN, out, torch.float32)


class Layers(nn.Module):
    def __init__(self, n):
        nn.Module.__init__(self)
        for i in range(n):
            setattr(self, str(i), EsmLayer())


class EsmForSequenceClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = _param(VOCAB * HIDDEN + 1026 * HIDDEN)
        self.layer = Layers(N_LAYERS)
        self.emb_layer_norm_after = _param(2 * HIDDEN)
        self.classifier = _param(HIDDEN * HIDDEN + HIDDEN + HIDDEN + 1)

    def forward(self, input_ids, attention_mask, labels):
        batch, seq = BATCH_SIZE, MAX_LEN
        w = self.embeddings
        h = _act(batch * seq * HIDDEN, input_ids, torch.float32)
        for layer in self.layer._modules.values():
            h = layer(h, batch, seq)
        w = self.emb_layer_norm_after, self.classifier
        pred = _act(batch, h, torch.float32)
        return nn.functional.nll_loss(pred, labels)         # MSE of the regression head


class MeltomeLoader(object):
    """FLIP meltome splits, tokenized and padded to 512 residues; DataLoader(batch_size=12, shuffle=True)."""

    def __iter__(self):
        for _ in range(3000):
            yield {"input_ids": torch.empty(BATCH_SIZE * MAX_LEN * 8, device="cuda"),
                   "attention_mask": torch.empty(BATCH_SIZE * MAX_LEN * 8, device="cuda"),
                   "labels": torch.empty(BATCH_SIZE * 4, device="cuda")}


def train(model, optimizer, loader, epochs=5):
    model.train()
    for epoch in range(epochs):
        for step, batch in enumerate(loader):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**batch)
            scen_truth.backward(loss)            # loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            if step % 100 == 0:
                print("epoch %d step %d" % (epoch, step), flush=True)


def main():
    torch.cuda.set_per_process_memory_fraction(MEMORY_FRACTION)
    free, total = torch.cuda.mem_get_info()
    print("GPU 0: %.1f GiB free of %.1f GiB; this job may use %.1f GiB"
          % (free / 2**30, total / 2**30, MEMORY_FRACTION * total / 2**30), flush=True)
    model = EsmForSequenceClassification()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    train(model, optimizer, MeltomeLoader())


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
