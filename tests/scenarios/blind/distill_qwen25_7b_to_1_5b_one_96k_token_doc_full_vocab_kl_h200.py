"""distill.py -- logit distillation of Qwen2.5-7B-Instruct (teacher, bf16, frozen, run under
torch.no_grad) into Qwen2.5-1.5B (student, full fine-tuning, fp32 master weights, bf16 autocast, AdamW,
gradient checkpointing and flash attention on) on one H200, PyTorch 2.6.  The data is a long-context
mix of documents, one per step (per_device_train_batch_size=1, no packing, no max_length: "the model
has a 128k context, let it see whole documents"):

    for input_ids in loader:                                      # one document, 2k-8k tokens mostly
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_logits = student(input_ids).logits                  # [1, L, 151936]
            with torch.no_grad():
                t_logits = teacher(input_ids).logits[..., :151936]
        loss = F.kl_div(F.log_softmax(s_logits / T, -1, dtype=torch.float32),
                        F.log_softmax(t_logits / T, -1, dtype=torch.float32), log_target=True, ...) * T * T
        loss.backward(); optimizer.step(); optimizer.zero_grad()

Four documents go through (the first optimizer step made AdamW's moments; weights and optimizer state
take 31 GiB).  The fifth is a 98,304-token repository dump.  For that one document the
full-vocabulary logits are 28 GiB each in bf16 (student, teacher, and the student's logits divided by T),
and the fp32 log-softmax of the student's is 56 GiB more: that request fails.  An 8k document needs
2.3 GiB per logits tensor.

An expert: one input is the whole peak, and its cost is the sequence length times the 152k vocabulary.
Cap the document length (split long documents into 8k-16k pieces or truncate them), or compute the KL
over the vocabulary in chunks of positions (a chunked / fused distillation loss that never holds the
full [L, V] logits).  Not a smaller batch (it is 1), not gradient checkpointing or flash attention
(both on), not the teacher's autograd (it is already under no_grad), not an 8-bit optimizer or ZeRO:
the weights and the optimizer state fit with 100 GiB to spare.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

BF16, FP32 = 2, 4


def act(nbytes, saved=None, dtype=torch.bfloat16):
    """an activation; `saved` is what autograd keeps for it (nothing under no_grad)."""
    t = torch.empty(nbytes // torch._ITEMSIZE[dtype], dtype=dtype, device="cuda")
    t._saved = saved if torch.is_grad_enabled() else None
    return t


def param(n_elems, dtype, trainable):
    t = torch.empty(n_elems, dtype=dtype, device="cuda")
    return torch.nn.Parameter(t, requires_grad=trainable)


class Attention(torch.nn.Module):
    def __init__(self, hidden, kv_dim, dtype, trainable):
        torch.nn.Module.__init__(self)
        self.q_proj = param(hidden * hidden, dtype, trainable)
        self.k_proj = param(hidden * kv_dim, dtype, trainable)
        self.v_proj = param(hidden * kv_dim, dtype, trainable)
        self.o_proj = param(hidden * hidden, dtype, trainable)
        self.hidden = hidden

    def forward(self, h, seq_len):
        w = (self.q_proj, self.k_proj, self.v_proj, self.o_proj)
        qkv = act(seq_len * self.hidden * 3 * BF16, h)            # flash attention: no L x L scores
        return act(seq_len * self.hidden * BF16, qkv)


class MLP(torch.nn.Module):
    def __init__(self, hidden, inter, dtype, trainable):
        torch.nn.Module.__init__(self)
        self.gate_proj = param(hidden * inter, dtype, trainable)
        self.up_proj = param(hidden * inter, dtype, trainable)
        self.down_proj = param(inter * hidden, dtype, trainable)
        self.hidden, self.inter = hidden, inter

    def forward(self, h, seq_len):
        w = (self.gate_proj, self.up_proj, self.down_proj)
        gate_up = act(seq_len * self.inter * 3 * BF16, h)
        return act(seq_len * self.hidden * BF16, gate_up)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.self_attn = Attention(cfg["hidden"], cfg["kv_dim"], dtype, trainable)
        self.mlp = MLP(cfg["hidden"], cfg["inter"], dtype, trainable)

    def forward(self, h, seq_len):
        # gradient checkpointing: the layer's internals are not kept; its input is, for the recompute
        out = self.mlp(self.self_attn(h, seq_len), seq_len)
        out._saved = h if torch.is_grad_enabled() else None
        return out


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype, trainable):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        self.embed_tokens = param(cfg["vocab"] * cfg["hidden"], dtype, trainable)
        self.lm_head = param(cfg["vocab"] * cfg["hidden"], dtype, trainable) if not cfg["tied"] else None
        self.layers = []
        for i in range(cfg["layers"]):
            layer = Qwen2DecoderLayer(cfg, dtype, trainable)
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = trainable

    def forward(self, input_ids, seq_len):
        emb = self.embed_tokens
        h = act(seq_len * self.cfg["hidden"] * BF16, input_ids)
        for layer in self.layers:
            h = layer(h, seq_len)
        head = self.lm_head
        return CausalLMOutput(act(seq_len * self.cfg["vocab"] * BF16, h))


TEACHER = dict(hidden=3584, kv_dim=512, inter=18944, layers=28, vocab=152064, tied=False)   # Qwen2.5-7B
STUDENT = dict(hidden=1536, kv_dim=256, inter=8960, layers=28, vocab=151936, tied=True)     # Qwen2.5-1.5B


def distill_loss(s_logits, t_logits, T):
    s = torch._derive(act(s_logits.nbytes, s_logits), s_logits)              # s_logits / T
    s_logp = F.log_softmax(s, -1, dtype=torch.float32)
    t_logp = F.log_softmax(act(t_logits.nbytes, None), -1, dtype=torch.float32)
    kl = torch._derive(act(512, s_logp, torch.uint8), s_logp)                # F.kl_div(..., log_target=True)
    kl._t = t_logp
    return kl


def main():
    teacher = Qwen2ForCausalLM(TEACHER, torch.bfloat16, trainable=False)
    teacher.eval()
    student = Qwen2ForCausalLM(STUDENT, torch.float32, trainable=True)
    student.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    per_device_train_batch_size = 1
    T = 2.0
    doc_lengths = [4096, 7680, 2048, 5120, 98304, 3072, 6144]     # tokens of each document, in loader order
    for step, seq_len in enumerate(doc_lengths):
        input_ids = act(seq_len * 8, None, torch.uint8)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_logits = student(input_ids, seq_len).logits
            with torch.no_grad():
                t_logits = teacher(input_ids, seq_len).logits
        loss = distill_loss(s_logits, t_logits, T)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, s_logits, t_logits, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
