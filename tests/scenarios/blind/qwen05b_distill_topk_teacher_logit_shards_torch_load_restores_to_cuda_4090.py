"""distill_student.py -- a small team distills Qwen2.5-7B-Instruct into Qwen2.5-0.5B for an on-device
assistant.  Step one ran weeks ago on a rented H100: the teacher went over their 71k-conversation SFT mix
(42M tokens) and saved its top-64 logits per token, 84 shards of 500k tokens:

    torch.save({"input_ids": ids.to(torch.int32), "topk_idx": top.indices.to(torch.int32),
                "topk_val": top.values.to(torch.bfloat16)}, f"shard_{k:03d}.pt")   # 194 MB each

Step two is this script, a full fine-tune of the student on the team's workstation (one RTX 4090, 24 GB,
23.5 GiB usable; 128 GB of RAM): fp32 weights (1.84 GiB), AdamW, bf16 autocast, gradient checkpointing,
micro-batches of 8 x 1024 tokens, and a KL loss against the teacher's top-64.  The shards are "small
enough for RAM", so the dataset reads them all up front:

    class TopKDistillDataset(torch.utils.data.Dataset):
        def __init__(self, root):
            self.shards = [torch.load(p) for p in sorted(glob.glob(f"{root}/shard_*.pt"))]

    loader = DataLoader(ds, batch_size=8, num_workers=0, collate_fn=collate)
    # (num_workers=4 died with "Cannot re-initialize CUDA in forked subprocess"; 0 "fixed" it)
    ...
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = model(batch["input_ids"])
    loss = kd_loss(out.logits, batch["topk_idx"], batch["topk_val"])   # log_softmax(logits, dtype=float32)

torch.load restores every tensor onto the device it was saved from: the teacher run never called .cpu(),
so all 84 shards (15.2 GiB) land on cuda:0, not in host RAM (the forked-worker error was the symptom).
The first micro-batch's forward goes through (weights 1.84 GiB, checkpointed layer inputs 0.33 GiB, bf16
logits 2.32 GiB), then the float32 log_softmax over the 151,936-word vocabulary (4.64 GiB) fails with
3.6 GiB free.  On the 4-shard pilot the same script peaked at about 20 GiB (backward included).

An expert: 15 GiB of the card is the teacher-logit dataset, restored to the GPU by torch.load because
the files remember cuda:0.  Load it with torch.load(p, map_location="cpu") (better, re-save the shards
from CPU tensors, or memory-map them), keep the dataset in host memory and move each batch; the workers
then work too.  Wrong first advice: a smaller micro-batch or a fused/chunked cross-entropy (each would
squeeze this step through with the dataset still on the GPU, and the backward pass and the AdamW state
of the first step come next), gradient checkpointing or mixed precision (both already on), an 8-bit
optimizer or LoRA (the optimizer state is not even made yet), empty_cache or expandable_segments (the
shards are live tensors), a bigger GPU.
"""
import glob
import os
import sys
import tempfile

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# torch ops the stand-in lacks, written as PyTorch's (C++ there: no frame of the program's), compiled under
# a torch file name for that
_TORCH_OPS = '''
int32 = "int32"
_ITEMSIZE.setdefault(int32, 4)


def stack(tensors, dim=0):
    n = sum(t.nbytes for t in tensors) // _ITEMSIZE[tensors[0].dtype]
    return empty(n, dtype=tensors[0].dtype, device=tensors[0].device)


def gather(input, dim, index):
    out = empty(index.nbytes // 4, dtype=float32, device=input.device)
    out._saved = input
    return _derive(out, input)
'''
exec(compile(_TORCH_OPS, os.path.join(os.path.dirname(torch.__file__), "functional.py"), "exec"), torch.__dict__)

K = 64
TOKENS_PER_SHARD = 500_000
N_SHARDS = 84
VOCAB, HIDDEN, INTER, LAYERS = 151_936, 896, 4_864, 24


class _Saved(object):
    """What the teacher run's torch.save wrote for a CUDA tensor (the stand-in's save needs only nbytes)."""

    def __init__(self, nbytes):
        self.nbytes = nbytes


def _teacher_run_left_these(root):
    """Test scaffolding: the 84 shard files the teacher run left on disk (saved from cuda:0)."""
    for k in range(N_SHARDS):
        torch.save({"input_ids": _Saved(TOKENS_PER_SHARD * 4), "topk_idx": _Saved(TOKENS_PER_SHARD * K * 4),
                    "topk_val": _Saved(TOKENS_PER_SHARD * K * 2)}, os.path.join(root, "shard_%03d.pt" % k))


class TopKDistillDataset(object):
    """torch.utils.data.Dataset over the teacher's shards: sequences of 1024 tokens with their top-64."""
    seq_len = 1024

    def __init__(self, root):
        self.shards = [torch.load(p) for p in sorted(glob.glob(os.path.join(root, "shard_*.pt")))]
        self.per_shard = TOKENS_PER_SHARD // self.seq_len

    def __len__(self):
        return len(self.shards) * self.per_shard

    def __getitem__(self, i):
        sh = self.shards[i // self.per_shard]
        # slices of the shard's tensors: views, no new memory
        return {"input_ids": sh["input_ids"].view(), "topk_idx": sh["topk_idx"].view(),
                "topk_val": sh["topk_val"].view()}


def collate(items):
    b = len(items)
    return {"input_ids": torch.empty(b * 1024, dtype=torch.int32, device="cuda"),
            "topk_idx": torch.empty(b * 1024 * K, dtype=torch.int32, device="cuda"),
            "topk_val": torch.empty(b * 1024 * K, dtype=torch.bfloat16, device="cuda")}


def DataLoader(ds, batch_size, num_workers=0, collate_fn=None, shuffle=False):
    for start in range(0, len(ds), batch_size):
        yield collate_fn([ds[i] for i in range(start, min(start + batch_size, len(ds)))])


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        attn = HIDDEN * HIDDEN * 2 + HIDDEN * 128 * 2
        self.self_attn = torch.nn.Module()
        self.self_attn.q_proj = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float32, device="cuda"))
        self.self_attn.kvo_proj = torch.nn.Parameter(torch.empty(attn - HIDDEN * HIDDEN, dtype=torch.float32,
                                                                 device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * INTER, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        # under checkpoint: nothing kept but the layer's input (saved by the caller); bf16 transients
        qkv = torch.empty(tokens * (HIDDEN + 256) * 2, device="cuda")
        attn_out = torch.empty(tokens * HIDDEN * 2, device="cuda")
        del qkv
        gate_up = torch.empty(tokens * INTER * 2 * 2, device="cuda")
        act = torch.empty(tokens * INTER * 2, device="cuda")
        del gate_up
        out = torch.empty(tokens * HIDDEN * 2, device="cuda")
        del act, attn_out
        return out


class Qwen2ForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, Qwen2DecoderLayer())
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 4
        hidden = torch.empty(tokens * HIDDEN * 2, device="cuda")
        saved = []
        for i in range(LAYERS):
            saved.append(hidden)                     # checkpoint keeps each layer's input
            hidden = getattr(self, "layer_%d" % i)(hidden, tokens)
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device="cuda")   # tied lm_head, bf16
        logits._saved = saved + [hidden]
        return CausalLMOutput(logits)


def kd_loss(logits, topk_idx, topk_val, temperature=1.0):
    s_logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
    s_top = torch.gather(s_logp, -1, topk_idx)
    return s_top


try:
    root = tempfile.mkdtemp(prefix="kd_top64_")
    _teacher_run_left_these(root)

    ds = TopKDistillDataset(root)
    print("dataset: %d sequences of 1024 tokens from %d shards" % (len(ds), len(ds.shards)))
    model = Qwen2ForCausalLM().cuda()
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    batch_size = 8
    loader = DataLoader(ds, batch_size=batch_size, num_workers=0, collate_fn=collate, shuffle=True)
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(batch["input_ids"])
        loss = kd_loss(out.logits, batch["topk_idx"], batch["topk_val"])
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0:
            print("step", step)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
