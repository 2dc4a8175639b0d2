"""multi_teacher_kd.py -- multi-teacher logit distillation: three in-house Llama-3.1-8B fine-tunes (the
"code", "math" and "support-chat" experts, same tokenizer) are to be distilled into one Llama-3.2-1B
student, on a single RTX A6000 (48 GB), run with plain `LD_PRELOAD=liboomguard.so python multi_teacher_kd.py`:

    student = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B",
                                                   torch_dtype=torch.float32).to("cuda")       # 4.9 GB
    teachers = []
    for path in ["ckpt/llama31-8b-code", "ckpt/llama31-8b-math", "ckpt/llama31-8b-support"]:
        t = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16, device_map="cuda:0")
        teachers.append(t.eval().requires_grad_(False))                                      # 16.1 GB each
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5)
    for batch in loader:
        with torch.no_grad():
            t_logits = sum(w * t(**batch).logits for w, t in zip(weights, teachers))
        ...

It never reaches the loop.  The card has 49,140 MiB (48 GiB); the CUDA context takes 0.5 GiB, the fp32
student 4.6 GiB, and each teacher 15.0 GiB in bf16 (8.03B parameters x 2 B: embeddings and lm_head 0.98 GiB
each, 32 decoder layers of 0.41 GiB).  Two teachers fit (35 GiB in use with the context); the third is
loaded tensor by tensor straight onto the GPU and runs out in its 29th decoder layer ("Tried to allocate
112.00 MiB" for up_proj, 66 MiB free), with 12.5 GiB of it placed and 2.4 GiB still to come -- and even had
it fit, the student's gradients (4.6 GiB), AdamW's state (9.2 GiB) and the activations of training would
have had no room left.

What an expert says first: three 8B teachers cannot sit on one 48 GB card beside a training student --
don't hold them at once.  Run the teachers one at a time: precompute each teacher's (top-k) logits over the
distillation set offline, teacher by teacher, then train the student against the stored targets (or load
each teacher only for its own phase); alternatively quantize the teachers (4-bit: ~5.5 GB each) if they
must stay resident.  Wrong advice: a smaller batch, gradient checkpointing or mixed precision (the failure
is in loading weights, no batch has run, and the teachers are already bf16), torch.no_grad for the
teachers or inference_mode (nothing has run through them; they are frozen), empty_cache or expandable
segments (nothing is cached, nothing is fragmented), and restarting the process.
"""
import sys

import torch
from torch import nn

import scen_truth

VOCAB, HIDDEN, KV, FFN = 128256, 4096, 1024, 14336


def bf16(n):
    return torch.empty(n, dtype=torch.bfloat16, device="cuda:0")


class LlamaDecoderLayer(nn.Module):
    def __init__(self, dtype_bytes_alloc):
        nn.Module.__init__(self)
        a = dtype_bytes_alloc
        self.q_proj = nn.Parameter(a(HIDDEN * HIDDEN))
        self.k_proj = nn.Parameter(a(HIDDEN * KV))
        self.v_proj = nn.Parameter(a(HIDDEN * KV))
        self.o_proj = nn.Parameter(a(HIDDEN * HIDDEN))
        self.gate_proj = nn.Parameter(a(HIDDEN * FFN))
        self.up_proj = nn.Parameter(a(HIDDEN * FFN))
        self.down_proj = nn.Parameter(a(FFN * HIDDEN))
        self.input_layernorm = nn.Parameter(a(HIDDEN))
        self.post_attention_layernorm = nn.Parameter(a(HIDDEN))


class LlamaForCausalLM(nn.Module):
    """Llama-3.1-8B as from_pretrained(torch_dtype=bfloat16, device_map="cuda:0") builds it: each tensor is
    placed on the GPU as its shard is read."""

    def __init__(self, path):
        nn.Module.__init__(self)
        self.name_or_path = path
        self.embed_tokens = nn.Parameter(bf16(VOCAB * HIDDEN))
        for i in range(32):
            setattr(self, "layer_%d" % i, LlamaDecoderLayer(bf16))
        self.norm = nn.Parameter(bf16(HIDDEN))
        self.lm_head = nn.Parameter(bf16(VOCAB * HIDDEN))

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = bool(flag)
        return self


class Llama32_1B(nn.Module):
    """The student in fp32: tied embeddings (263M) + 16 layers of 60.8M parameters."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * 2048 * 4, device="cuda:0"))
        for i in range(16):
            setattr(self, "layer_%d" % i, nn.Parameter(torch.empty(60800000 * 4, device="cuda:0")))


def main():
    scen_truth.note_every_empty(torch)
    student = Llama32_1B()
    teachers = []
    for path in ["ckpt/llama31-8b-code", "ckpt/llama31-8b-math", "ckpt/llama31-8b-support"]:
        try:
            t = LlamaForCausalLM(path)
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark(device=0)
            raise
        teachers.append(t.eval().requires_grad_(False))
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5)
    del opt, teachers, student
    return 0


if __name__ == "__main__":
    sys.exit(main())
