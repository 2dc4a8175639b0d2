"""pretrain_small.py -- training a 350M-parameter GPT-style LM (fp32, AdamW, batch 2 x 1024, label
smoothing 0.1) on a 24 GiB card.  Because the label-smoothed loss is not comparable across runs, the
script also tracks the plain next-token NLL for its logs, summed over the epoch and printed every
500 steps:

    epoch_nll, n = 0.0, 0
    for step, (x, y) in enumerate(loader, 1):
        logits = model(x).logits
        loss = F.cross_entropy(logits.view(-1, V), y.view(-1), label_smoothing=0.1)
        nll = F.nll_loss(logits.log_softmax(-1).view(-1, V), y.view(-1))   # for the logs only
        epoch_nll += nll; n += 1                                         # no .item(), no detach
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % 500 == 0: print(step, (epoch_nll / n).item())

`nll` was computed with autograd on and never goes through backward, so the graph behind the running
sum keeps every step's log_softmax output alive (2 x 1024 x 50304 fp32 = 393 MiB a step).
Weights, gradients and AdamW state take 5.3 GiB, a step's activations and logits 4.2 GiB (back in
the cache after each backward); memory then rises by 393 MiB every step, and at step 37, long
before the first print, backward can no longer make the gradients.  An expert: epoch_nll +=
nll.item() (or compute the metric under torch.no_grad() / from logits.detach()); no batch,
precision or checkpointing change fixes a leak, and a bigger card only fails later.
"""
import sys
import time
import torch
import scen_truth

HIDDEN, FFN, LAYERS, VOCAB = 1024, 4096, 24, 50304
BATCH, SEQ = 2, 1024
TOKENS = BATCH * SEQ
scen_truth.note_every_empty(torch)


def param(numel):
    return torch.nn.Parameter(torch.empty(numel * 4, device="cuda"))


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q, self.k, self.v, self.o = (param(HIDDEN * HIDDEN) for _ in range(4))
        self.fc_in, self.fc_out = param(HIDDEN * FFN), param(FFN * HIDDEN)

    def forward(self, h):
        for nbytes in [TOKENS * HIDDEN * 4] * 6 + [TOKENS * FFN * 4] * 3:
            a = torch.empty(nbytes, device="cuda")
            a._saved = h
            h = a
        return h


class GPT(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wte = param(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "h_%d" % i, Block())

    def forward(self, x):
        h = torch.empty(TOKENS * HIDDEN * 4, device="cuda")
        h._saved = x
        for i in range(LAYERS):
            h = getattr(self, "h_%d" % i)(h)
        logits = torch.empty(TOKENS * VOCAB * 4, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def log_softmax(t):
    """LogSoftmaxBackward saves its result (the returned tensor), not its input: whoever holds the
    node (the graph of a tensor computed from the result) keeps the result alive."""
    return torch.empty(t.nbytes, device="cuda")


def cross_entropy(logits, label_smoothing=0.0):
    logp = log_softmax(logits)
    logp._saved = logits      # the loss's graph, which backward walks (and frees) down to the model
    loss = torch.empty(512, device="cuda")
    loss._saved, loss._params = logp, logits._params
    return loss


def nll_loss(logp):
    nll = torch.empty(512, device="cuda")
    nll._saved = logp
    return nll


def add(a, b):
    """epoch_nll + nll with autograd on: a new tensor whose graph holds both operands' graphs."""
    s = torch.empty(512, device="cuda")
    s._saved, s._other = b, a
    return s


def main():
    model = GPT().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    epoch_nll, n = None, 0
    for step in range(1, 5001):
        x = torch.empty(TOKENS * 8, device="cuda")
        logits = model(x)
        loss = cross_entropy(logits, label_smoothing=0.1)
        nll = nll_loss(log_softmax(logits))
        epoch_nll = nll if epoch_nll is None else add(epoch_nll, nll)
        n += 1
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)          # what optimizer.zero_grad() does in PyTorch 2.x
        del loss, nll
        time.sleep(0.01)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
