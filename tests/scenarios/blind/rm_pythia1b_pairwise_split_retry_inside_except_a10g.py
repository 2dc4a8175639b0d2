"""train_rm.py -- a pairwise reward model (Pythia-1B with a scalar head, full fine-tuning, fp32 weights
under bf16 autocast, AdamW; eager attention, no gradient checkpointing) on an AWS A10G (24 GB), with
PyTorch 1.13 and a hand-written loop.  Each batch is 4 preference pairs (8 sequences) padded to the
longest; most batches are under 512 tokens and peak near 19.5 GiB.  The author added a fallback for
the rare long batch:

    for batch in loader:
        try:
            loss = pairwise_loss(model, batch); loss.backward()
        except torch.cuda.OutOfMemoryError:
            print("OOM, retrying in micro-batches")
            optimizer.zero_grad(set_to_none=True)
            for micro in split(batch, 4):                     # retried INSIDE the except block
                (pairwise_loss(model, micro) / 4).backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

A batch padded to 1,536 tokens runs out in the forward pass (layer ~9 of 16).  The retry then starts
inside the except block, where the exception's traceback still holds the frames of the failed forward
and with them every activation it had made (~13 GiB): the first micro-batch (one pair, which fits
easily on its own: 5.4 GiB of activations, a 19.5 GiB peak with its gradients) fails at once.

An expert: leave the except block before retrying (note the failure, retry after it; or drop the
traceback), so the failed attempt's activations are freed first.  A smaller per-step batch with
accumulation, gradient checkpointing or a cap on the padded length would avoid the first failure;
neither is what makes the retry fail.  Not a leak across steps, not fragmentation, not another process.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

HIDDEN, HEADS, LAYERS = 2048, 16, 16


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4 * 4, device="cuda"))   # fp32, 64 MiB
        self.mlp = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 8 * 4, device="cuda"))          # fp32, 128 MiB

    def forward(self, hidden, rows, seq_len):
        h = rows * seq_len * HIDDEN * 2                                      # one bf16 activation
        qkv = torch.empty(3 * h, device="cuda")
        qkv._saved = hidden
        probs = torch.empty(rows * HEADS * seq_len * seq_len * 2, device="cuda")   # eager attention
        probs._saved = qkv
        attn_out = torch.empty(h, device="cuda")
        attn_out._saved = probs
        mlp_act = torch.empty(8 * h, device="cuda")
        mlp_act._saved = attn_out
        out = torch.empty(5 * h, device="cuda")
        out._saved = mlp_act
        return out


class GPTNeoXRewardModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_in = torch.nn.Parameter(torch.empty(50304 * HIDDEN * 4, device="cuda"))
        self.layers = [GPTNeoXLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.score = torch.nn.Parameter(torch.empty(HIDDEN * 4, device="cuda"))

    def forward(self, input_ids, rows, seq_len):
        hidden = torch.empty(rows * seq_len * HIDDEN * 2, device="cuda")
        hidden._saved = input_ids
        for layer in self.layers:
            hidden = layer(hidden, rows, seq_len)
        rewards = torch.empty(rows * 4, device="cuda")
        rewards._saved = hidden
        return rewards


def pairwise_loss(model, batch):
    rows = 2 * batch["pairs"]                                  # chosen and rejected of each pair
    input_ids = torch.empty(rows * batch["longest"] * 8, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        rewards = model(input_ids, rows, batch["longest"])
    loss = torch.empty(512, device="cuda")                     # -logsigmoid(chosen - rejected).mean()
    loss._saved = rewards
    loss._params = tuple(model.parameters())
    return loss


def split(batch, n):
    return [{"pairs": batch["pairs"] // n, "longest": batch["longest"]} for _ in range(n)]


def main():
    model = GPTNeoXRewardModel()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    longest_per_batch = [448, 512, 384, 480, 1536, 416]
    for step, longest in enumerate(longest_per_batch):
        batch = {"pairs": 4, "longest": longest}
        try:
            loss = pairwise_loss(model, batch)
            scen_truth.backward(loss)
        except torch.cuda.OutOfMemoryError:
            print("OOM on a batch of %d pairs x %d tokens, retrying in micro-batches" % (batch["pairs"], longest))
            optimizer.zero_grad(set_to_none=True)
            for micro in split(batch, 4):
                loss = pairwise_loss(model, micro)
                scen_truth.backward(loss)
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.cuda.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
