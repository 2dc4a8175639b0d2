"""orpo_train.py -- ORPO full fine-tune of Llama-3.2-3B-Instruct on our preference pairs, one RTX 4090
(24 GB) in a lab workstation.  The recipe (a blog post, run on the same card) used

    ORPOConfig(per_device_train_batch_size=1, gradient_accumulation_steps=8, max_length=2048,
               bf16=True, gradient_checkpointing=True, optim="paged_adamw_8bit", learning_rate=8e-6)

bitsandbytes would not install in the lab's locked conda environment, so the user changed one word,
optim="adamw_torch", and launched it.  The eight micro-batches of the first accumulation window run
(forward, backward, ~18 GiB peak), and the job dies in the first optimizer.step():

    torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 48.00 MiB. GPU 0 has a total
    capacity of 24.00 GiB of which 42.00 MiB is free.

The user: "Forward and backward went through eight times, the step itself is not even a forward.
Should I go to max_length 1024 or turn on more checkpointing?"

What fills the memory: bf16 weights 6 GiB, their bf16 gradients 6 GiB, and AdamW's exp_avg and
exp_avg_sq, created at the first step, one of each per parameter in the parameter's dtype: 12 GiB.
0.5 + 6 + 6 + 12 = 24.5 GiB, on a 24 GiB card; the activations were already freed after backward.

An expert: the optimizer state is what does not fit -- use the 8-bit (paged) AdamW the recipe
named (2 bytes per parameter instead of 4: 6 GiB of state, ~18.5 GiB in all), installing
bitsandbytes (or torchao's AdamW8bit) properly; or, if that is impossible, train LoRA adapters
instead of all 3.2B weights.  Wrong first answers: a shorter max_length, a smaller batch, more
gradient checkpointing, mixed precision (all about activations, which are gone by the step and
already fit), quantizing the weights (a full fine-tune cannot train 4-bit weights), empty_cache
or expandable_segments (every byte is live state).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, KV_DIM, LAYERS, VOCAB = 3072, 8192, 1024, 28, 128256
MATRICES = (("q_proj", HIDDEN * HIDDEN), ("k_proj", HIDDEN * KV_DIM), ("v_proj", HIDDEN * KV_DIM),
            ("o_proj", HIDDEN * HIDDEN), ("gate_proj", HIDDEN * INTER), ("up_proj", HIDDEN * INTER),
            ("down_proj", INTER * HIDDEN))


def bf16_param(numel):
    return nn.Parameter(torch.empty(numel, dtype=BF16, device="cuda"))


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for name, numel in MATRICES:
            setattr(self, name, bf16_param(numel))
        self.input_layernorm = bf16_param(HIDDEN)
        self.post_attention_layernorm = bf16_param(HIDDEN)

    def forward(self, hidden, tokens):
        # checkpointed: the block's temporaries are recomputed in backward; what stays is its input
        for name, _ in MATRICES:
            getattr(self, name)
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        out._saved = hidden
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_param(VOCAB * HIDDEN)            # tied with the lm_head
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), LlamaDecoderLayer())
        self.norm = bf16_param(HIDDEN)
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation="sdpa"):
        return cls()

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens)
        self.embed_tokens
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")
        logits._saved = hidden
        return _upcast(logits)                                      # logits.float()


def _upcast(logits):
    """logits.float(), as Llama's forward does before returning them."""
    out = torch.empty(logits.nbytes * 2, device="cuda")
    out._saved = logits
    return torch._derive(out, logits)


def orpo_loss(model, batch, beta=0.1):
    logits = model(batch["input_ids"], batch["attention_mask"])          # chosen and rejected rows
    logps = F.log_softmax(logits, -1)
    nll = torch.empty(512, device="cuda")                                   # SFT term on the chosen rows
    nll._saved = logps
    loss = torch._derive(nll, logps)
    return loss


class ORPOConfig(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


def main():
    args = ORPOConfig(per_device_train_batch_size=1, gradient_accumulation_steps=8, max_length=2048,
                      bf16=True, gradient_checkpointing=True, optim="adamw_torch", learning_rate=8e-6)
    model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.2-3B-Instruct", torch_dtype=BF16).cuda()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    # optim="adamw_torch" (was "paged_adamw_8bit" in the recipe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate, weight_decay=0.0)
    batch_size = args.per_device_train_batch_size
    for step in range(1000):
        for micro in range(args.gradient_accumulation_steps):
            rows = 2 * batch_size                                          # chosen + rejected
            batch = {"input_ids": torch.empty(rows * args.max_length * 8, device="cuda"),
                     "attention_mask": torch.empty(rows * args.max_length * 8, device="cuda")}
            loss = orpo_loss(model, batch)
            scen_truth.backward(loss)
            del loss, batch
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
