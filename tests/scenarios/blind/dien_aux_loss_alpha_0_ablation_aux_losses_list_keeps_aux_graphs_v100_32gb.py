"""DIEN (Deep Interest Evolution Network) CTR model on an e-commerce click log, V100 32GB.  The team's
trainer has run for months with the default aux_loss_alpha=1.0.  For the paper's ablation table a user
launches the same config with aux_loss_alpha=0.0, and it dies in its first minute, at step 79.

The real code (a DeepCTR-Torch-style DIEN after an in-house refactor that moved the auxiliary loss from
`self.aux_loss` (overwritten every step) to a list, so the trainer could log its mean every 500 steps):

    class InterestExtractor(nn.Module):
        def __init__(self, ...):
            self.gru = nn.GRU(128, 128, batch_first=True)
            self.aux_net = DNN(256, [100, 50, 1], activation="sigmoid")
            self.aux_losses = []
        def forward(self, keys, neg_keys):
            interests, _ = self.gru(keys)                                   # [B, T, H]
            pos = self.aux_net(torch.cat([interests[:, :-1], keys[:, 1:]], -1))
            neg = self.aux_net(torch.cat([interests[:, :-1], neg_keys[:, 1:]], -1))
            self.aux_losses.append(bce(pos, 1) + bce(neg, 0))               # kept for logging
            return interests

    for step, batch in enumerate(loader):
        loss = F.binary_cross_entropy_with_logits(model(batch), batch["label"])
        if cfg.aux_loss_alpha > 0:                                          # ablation: 0.0
            loss = loss + cfg.aux_loss_alpha * model.interest_extractor.aux_losses[-1]
        loss.backward(); opt.step(); opt.zero_grad()
        if step % 500 == 0:
            log("aux", torch.stack(model.interest_extractor.aux_losses).mean().item())   # never cleared

With alpha=1 every aux loss is part of loss.backward(), which frees what its graph saved: the list holds
scalars, a few bytes a step, and nobody noticed it is never cleared.  With alpha=0 the aux losses are
never backpropagated, so each one kept in the list keeps what its auxiliary branch saved for a backward
that never comes (the GRU's own saved tensors are freed by the main loss's backward, which goes through
it): the two concatenations [512, 199, 256] fp32 that aux_net's first Linear saved (104 MB each) and the
aux MLP's 100- and 50-wide activations (2 x 41 + 2 x 20 MB): about 0.31 GiB per step.  Weights 1.43 GiB
(item-id table 4M x 64, user-profile table 2M x 64, GRUs, DNNs), AdamW state 2.86 GiB, context 0.5 GiB:
4.8 GiB steady; the gradients (1.43 GiB, set to None after each step) and the main path's activations
come and go within a step.  The aux graphs add 0.31 GiB per step (allocated after step 0: 4.6 GiB,
after step 78: 28.7 GiB) until, in the first minute, step 79's forward fails asking for the 200 MiB
attention input of the interest-evolution layer: 29.3 GiB allocated, ~25 GiB of it 80 kept aux graphs,
1.8 GiB reserved-but-unallocated in the gaps the freed per-step tensors left between them (a symptom of
the leak, not the cause), 0.1 GiB free on the 31.75 GiB card.

What an expert says: a leak across iterations: the list keeps graphs that are never backpropagated.
Store aux_loss.detach() (or .item()) in the list and clear it after logging, or skip the aux branch when
alpha is 0.  Wrong advice: a smaller batch (only delays it: still leaks), mixed precision, gradient
checkpointing, expandable_segments / empty_cache (the memory is live tensors), a bigger GPU, ZeRO.
"""
import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn  # noqa: E402

CFG = {
    "batch_size": 512,
    "max_hist_len": 200,
    "emb_dim": 64,            # item id 64 + category 64 = 128 per behavior
    "hidden": 128,
    "num_items": 4_000_000,
    "num_users": 2_000_000,
    "aux_loss_alpha": 0.0,    # ablation run (default config: 1.0)
    "lr": 1e-3,
    "epochs": 3,
    "steps_per_epoch": 40_000,
}


def _op_output(n_elems, dtype=torch.float32):
    """What one tensor operation writes (the stand-in computes nothing, it allocates)."""
    return torch.empty(n_elems, dtype=dtype, device="cuda")


class Embedding(nn.Module):
    def __init__(self, num, dim):
        super().__init__()
        self.dim = dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=torch.float32, device="cuda"))

    def forward(self, n_ids):
        return _op_output(n_ids * self.dim)


class DNN(nn.Module):
    """Linear -> activation stack; each layer's output saved for backward."""

    def __init__(self, inputs_dim, hidden_units):
        super().__init__()
        dims = [inputs_dim] + list(hidden_units)
        self.widths = list(hidden_units)
        for i in range(len(hidden_units)):
            setattr(self, "linear_%d" % i, _Linear(dims[i], dims[i + 1]))

    def forward(self, x, rows):
        h = x
        for w in self.widths:
            out = _op_output(rows * w)
            out._saved = h
            h = out
        return h


class _Linear(nn.Module):
    def __init__(self, i, o):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(i * o, dtype=torch.float32, device="cuda"))
        self.bias = nn.Parameter(torch.empty(o, dtype=torch.float32, device="cuda"))


class GRU(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden_size = hidden_size
        self.weight_ih_l0 = nn.Parameter(torch.empty(3 * hidden_size * input_size, dtype=torch.float32, device="cuda"))
        self.weight_hh_l0 = nn.Parameter(torch.empty(3 * hidden_size * hidden_size, dtype=torch.float32, device="cuda"))

    def forward(self, keys, batch, t):
        gates = _op_output(batch * t * 3 * self.hidden_size)     # cuDNN reserve space
        out = _op_output(batch * t * self.hidden_size)
        out._saved = gates
        return out


class AuxBCE(nn.Module):
    def forward(self, pos, neg):
        loss = _op_output(1)
        loss._saved = [pos, neg]
        return loss


class InterestExtractor(nn.Module):
    def __init__(self, emb, hidden):
        super().__init__()
        self.gru = GRU(emb, hidden)
        self.aux_net = DNN(hidden + emb, [100, 50, 1])
        self.aux_bce = AuxBCE()
        self.aux_losses = []

    def forward(self, keys, neg_keys, batch, t):
        interests = self.gru(keys, batch, t)
        rows = batch * (t - 1)
        pos_in = _op_output(rows * (CFG["hidden"] + 2 * CFG["emb_dim"]))   # cat([interests[:, :-1], keys[:, 1:]])
        neg_in = _op_output(rows * (CFG["hidden"] + 2 * CFG["emb_dim"]))   # cat([interests[:, :-1], neg_keys[:, 1:]])
        pos = self.aux_net(pos_in, rows)
        neg = self.aux_net(neg_in, rows)
        self.aux_losses.append(self.aux_bce(pos, neg))
        return interests


class InterestEvolving(nn.Module):
    """Target attention over the interests, then AUGRU."""

    def __init__(self, hidden):
        super().__init__()
        self.attention = DNN(4 * hidden, [80, 40, 1])
        self.augru = GRU(hidden, hidden)

    def forward(self, interests, batch, t):
        att_in = _op_output(batch * t * 4 * CFG["hidden"])
        att_in._saved = interests
        scores = self.attention(att_in, batch * t)
        out = self.augru(scores, batch, t)
        final = _op_output(batch * CFG["hidden"])
        final._saved = out
        return final


class DIEN(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.item_emb = Embedding(cfg["num_items"], cfg["emb_dim"])
        self.cate_emb = Embedding(20_000, cfg["emb_dim"])
        self.user_emb = Embedding(cfg["num_users"], cfg["emb_dim"])
        self.interest_extractor = InterestExtractor(2 * cfg["emb_dim"], cfg["hidden"])
        self.interest_evolution = InterestEvolving(cfg["hidden"])
        self.dnn = DNN(cfg["hidden"] + 6 * cfg["emb_dim"], [200, 80, 1])

    def forward(self, batch, t):
        keys = _op_output(batch * t * 2 * CFG["emb_dim"])           # item+cate embeddings of the history
        neg_keys = _op_output(batch * t * 2 * CFG["emb_dim"])       # sampled negative behaviors
        interests = self.interest_extractor(keys, neg_keys, batch, t)
        evolved = self.interest_evolution(interests, batch, t)
        x = _op_output(batch * (CFG["hidden"] + 6 * CFG["emb_dim"]))
        x._saved = evolved
        return self.dnn(x, batch)


class BCEWithLogits(nn.Module):
    def forward(self, logits):
        loss = _op_output(1)
        loss._saved = logits
        return loss


def train(model, opt, cfg):
    criterion = BCEWithLogits()
    b, t = cfg["batch_size"], cfg["max_hist_len"]
    for epoch in range(cfg["epochs"]):
        for step in range(cfg["steps_per_epoch"]):
            logits = model(b, t)
            loss = criterion(logits)
            if cfg["aux_loss_alpha"] > 0:
                loss = loss + cfg["aux_loss_alpha"] * model.interest_extractor.aux_losses[-1]
            scen_truth.backward(loss)          # loss.backward(): frees what the loss's graph saved
            opt.step()
            opt.zero_grad()
            if step % 500 == 0:
                n = len(model.interest_extractor.aux_losses)
                print("epoch %d step %d aux losses logged %d" % (epoch, step, n))


def main():
    model = DIEN(CFG)
    opt = torch.optim.AdamW(model.parameters(), lr=CFG["lr"])
    train(model, opt, CFG)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
