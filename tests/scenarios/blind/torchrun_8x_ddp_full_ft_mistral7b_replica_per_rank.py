"""train_ddp.py -- full fine-tuning of Mistral-7B (7.2B parameters, fp32 master weights, bf16 autocast,
gradient checkpointing) on one node of 8 x L40S 48 GB, launched with

    torchrun --nproc-per-node 8 train_ddp.py

    local_rank = int(os.environ["LOCAL_RANK"]); torch.cuda.set_device(local_rank)
    model = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1").cuda()     # fp32
    model.gradient_checkpointing_enable()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:                                   # 2 x 4096 tokens per rank
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad()

"8 x 48 GB = 384 GB, a 7B model is 27 GiB, that must be enough."  But DDP replicates: every rank
holds the whole fp32 model (27 GiB) and, from the moment DDP wraps it, DDP's gradient buckets (a
second 27 GiB, the flat copies of the gradients it all-reduces); then it would need autocast's bf16
copies of the weights during forward (13.5 GiB), the gradients themselves (27 GiB) and AdamW's moments
(54 GiB).  DDP(model) itself runs out on every rank while the reducer allocates its buckets; this
dump is rank 3's (GPU 3), the others fail the same way.

An expert: eight GPUs are there but each is asked to hold a full replica of weights, gradients and
optimizer state; shard them -- FSDP FULL_SHARD / DeepSpeed ZeRO-3 over the 8 ranks puts about 14 GiB
of model state on each GPU.  gradient_as_bucket_view=True saves one copy of the gradients but the
gradients plus AdamW state would still not fit beside the weights; an 8-bit optimizer does not cover
it either.  The batch, the sequence length and checkpointing are not it (no activation exists yet),
and the ranks are already each on their own GPU (set_device is right).
"""
import os
import sys

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

MiB = 1 << 20
LAYERS, HIDDEN, VOCAB = 32, 4096, 32000
BATCH, SEQ = 2, 4096
scen_truth.note_every_empty(torch)


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = torch.nn.Parameter(torch.empty(10 * HIDDEN * HIDDEN // 4, dtype=torch.float32, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(3 * HIDDEN * 14336, dtype=torch.float32, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, hidden):
        # autocast's bf16 copies of this layer's weights (kept in its cache for the forward), the
        # checkpointed layer's output
        w16 = torch.empty(self.self_attn.nbytes // 2 + self.mlp.nbytes // 2, device="cuda")
        out = torch.empty(BATCH * SEQ * HIDDEN * 2, device="cuda")
        out._saved = hidden
        out._w16 = w16
        return out


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.layers = [MistralDecoderLayer() for _ in range(LAYERS)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))

    def forward(self, input_ids, labels):
        h = torch.empty(BATCH * SEQ * HIDDEN * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(BATCH * SEQ * VOCAB * 4, device="cuda")
        logits._saved = h
        return torch.nn.functional.cross_entropy(logits, labels)

    @classmethod
    def from_pretrained(cls, name):
        return cls()


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    model = MistralForCausalLM.from_pretrained("mistralai/Mistral-7B-v0.1").cuda()
    model.train()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(100000):
        input_ids = torch.empty(BATCH * SEQ * 8, device="cuda")
        labels = torch.empty(BATCH * SEQ * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above (at the failure itself)
sys.exit(0)
