"""finetune_3b.py -- full fine-tuning of a 3.2B-parameter LM (28 layers, hidden 3072, vocabulary
128k) on one 24 GiB card, "made to fit" the usual way: bf16 autocast, gradient checkpointing on,
micro-batch 2 x 2048 with 16 accumulation steps.  The weights stay fp32 (master weights), the
optimizer is torch.optim.AdamW:

    model = AutoModelForCausalLM.from_pretrained(base, torch_dtype=torch.float32).cuda()
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step, micro_batches in enumerate(chunked(loader, 16)):
        for mb in micro_batches:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(**mb).loss / 16
            loss.backward()                           # the first micro-batch's backward fails
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

The weights are 12 GiB; the first micro-batch's forward saves only 4.3 GiB (checkpointed layer
inputs and the logits); its backward must create the gradients, 12 GiB more, and fails after 7 GiB
of them, before any optimizer.step() has run.  Training (the parameters require grad, AdamW exists,
the model is in train mode), first step, nothing cached, nothing grows, nothing else on the card.
An expert: the model state alone does not fit: fp32 weights 12 + gradients 12 + AdamW moments 24 =
48 GiB on a 24 GiB card, whatever the batch.  Train LoRA adapters on the frozen model, or shard/
offload the state (DeepSpeed ZeRO-3 with CPU offload, FSDP over several GPUs), or a bigger card.
A smaller micro-batch, checkpointing (already on) or autocast (already on) do not change the 48 GiB;
an 8-bit AdamW alone still needs 30 GiB.
"""
import sys
import torch
import scen_truth

HIDDEN, KV, FFN, LAYERS, VOCAB = 3072, 1024, 8192, 28, 128256
MB, SEQ, ACCUM = 2, 2048, 16
scen_truth.note_every_empty(torch)


# bf16 tensors: the stand-in sizes tensors in bytes and types each one by the default dtype when it is
# made, so bf16 ones are made with the default dtype set to bfloat16 (what from_pretrained(...,
# torch_dtype=torch.bfloat16) does while it builds the model); compiled as part of torch's file (as
# scen_truth's wrappers are) so that the failing Python line stays the program's.
_BF16 = """
def bf16_empty(nbytes):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return torch.empty(nbytes, device="cuda")
    finally:
        torch.set_default_dtype(prev)
"""
_ns = {"torch": torch}
exec(compile(_BF16, torch.__file__, "exec"), _ns)
bf16_empty = _ns["bf16_empty"]


def param(numel):
    return torch.nn.Parameter(torch.empty(numel * 4, device="cuda"))      # fp32 master weights


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.o_proj = param(HIDDEN * HIDDEN), param(HIDDEN * HIDDEN)
        self.k_proj, self.v_proj = param(HIDDEN * KV), param(HIDDEN * KV)
        self.gate_proj, self.up_proj, self.down_proj = (param(HIDDEN * FFN) for _ in range(3))

    def forward(self, h):
        # gradient checkpointing: only the layer's input is kept; the rest is recomputed in backward
        out = torch.empty(MB * SEQ * HIDDEN * 4, device="cuda")
        out._saved = h
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = param(VOCAB * HIDDEN)                 # tied with lm_head
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, DecoderLayer())

    def forward(self, input_ids):
        h = torch.empty(MB * SEQ * HIDDEN * 4, device="cuda")
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layers_%d" % i)(h)
        logits = bf16_empty(MB * SEQ * VOCAB * 2)          # bf16 under autocast
        logits._saved = h
        logits32 = torch.empty(MB * SEQ * VOCAB * 4, device="cuda")        # logits.float() for the loss
        logits32._saved = logits
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = logits32, tuple(self.parameters())
        return loss


def main():
    model = LlamaForCausalLM().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(1000):
        for micro in range(ACCUM):
            input_ids = torch.empty(MB * SEQ * 8, device="cuda")
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(input_ids)
            scen_truth.backward(loss)
            del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
