"""pretrain.py -- pretraining a 1.5B Llama-style model from scratch (22 layers, d_model 2048, the Llama-3
tokenizer's 128k vocabulary, fused qkv and gate/up projections as the codebase writes them) on one L40S
(45 GiB), PyTorch 2.3, fp32 master weights with bf16 autocast, AdamW, micro-batch 4 x 2048 tokens, no
gradient checkpointing, gradients zeroed in place.  For the evaluation, the user added LAWA (latest
weight averaging: evaluate the average of the last k checkpoints, which tracks a lower-learning-rate
run during pretraining):

    self.lawa_buffer = collections.deque(maxlen=6)
    self.lawa_interval = 100
    ...
    if step % self.lawa_interval == 0:
        self.lawa_buffer.append([p.detach().clone() for p in model.parameters()])   # a state-dict copy
    if step % 2000 == 0:
        evaluate(averaged(self.lawa_buffer))

Each entry is a full fp32 copy of the weights on the GPU (5.6 GiB).  Weights, gradients and AdamW
moments take 22.2 GiB, a step's activations and logits 12 GiB more; the first 200 steps run.  After
the second snapshot (step 200) step 201 runs out in the loss, at the log-softmax of the logits: two
copies, 11.1 GiB, and the window was meant to hold six.

An expert: the averaging window is the second (and third) copy of the weights, and the job needs none
of it on the GPU between evaluations: keep the snapshots in CPU memory (pinned, copied with
non_blocking) and average them there or stream them to the GPU at evaluation time; or keep one running
sum updated in place instead of k copies.  Not a smaller batch, checkpointing or an 8-bit optimizer:
the training step fitted for 200 steps and its own memory did not change.
"""
import collections
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

D, LAYERS, KV_DIM, INTER, VOCAB = 2048, 22, 256, 5632, 128256
BF16, FP32 = 2, 4


def weight(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems * FP32, device="cuda"))      # fp32


def act(nbytes, saved=None, dtype=torch.bfloat16):
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved if torch.is_grad_enabled() else None
    return t


class CausalSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wqkv = weight(D * (D + 2 * KV_DIM))
        self.wo = weight(D * D)

    def forward(self, h, tokens):
        w = (self.wqkv, self.wo)
        # what autograd keeps of this module (qkv, the flash-attention output and its lse, the
        # projection's input) in one tensor of that size, handed on as the module's output
        return act(tokens * (D + 2 * KV_DIM + D + D) * BF16, h)


class SwiGLU(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w12 = weight(D * 2 * INTER)
        self.w3 = weight(INTER * D)

    def forward(self, h, tokens):
        w = (self.w12, self.w3)
        return act(tokens * (2 * INTER + INTER + D) * BF16, h)     # gate/up, silu(gate) * up, output


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = CausalSelfAttention()
        self.mlp = SwiGLU()

    def forward(self, h, tokens):
        return self.mlp(self.attn(h, tokens), tokens)


class LlamaLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wte = weight(VOCAB * D)
        self.lm_head = weight(VOCAB * D)
        self.blocks = []
        for i in range(LAYERS):
            b = Block()
            setattr(self, "block_%d" % i, b)
            self.blocks.append(b)

    def forward(self, idx, tokens):
        wte, head = self.wte, self.lm_head
        h = act(tokens * D * BF16, idx)
        for b in self.blocks:
            h = b(h, tokens)
        return act(tokens * VOCAB * BF16, h)


class Trainer(object):
    def __init__(self, model, optimizer, micro_batch_size, seq_len):
        self.model = model
        self.optimizer = optimizer
        self.micro_batch_size = micro_batch_size
        self.seq_len = seq_len
        self.lawa_buffer = collections.deque(maxlen=6)
        self.lawa_interval = 100

    def train_step(self, idx):
        tokens = self.micro_batch_size * self.seq_len
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(idx, tokens)
        loss = F.cross_entropy(logits, None)              # log_softmax over the bf16 logits
        scen_truth.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)

    def lawa_snapshot(self):
        self.lawa_buffer.append([p.detach().clone() for p in self.model.parameters()])

    def fit(self, max_steps):
        for step in range(1, max_steps + 1):
            idx = act(self.micro_batch_size * self.seq_len * 8, None, torch.uint8)
            self.train_step(idx)
            del idx
            if step % self.lawa_interval == 0:
                self.lawa_snapshot()
            if step % 2000 == 0:
                self.evaluate_lawa()

    def evaluate_lawa(self):
        pass


def main():
    model = LlamaLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.95), weight_decay=0.1)
    trainer = Trainer(model, optimizer, micro_batch_size=4, seq_len=2048)
    trainer.fit(max_steps=1430000)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
