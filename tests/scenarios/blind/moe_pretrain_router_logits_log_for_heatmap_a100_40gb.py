"""pretrain_moe.py -- pretraining a small Qwen3-MoE-style mixture-of-experts LM from scratch (16 layers,
d_model 1024, 128 experts of 256 hidden units, top-8 routing, 1.78B parameters in all) on one A100 40GB,
PyTorch 2.1, fp32 master weights with bf16 autocast, AdamW, gradient checkpointing on, micro-batch
8 x 4096 tokens, a chunked (Liger-style) fused linear cross-entropy, gradients zeroed in place
(zero_grad(set_to_none=False), as the codebase it came from does).  The model returns each layer's
router logits for the load-balancing loss, and the user wanted a heatmap of expert load every 500
steps, so the trainer keeps them:

    out = model(input_ids, output_router_logits=True)
    loss = fused_linear_cross_entropy(out.last_hidden_state, model.lm_head.weight, labels) + aux_loss
    self.router_logits_log.append(out.router_logits)     # tuple of 16 x [32768, 128] fp32, not detached
    if step % 500 == 0: self.plot_expert_load(); self.router_logits_log.clear()

Each step adds 16 router-logit tensors of 16 MiB (256 MiB a step); their graphs are freed by backward,
the tensors themselves stay.  Weights, gradients and AdamW moments take 26.6 GiB and a step's own
transient peak (checkpointed layer inputs, one 786 MiB chunk of fp32 logits) under 2 GiB, so the run
starts with ~11 GiB to spare and dies at step 39 -- long before the first heatmap at step 500 -- in the
loss's logits chunk, the largest allocation of a step.  At the failure the allocator caches 0.75 GiB
in pieces of split segments besides 0.3 GiB free: enough for that chunk, not for the next two steps.

An expert: the memory rises by the same amount every step; the list of router logits is what holds it.
Keep only what the heatmap needs -- per-expert token counts (a bincount of the top-k indices, 128
numbers a layer) moved to the CPU each step, or `.detach().cpu()` -- or bound the log.  Not a smaller
batch, checkpointing, a smaller logits chunk or an 8-bit optimizer: the step's own peak fitted for 38
steps.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

D, LAYERS, EXPERTS, EXPERT_FFN, VOCAB = 1024, 16, 128, 256, 50304
CE_CHUNK = 4096
BF16, FP32 = 2, 4


def weight(n_elems):
    return torch.nn.Parameter(torch.empty(n_elems * FP32, device="cuda"))     # fp32 master weights


def act(nbytes, saved=None, dtype=torch.bfloat16):
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved
    return t


class Attention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = weight(D * D)
        self.k_proj = weight(D * D)
        self.v_proj = weight(D * D)
        self.o_proj = weight(D * D)

    def forward(self, h, tokens):
        q, k, v, o = self.q_proj, self.k_proj, self.v_proj, self.o_proj
        return act(tokens * D * BF16, h)


class SparseMoeBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.gate = weight(D * EXPERTS)
        self.w_gate_up = weight(EXPERTS * D * 2 * EXPERT_FFN)
        self.w_down = weight(EXPERTS * EXPERT_FFN * D)

    def forward(self, h, tokens):
        gate, w1, w2 = self.gate, self.w_gate_up, self.w_down
        router_logits = act(tokens * EXPERTS * FP32, h, torch.float32)        # the router runs in fp32
        return act(tokens * D * BF16, router_logits), router_logits


class OlmoeDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Attention()
        self.mlp = SparseMoeBlock()

    def forward(self, h, tokens):
        # under torch.utils.checkpoint: only the layer's input is kept for backward; the layer returns
        # its output and the router logits
        a = self.self_attn(h, tokens)
        a._saved = h
        return self.mlp(a, tokens)


class MoeOutput(object):
    def __init__(self, last_hidden_state, router_logits):
        self.last_hidden_state = last_hidden_state
        self.router_logits = router_logits


def fused_linear_cross_entropy(hidden, lm_head, tokens):
    """the loss over the vocabulary in chunks of CE_CHUNK tokens (Liger-style): each chunk's fp32 logits
    live only while its loss and its gradient wrt the hidden states are computed."""
    grad_hidden = act(tokens * D * BF16, hidden)
    for start in range(0, tokens, CE_CHUNK):
        logits_chunk = act(CE_CHUNK * VOCAB * FP32, hidden, torch.float32)
        del logits_chunk
    loss = torch._derive(act(512, grad_hidden, torch.uint8), hidden, lm_head)
    return loss


class OlmoeForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * D)
        self.lm_head = weight(VOCAB * D)
        self.layers = []
        for i in range(LAYERS):
            layer = OlmoeDecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = True

    def forward(self, input_ids, tokens, output_router_logits=True):
        emb = self.embed_tokens
        h = act(tokens * D * BF16, input_ids)
        all_router_logits = []
        for layer in self.layers:
            h, router_logits = layer(h, tokens)
            all_router_logits.append(router_logits)
        return MoeOutput(h, tuple(all_router_logits))


class MoETrainer(object):
    def __init__(self, model, optimizer, micro_batch_size, seq_len):
        self.model = model
        self.optimizer = optimizer
        self.micro_batch_size = micro_batch_size
        self.seq_len = seq_len
        self.router_logits_log = []

    def train_step(self, step, input_ids):
        tokens = self.micro_batch_size * self.seq_len
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = self.model(input_ids, tokens, output_router_logits=True)
        loss = fused_linear_cross_entropy(out.last_hidden_state, self.model.lm_head, tokens)  # (+ aux loss)
        self.router_logits_log.append(out.router_logits)
        scen_truth.backward(loss)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=False)
        if step % 500 == 0:
            self.plot_expert_load()

    def plot_expert_load(self):
        self.router_logits_log.clear()


def main():
    model = OlmoeForCausalLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
    trainer = MoETrainer(model, optimizer, micro_batch_size=8, seq_len=4096)
    for step in range(1, 100001):
        input_ids = act(8 * 4096 * 8, None, torch.uint8)
        trainer.train_step(step, input_ids)
        del input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
