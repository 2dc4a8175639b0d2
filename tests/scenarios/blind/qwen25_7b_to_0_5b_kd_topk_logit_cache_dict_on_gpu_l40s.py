"""kd_topk.py -- word-level distillation of Qwen2.5-7B-Instruct (teacher, bf16) into Qwen2.5-0.5B-Instruct (student,
fp32 master weights, bf16 autocast, gradient checkpointing) on one L40S (48 GB), 40k chat samples packed to 1024
tokens, batch 8, three epochs.  To save two thirds of the teacher's compute the user runs the teacher only in
epoch 1 and caches, per sample, its top-256 log-probabilities (>99.9% of the mass) and their token ids, reused
in epochs 2 and 3:

    logit_cache = {}        # sample idx -> (top-k teacher log-probs, top-k token ids)
    for epoch in range(3):
        for batch in loader:
            if epoch == 0:
                with torch.no_grad():
                    t_logits = teacher(input_ids=batch["input_ids"]).logits
                    t_logp = F.log_softmax(t_logits.float() / T, dim=-1)
                    topv, topi = t_logp.topk(256, dim=-1)              # [8, 1024, 256]
                for j, i in enumerate(batch["idx"].tolist()):
                    logit_cache[i] = (topv[j], topi[j])                # "3 MB a sample, tiny"
            else:
                topv = torch.stack([logit_cache[i][0] for i in idx]); topi = ...
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s_logits = student(input_ids=batch["input_ids"]).logits
            s_logp = F.log_softmax(s_logits.float() / T, dim=-1).gather(-1, topi)
            loss = -(topv.exp() * s_logp).sum(-1).mean() * T * T
            loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if epoch == 0:
            del teacher; torch.cuda.empty_cache()

The cache lives where topk made it, on the GPU: every step adds 8 x 1024 x 256 x (4 + 8) bytes = 24 MiB
(fp32 values, int64 ids), and the views topv[j] keep each batch's tensors alive.  The whole epoch would need
5000 x 24 MiB = 117 GiB.  The first steps run at a steady peak of about 36 GiB (teacher 14.2 GiB, student with
gradients and AdamW 7.4 GiB, the vocab-sized logits of both models); the run dies at step 363 of 5000 (about
15 minutes into epoch 1), when the cache has taken the last 8.5 GiB, at an ordinary allocation of the step (a
gradient in backward).

An expert: memory grows by the same amount every step and a Python dict, logit_cache, holds it: the teacher's
targets are a dataset, not GPU state.  Move each entry off the GPU as it is made (topv[j].to("cpu",
torch.float16), topi[j].to("cpu", torch.int32): 1.5 MB a sample, 59 GB of host RAM for the set), or better
write them to disk shards in a separate teacher pass and load them with each batch, as offline-KD pipelines do;
bounding the GPU cache (an LRU of a few GiB) stops the growth too, at the price of rerunning the teacher
for what it evicts.
Wrong first advice: a smaller batch or gradient checkpointing (already on; a smaller batch changes how many steps
it survives, not whether it dies), mixed precision or loading in bf16 (the teacher and autocast already are),
torch.no_grad for the teacher (it already runs under no_grad: the cached tensors carry no graph),
expandable_segments / empty_cache (live tensors, not cache or holes; the loop already calls empty_cache when
the teacher goes), quantizing the teacher, an 8-bit optimizer, a bigger GPU (a card twice as big dies in epoch
1 too).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB, GiB = 1 << 20, 1 << 30
T = 2.0
K = 256


# ---- stand-in gaps: the two Qwen2 models as their parameters of the real sizes (one tensor per decoder layer) and
# the tensors a forward pass makes, sized as PyTorch's; Tensor.float / Tensor.topk / Tensor.gather / Tensor.__getitem__.
# Compiled as part of torch's file so that the failing line stays the program's own.
_GAPS = """
def _float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._rows = getattr(self, "_rows", 1)
    return torch._derive(out, self)

def _topk(self, k, dim=-1):
    rows = self._rows
    values = torch.empty(rows * k, dtype=self.dtype, device=self.device)
    indices = torch.empty(rows * k, dtype="int64", device=self.device)
    values._rows = indices._rows = rows
    return values, indices

def _gather(self, dim, index):
    out = torch.empty(index.nbytes // 8, dtype=self.dtype, device=self.device)
    out._saved = self
    return torch._derive(out, self)

def _getitem(self, j):
    return self.view()
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["_float"]
torch.Tensor.topk = _ns["_topk"]
torch.Tensor.gather = _ns["_gather"]
torch.Tensor.__getitem__ = _ns["_getitem"]
torch._ITEMSIZE["int64"] = 8


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self, cfg, dtype):
        torch.nn.Module.__init__(self)
        self.cfg, self.dtype = cfg, dtype
        h, kv, inter = cfg["hidden"], cfg["kv"], cfg["inter"]
        per_layer = h * h + h + 2 * (h * kv + kv) + h * h + 3 * h * inter + 2 * h
        self.embed_tokens = torch.nn.Parameter(torch.empty(cfg["vocab"] * h, dtype=dtype, device="cuda"))
        for i in range(cfg["layers"]):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(per_layer, dtype=dtype, device="cuda")))
        self.norm = torch.nn.Parameter(torch.empty(h, dtype=dtype, device="cuda"))
        if not cfg["tied"]:
            self.lm_head = torch.nn.Parameter(torch.empty(h * cfg["vocab"], dtype=dtype, device="cuda"))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        tokens = input_ids["tokens"]
        h, inter = self.cfg["hidden"], self.cfg["inter"]
        cdt = torch.bfloat16 if torch.is_autocast_enabled() else self.dtype
        hidden = torch.empty(tokens * h, dtype=self.dtype, device="cuda")
        checkpoints = []
        for i in range(self.cfg["layers"]):
            getattr(self, "layer%d" % i)
            # one decoder layer's working set (attention, MLP): freed when the layer returns
            work = torch.empty(tokens * (6 * h + 3 * inter) * 2, dtype=torch.uint8, device="cuda")
            del work
            if torch.is_grad_enabled() and self.gradient_checkpointing:
                checkpoints.append(hidden)                  # checkpoint: only the layer's input is kept
            hidden = torch.empty(tokens * h, dtype=self.dtype, device="cuda")
        logits = torch.empty(tokens * self.cfg["vocab"], dtype=cdt, device="cuda")
        logits._rows = tokens
        if torch.is_grad_enabled():
            logits._saved = checkpoints + [hidden]
        return Output(logits)


class Output(object):
    def __init__(self, logits):
        self.logits = logits


CONFIGS = {
    "Qwen/Qwen2.5-7B-Instruct": dict(hidden=3584, inter=18944, layers=28, kv=512, vocab=152064, tied=False),
    "Qwen/Qwen2.5-0.5B-Instruct": dict(hidden=896, inter=4864, layers=24, kv=128, vocab=151936, tied=True),
}


def from_pretrained(name, torch_dtype):
    """AutoModelForCausalLM.from_pretrained(name, torch_dtype=...).to("cuda")"""
    return Qwen2ForCausalLM(CONFIGS[name], torch_dtype)


def backward(loss, model, tokens):
    """loss.backward() with checkpointing: the gradient of the logits (their size, fp32) and one recomputed
    layer at a time are temporaries of the backward; the saved tensors are freed after it, as PyTorch does."""
    cfg = model.cfg
    dlogits = torch.empty(tokens * cfg["vocab"], dtype=torch.float32, device="cuda")
    recompute = torch.empty(tokens * (6 * cfg["hidden"] + 3 * cfg["inter"]) * 2, dtype=torch.uint8, device="cuda")
    loss.backward()
    del dlogits, recompute
    todo = [loss]
    while todo:
        t = todo.pop()
        v = getattr(t, "_saved", None)
        if v is not None:
            t._saved = None
            todo.extend(v if isinstance(v, (list, tuple)) else [v])
# ----


def loader(num_samples=40000, batch_size=8, seq_len=1024):
    for b in range(num_samples // batch_size):
        yield {"idx": list(range(b * batch_size, (b + 1) * batch_size)),
               "input_ids": {"tokens": batch_size * seq_len}}


def main():
    teacher = from_pretrained("Qwen/Qwen2.5-7B-Instruct", torch_dtype=torch.bfloat16).eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    student = from_pretrained("Qwen/Qwen2.5-0.5B-Instruct", torch_dtype=torch.float32)
    student.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(student.parameters(), lr=2e-5)
    logit_cache = {}

    for epoch in range(3):
        for step, batch in enumerate(loader()):
            tokens = batch["input_ids"]["tokens"]
            if epoch == 0:
                with torch.no_grad():
                    t_logits = teacher(input_ids=batch["input_ids"]).logits
                    t_logp = F.log_softmax(t_logits.float(), dim=-1)
                    t_logp._rows = tokens
                    del t_logits
                    topv, topi = t_logp.topk(K, dim=-1)
                    del t_logp
                for j, i in enumerate(batch["idx"]):
                    logit_cache[i] = (topv[j], topi[j])
            with torch.autocast("cuda", dtype=torch.bfloat16):
                s_logits = student(input_ids=batch["input_ids"]).logits
            s_logp = F.log_softmax(s_logits.float(), dim=-1).gather(-1, topi)
            loss = F.nll_loss(s_logp, topv)        # -(topv.exp() * s_logp).sum(-1).mean() * T * T
            del s_logits, s_logp
            backward(loss, student, tokens)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, topv, topi
            if step % 50 == 0:
                print("epoch %d step %d: allocated %.2f GiB, cache %d samples" % (
                    epoch, step, torch.cuda.memory_allocated() / GiB, len(logit_cache)))
        if epoch == 0:
            del teacher
            torch.cuda.empty_cache()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
