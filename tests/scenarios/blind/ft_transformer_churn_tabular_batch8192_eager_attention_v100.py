"""train_churn.py -- an FT-Transformer (rtdl-style: every one of 200 tabular features becomes a
token, plus [CLS]; d_token 192, 8 heads, 3 blocks, 2.7M parameters) for churn prediction on 40M
customer rows, on a 16 GB V100 (15.8 GiB usable, compute capability 7.0) with an old PyTorch
(1.13).  Coming from gradient-boosted trees and MLPs, the user kept the batch size that made the
MLP fast, batch_size 8192, and the attention is the textbook one:

    scores = q @ k.transpose(-2, -1) / math.sqrt(d_head)       # (8192, 8, 201, 201) fp32
    attn = scores.softmax(dim=-1)                                 # another one

One score matrix is 8192 x 8 x 201 x 201 x 4 bytes = 9.9 GiB.  The first block's softmax output
does not fit next to the scores (the failure is in the first block's attention, on the first
batch).  The model is tiny; the batch is what makes the tensor.

An expert: a much smaller batch (1024 is typical for FT-Transformer; the 40M rows still give
plenty of steps -- accumulate if the large effective batch matters), or a fused/memory-efficient
attention kernel (PyTorch 2's SDPA has one that runs on a V100) that never materialises the score
matrices.  Not checkpointing (the failure is inside one block), not dropping features, not an
8-bit optimizer, LoRA, quantization or sharding for 2.7M parameters, not empty_cache or
expandable_segments, not inference mode (it trains).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_TOKENS = 201
D_TOKEN = 192
HEADS = 8


class MultiheadAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.W_qkv = torch.nn.Parameter(torch.empty(D_TOKEN * D_TOKEN * 3 * 4, device="cuda"))
        self.W_out = torch.nn.Parameter(torch.empty(D_TOKEN * D_TOKEN * 4, device="cuda"))

    def forward(self, x, batch):
        qkv = torch.empty(batch * N_TOKENS * D_TOKEN * 3 * 4, device="cuda")
        qkv._saved = x
        scores = torch.empty(batch * HEADS * N_TOKENS * N_TOKENS * 4, device="cuda")
        scores._saved = qkv
        attn = torch.empty(batch * HEADS * N_TOKENS * N_TOKENS * 4, device="cuda")     # softmax
        attn._saved = scores
        out = torch.empty(batch * N_TOKENS * D_TOKEN * 4, device="cuda")
        out._saved = attn
        return out


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = MultiheadAttention()
        self.ffn = torch.nn.Parameter(torch.empty(D_TOKEN * 256 * 2 * 4, device="cuda"))

    def forward(self, x, batch):
        x = self.attention(x, batch)
        h = torch.empty(batch * N_TOKENS * 256 * 4, device="cuda")     # FFN (ReGLU)
        h._saved = x
        return h


class FTTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.tokenizer = torch.nn.Parameter(torch.empty(200 * D_TOKEN * 2 * 4, device="cuda"))
        self.block0 = Block()
        self.block1 = Block()
        self.block2 = Block()
        self.head = torch.nn.Parameter(torch.empty(D_TOKEN * 4, device="cuda"))

    def forward(self, x_num, batch):
        x = torch.empty(batch * N_TOKENS * D_TOKEN * 4, device="cuda")      # feature tokens + [CLS]
        x._saved = x_num
        for blk in (self.block0, self.block1, self.block2):
            x = blk(x, batch)
        return torch.empty(batch * 4, device="cuda")


def main():
    model = FTTransformer()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-5)
    batch_size = 8192
    for step in range(40000000 // batch_size):
        x_num = torch.empty(batch_size * 200 * 4, device="cuda")
        y = torch.empty(batch_size * 4, device="cuda")
        logit = model(x_num, batch_size)
        loss = torch.empty(512, device="cuda")
        loss._saved = logit
        loss._params = tuple(model.parameters())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logit, x_num, y


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
