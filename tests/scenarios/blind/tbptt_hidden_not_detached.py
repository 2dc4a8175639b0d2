"""train_lm.py -- a recurrent language model trained with truncated backpropagation through time:
the hidden state is carried from one 512-token chunk to the next, but never detached.  The first
run died with "Trying to backward through the graph a second time", so retain_graph=True was added:

    hidden = model.init_hidden(batch_size)
    for step, (x, y) in enumerate(chunks(stream, 512)):
        logits, hidden = model(x, hidden)              # hidden still points into last step's graph
        loss = criterion(logits, y)
        loss.backward(retain_graph=True)
        optimizer.step(); optimizer.zero_grad()

Every chunk's graph (640 MiB of saved activations) stays reachable from the hidden state, so memory
climbs by the same amount each step from 4 GiB of weights, grads and AdamW state until the forward
pass of step ~31 fails.  A real leak across iterations.  An expert: hidden = hidden.detach() at each
chunk boundary (and drop retain_graph=True); no batch, precision or checkpointing change helps, and
a bigger card only fails later.
"""
import time
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class LSTMLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(8):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def init_hidden(self):
        return torch.empty(2 * MiB, device="cuda")

    def forward(self, x, hidden):
        h = hidden
        for _ in range(5):                               # gates, cell states: saved for backward
            a = torch.empty(128 * MiB, device="cuda")
            a._saved = h
            h = a
        logits = torch.empty(64 * MiB, device="cuda")
        logits._saved = h
        new_hidden = torch.empty(2 * MiB, device="cuda")
        new_hidden._saved = h                              # the next chunk starts from this graph
        return logits, new_hidden


def main():
    model = LSTMLM().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    hidden = model.init_hidden()
    for step in range(10000):
        x = torch.empty(4 * MiB, device="cuda")
        logits, hidden = model(x, hidden)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = model.parameters(), logits
        loss.backward(retain_graph=True)
        optimizer.step()
        optimizer.zero_grad()
        time.sleep(0.01)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
