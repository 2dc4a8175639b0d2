"""kd_train.py -- logit distillation of Llama-3.1-8B-Instruct (teacher) into Llama-3.2-1B (student) on a node
with two A100 40GB, run with plain `LD_PRELOAD=liboomguard.so python kd_train.py`:

    teacher = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct",
                                                   torch_dtype=torch.bfloat16, device_map="auto").eval()
    student = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-1B", torch_dtype=torch.float32).to("cuda:0")
    opt = torch.optim.AdamW(student.parameters(), lr=2e-5)
    for batch in loader:                                              # 4 sequences x 2048 tokens
        with torch.no_grad():
            t_logits = teacher(**batch).logits.to("cuda:0")           # bf16 (4, 2048, 128256): 2.1 GB
        with torch.autocast("cuda", dtype=torch.bfloat16):
            s_logits = student(**batch.to("cuda:0")).logits
        loss = F.kl_div(F.log_softmax(s_logits, -1, dtype=torch.float32),
                        F.log_softmax(t_logits, -1, dtype=torch.float32), log_target=True)
        loss.backward(); opt.step(); opt.zero_grad()

The author meant "teacher on the second card, student on the first", but device_map="auto" balances the
teacher over every visible GPU: embeddings + layers 0-15 (8.0 GB bf16) land on GPU 0 -- the student's
card -- and layers 16-31 + lm_head (8.0 GB) on GPU 1.  GPU 0 then holds the CUDA context (0.5 GiB), half
the teacher (7.5 GiB), the fp32 student (4.6 GiB), and from the first optimizer step on its gradients-to-be
(4.6 GiB) and AdamW's two moments (9.2 GiB).  The first step fits (its peak is 34.6 GiB allocated: 16 layers
x 0.67 GiB of bf16 activations, the student's logits, both float32 log-softmaxes of 3.9 GiB, the teacher's
logits copied over).  From the first step on AdamW keeps its 9.2 GiB, and the second step fails on GPU 0 at
the student's float32 log-softmax: "Tried to allocate 3.91 GiB ... 2.40 GiB is free", with the teacher's own
3.9 GiB log-softmax still to come -- ~5.5 GiB short in all -- while GPU 1 holds only the other half of the
teacher (7.5 GiB) and has 30 GiB free.

What an expert says first: the placement is the bug -- half of a frozen teacher sits on the one card that
also trains the student while the other card is three-quarters empty.  Put the whole teacher on GPU 1
(device_map={"": 1}, or max_memory={0: "0GiB", 1: "38GiB"}); that frees 7.5 GiB on GPU 0, more than the
shortfall, without touching the training recipe.  Later options (a smaller batch with accumulation, an 8-bit
optimizer, checkpointing) are fine but secondary.  Wrong advice: torch.no_grad / inference_mode for the
teacher (it already runs under no_grad and is frozen), empty_cache or expandable segments (nothing is
cached or fragmented), CPU offload of the teacher (GPU 1 has room), and a bigger GPU.
"""
import sys

import torch
import torch.nn.functional as F
from torch import nn

import scen_truth

MiB = 1 << 20
SEQS, SEQ_LEN = 4, 2048
TOKENS = SEQS * SEQ_LEN
VOCAB = 128256


def bf16(n, device):
    return torch.empty(n, dtype=torch.bfloat16, device=device)


class Llama31_8B(nn.Module):
    """The teacher as device_map="auto" placed it (bf16, frozen): embeddings + layers 0-15 on cuda:0,
    layers 16-31 + norm + lm_head on cuda:1 (each decoder layer 218M parameters)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(bf16(VOCAB * 4096, "cuda:0"), requires_grad=False)
        for i in range(32):
            setattr(self, "layer_%d" % i, nn.Parameter(bf16(218 * 1000 * 1000, "cuda:0" if i < 16 else "cuda:1"),
                                                     requires_grad=False))
        self.lm_head = nn.Parameter(bf16(VOCAB * 4096, "cuda:1"), requires_grad=False)

    def forward(self, input_ids):
        h = bf16(TOKENS * 4096, "cuda:0")                 # hidden states on GPU 0, then moved to GPU 1
        h1 = bf16(TOKENS * 4096, "cuda:1")
        del h
        logits = bf16(TOKENS * VOCAB, "cuda:1")           # (4, 2048, 128256) bf16 on the last device
        del h1
        return logits


class Llama32_1B(nn.Module):
    """The student, fp32 weights (1.24B: tied embeddings 263M + 16 layers x 60.8M)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * 2048 * 4, device="cuda:0"))
        self.layers = []
        for i in range(16):
            p = nn.Parameter(torch.empty(60800000 * 4, device="cuda:0"))
            setattr(self, "layer_%d" % i, p)
            self.layers.append(p)

    def forward(self, input_ids):
        x = bf16(TOKENS * 2048, "cuda:0")
        x._saved = input_ids
        for i in range(16):
            # what one decoder layer keeps for backward under bf16 autocast: norm outputs, q/k/v, attention
            # output, gate/up projections (8192 wide) and their product: ~0.65 GiB at 8,192 tokens
            for n in (2048, 2048, 1024, 2048, 2048, 8192, 8192, 8192, 8192, 2048):
                a = bf16(TOKENS * n, "cuda:0")
                a._saved = x
                x = a
            getattr(self, "layer_%d" % i)
        logits = bf16(TOKENS * VOCAB, "cuda:0")           # tied lm_head, bf16 under autocast
        logits._saved = x
        return logits


def main():
    scen_truth.note_every_empty(torch)
    teacher = Llama31_8B().eval()
    student = Llama32_1B()
    opt = torch.optim.AdamW(student.parameters(), lr=2e-5)
    for step in range(2000):
        input_ids = torch.empty(TOKENS * 8, device="cuda:0")
        try:
            with torch.no_grad():
                t_logits = teacher(input_ids)
                t_logits0 = bf16(TOKENS * VOCAB, "cuda:0")              # .to("cuda:0")
                del t_logits
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s_logits = student(input_ids)
            s_lsm = F.log_softmax(s_logits, -1, dtype=torch.float32)
            with torch.no_grad():
                t_lsm = F.log_softmax(t_logits0, -1, dtype=torch.float32)
            loss = F.nll_loss(s_lsm, t_lsm)                              # the KL term's reduction
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark(device=0)
            raise
        del s_logits, t_logits0, t_lsm, s_lsm
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad()
        del loss
    return 0


if __name__ == "__main__":
    sys.exit(main())
