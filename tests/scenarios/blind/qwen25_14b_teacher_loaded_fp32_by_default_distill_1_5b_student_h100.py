"""distill.py -- logit distillation of Qwen2.5-14B-Instruct (teacher) into Qwen2.5-1.5B-Instruct (student) on one
H100 80GB, a plain PyTorch loop written from the Hugging Face KD blog post (transformers 4.46):

    teacher = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct").to("cuda").eval()
    teacher.requires_grad_(False)
    student = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct").to("cuda")   # fp32 master weights
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    for batch in loader:                                   # 2 sequences x 2048 tokens
        with torch.no_grad():
            t_logits = teacher(**batch).logits[..., :151936]        # the teacher's vocab is padded to 152064
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_logits = student(**batch).logits
        loss = kd_loss(s_logits, t_logits, T=2.0)           # KL(softmax(t/T) || log_softmax(s/T)) * T^2
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

The user did the sums for a bf16 teacher (29.5 GB) -- Qwen2.5's config.json says torch_dtype bfloat16 -- but
from_pretrained without torch_dtype loads float32 in this transformers version: the teacher alone holds 55.0 GiB
of the card's 79.6.  With the student's 5.75 GiB of fp32 weights and the teacher's fp32 logits of the first batch
(2 x 2048 x 152064 x 4 bytes = 2.32 GiB), 63.6 GiB are taken before the student's forward starts; the student's
forward (about 0.4 GiB of saved activations per decoder layer at 4096 tokens, plus autocast's bf16 copies of its
weights) gets through its 28 layers and fails at its last line, where modeling_qwen2 upcasts the logits to
float32 (2.32 GiB asked, 1.25 GiB free), on the very first step.

An expert: the teacher is in float32 -- load it as its checkpoint is stored: from_pretrained(...,
torch_dtype=torch.bfloat16) (or "auto") takes it to 27.5 GiB, and the whole step (student weights, gradients,
AdamW state, activations, the vocab-sized tensors of the KD loss) then peaks at about 70 GiB, at the batch the run
was planned for.  Quantizing the teacher to 8 bits would also fit but degrades the very logits the student learns
from; a second thought, not the first.
Wrong first advice: gradient checkpointing or a smaller batch (the activations fail first only because the
teacher took 27.5 GiB too much: at micro-batch 1 with checkpointing the first optimizer.step() -- gradients 5.75
GiB, AdamW's moments 11.5 GiB -- lands within a GiB of the card's end next to a 55 GiB teacher, at half the
tokens per step, and the first longer batch fails again); torch.no_grad / inference_mode for the teacher (it
already runs under no_grad and requires no grad); mixed precision (the student already runs under autocast;
autocast does not shrink the teacher's stored weights); an 8-bit optimizer, LoRA or ZeRO for the student (its
optimizer state does not exist yet and is not what fills the card); expandable_segments / empty_cache (nothing
is cached or fragmented); a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


# ---- stand-in gaps: what transformers' modeling_qwen2 allocates, sized as the real model; nn.Linear / Embedding /
# RMSNorm as Parameters of the real shapes.  The stand-in torch computes nothing: each op makes its output tensor.
class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out, bias, dtype):
        torch.nn.Module.__init__(self)
        self.n_out = n_out
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out, dtype=dtype, device="cuda"))
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(n_out, dtype=dtype, device="cuda"))

    def forward(self, tokens, dtype):
        out = torch.empty(tokens * self.n_out, dtype=dtype, device="cuda")
        return out


class Qwen2RMSNorm(torch.nn.Module):
    def __init__(self, h, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(h, dtype=dtype, device="cuda"))


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        h, kv, inter = cfg["hidden_size"], cfg["kv_dim"], cfg["intermediate_size"]
        self.h, self.inter = h, inter
        self.input_layernorm = Qwen2RMSNorm(h, dtype)
        self.q_proj = Linear(h, h, True, dtype)
        self.k_proj = Linear(h, kv, True, dtype)
        self.v_proj = Linear(h, kv, True, dtype)
        self.o_proj = Linear(h, h, False, dtype)
        self.post_attention_layernorm = Qwen2RMSNorm(h, dtype)
        self.gate_proj = Linear(h, inter, False, dtype)
        self.up_proj = Linear(h, inter, False, dtype)
        self.down_proj = Linear(inter, h, False, dtype)

    def forward(self, hidden, tokens):
        grad = torch.is_grad_enabled()
        cdt = torch.bfloat16 if torch.is_autocast_enabled() else hidden.dtype
        if torch.is_autocast_enabled():
            # autocast's cache: a bf16 copy of each fp32 weight this layer uses, kept until autocast exits
            _AUTOCAST_WEIGHT_CACHE.append(torch.empty(sum(p.nbytes for p in self.parameters()) // 2,
                                                      dtype=torch.uint8, device="cuda"))
        saved = []
        normed = torch.empty(tokens * self.h, dtype=cdt, device="cuda")
        q = self.q_proj(tokens, cdt)
        k = self.k_proj(tokens, cdt)
        v = self.v_proj(tokens, cdt)
        attn = torch.empty(tokens * self.h, dtype=cdt, device="cuda")         # SDPA (flash) output
        o = self.o_proj(tokens, cdt)
        resid = torch.empty(tokens * self.h, dtype=hidden.dtype, device="cuda")
        normed2 = torch.empty(tokens * self.h, dtype=cdt, device="cuda")
        gate = self.gate_proj(tokens, cdt)
        up = self.up_proj(tokens, cdt)
        act = torch.empty(tokens * self.inter, dtype=cdt, device="cuda")       # silu(gate)
        prod = torch.empty(tokens * self.inter, dtype=cdt, device="cuda")      # act * up
        down = self.down_proj(tokens, cdt)
        out = torch.empty(tokens * self.h, dtype=hidden.dtype, device="cuda")
        if grad:
            saved = [hidden, normed, q, k, v, attn, o, resid, normed2, gate, up, act, prod, down]
            out._saved = saved
        return out


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.cfg = cfg
        h = cfg["hidden_size"]
        self.embed_tokens = torch.nn.Parameter(torch.empty(cfg["vocab_size"] * h, dtype=dtype, device="cuda"))
        for i in range(cfg["num_hidden_layers"]):
            setattr(self, "layer%d" % i, Qwen2DecoderLayer(cfg, dtype))
        self.norm = Qwen2RMSNorm(h, dtype)
        if not cfg["tie_word_embeddings"]:
            self.lm_head = torch.nn.Parameter(torch.empty(h * cfg["vocab_size"], dtype=dtype, device="cuda"))
        self.dtype = dtype

    def forward(self, input_ids, tokens):
        h = self.cfg["hidden_size"]
        hidden = torch.empty(tokens * h, dtype=self.dtype, device="cuda")
        for i in range(self.cfg["num_hidden_layers"]):
            hidden = getattr(self, "layer%d" % i)(hidden, tokens)
        cdt = torch.bfloat16 if torch.is_autocast_enabled() else self.dtype
        normed = torch.empty(tokens * h, dtype=cdt, device="cuda")
        logits = torch.empty(tokens * self.cfg["vocab_size"], dtype=cdt, device="cuda")
        logits = logits if logits.dtype == torch.float32 else _upcast(logits)   # logits = logits.float()
        if torch.is_grad_enabled():
            logits._saved = [hidden, normed]
        return CausalLMOutputWithPast(logits)


def _upcast(t):
    out = torch.empty(t.nbytes // 2, dtype=torch.float32, device="cuda")
    out._saved = t
    return out


_AUTOCAST_WEIGHT_CACHE = []


class AutoModelForCausalLM(object):
    CONFIGS = {
        "Qwen/Qwen2.5-14B-Instruct": dict(hidden_size=5120, intermediate_size=13824, num_hidden_layers=48,
                                          kv_dim=1024, vocab_size=152064, tie_word_embeddings=False),
        "Qwen/Qwen2.5-1.5B-Instruct": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                                           kv_dim=256, vocab_size=151936, tie_word_embeddings=True),
    }

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, **kw):
        # transformers < 4.56: without torch_dtype the weights are loaded in torch's default dtype, float32,
        # whatever config.json's torch_dtype says ("bfloat16" for Qwen2.5)
        dtype = torch_dtype or torch.get_default_dtype()
        return Qwen2ForCausalLM(cls.CONFIGS[name], dtype)


def kd_loss(s_logits, t_logits, T=2.0):
    """KL(softmax(t/T) || softmax(s/T)) * T^2, as the blog post writes it (F.kl_div on log-probs)."""
    s_logp = F.log_softmax(s_logits, dim=-1)
    t_logp = F.log_softmax(t_logits, dim=-1)
    kl = F.nll_loss(s_logp, t_logp)            # F.kl_div(s_logp, t_logp, log_target=True, reduction="batchmean")
    return kl


def backward(loss):
    """loss.backward(), then what PyTorch does to the graph (retain_graph=False): the saved tensors are freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        v = getattr(t, "_saved", None)
        if v is not None:
            t._saved = None
            todo.extend(v if isinstance(v, (list, tuple)) else [v])
# ----


def batches(n, batch_size=2, seq_len=2048):
    for _ in range(n):
        yield {"input_ids": None, "tokens": batch_size * seq_len}


def main():
    teacher = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct").to("cuda").eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct").to("cuda")
    print("teacher %.2f GiB, student %.2f GiB on the GPU" % (sum(p.nbytes for p in teacher.parameters()) / GiB,
                                                             sum(p.nbytes for p in student.parameters()) / GiB))
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    for step, batch in enumerate(batches(2000)):
        with torch.no_grad():
            t_logits = teacher(batch["input_ids"], batch["tokens"]).logits        # [..., :151936]
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_logits = student(batch["input_ids"], batch["tokens"]).logits
        del _AUTOCAST_WEIGHT_CACHE[:]
        loss = kd_loss(s_logits, t_logits, T=2.0)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, s_logits, t_logits
        if step % 10 == 0:
            print("step", step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
