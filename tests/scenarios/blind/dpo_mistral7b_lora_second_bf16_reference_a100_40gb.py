"""dpo_train.py -- DPO of Mistral-7B-Instruct-v0.2 on our preference pairs, LoRA (r=16 on every linear
layer), one A100 40GB, a DPO loop I wrote myself after reading the paper:

    policy = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()
    policy.gradient_checkpointing_enable()
    policy = get_peft_model(policy, LoraConfig(r=16, target_modules="all-linear"))
    ref_model = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16).cuda()   # frozen reference
    ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-6)
    for batch in loader:                                # 4 pairs, chosen+rejected concatenated: 8 x 4096 tokens
        with torch.no_grad():
            ref_logps = seq_logps(ref_model, batch)
        pol_logps = seq_logps(policy, batch)            # <- CUDA out of memory, first batch
        loss = dpo_loss(pol_logps, ref_logps, beta=0.1); loss.backward(); optimizer.step()

The user: "Both models load (13.5 GiB each), the reference pass goes through, then the policy's forward on
the very first batch runs out.  Gradient checkpointing is on, the reference runs under no_grad, and
the LoRA optimizer is tiny.  What else can I cut?"

The card holds two full bf16 copies of the same 7B base (27 GiB of 40) before any activation: the
policy's checkpointed hidden states (8 GiB for 32 layers at 8 x 4096 tokens), its bf16 logits (1.95
GiB) and their float32 log-softmax (3.9 GiB) do not fit beside them.

An expert: the second copy is pure waste -- with LoRA the reference model IS the frozen base: compute
the reference log-probs with the adapter disabled (`with policy.disable_adapter():`, what TRL does with
ref_model=None and a peft_config), which frees 13.5 GiB and changes no number; or precompute the
reference log-probs over the whole set first, free the reference, then train (TRL's
precompute_ref_log_probs).  Not no_grad for the reference (already), not LoRA (already), not an 8-bit
optimizer (the LoRA state is 0.3 GiB), not empty_cache or allocator settings (every byte is live).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, VOCAB, LAYERS = 4096, 32000, 32
LAYER_BYTES = 418 * MiB           # attention + MLP of one Mistral-7B decoder layer, bf16
EMBED_BYTES = VOCAB * HIDDEN * 2  # 250 MiB


def bf16_param(nbytes, requires_grad=True):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=BF16, device="cuda"), requires_grad)


class LoraLinear(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.lora_A = nn.Parameter(torch.empty(nbytes, device="cuda"))       # float32 adapters
        self.lora_B = nn.Parameter(torch.empty(nbytes, device="cuda"))


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = bf16_param(LAYER_BYTES)

    def forward(self, hidden, tokens):
        # the layer's own temporaries live only inside the checkpointed block; what stays is its input
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        return out


class MistralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_param(EMBED_BYTES)
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), MistralDecoderLayer())
        self.norm = bf16_param(HIDDEN * 2)
        self.lm_head = bf16_param(EMBED_BYTES)
        self.gradient_checkpointing = False

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def requires_grad_(self, flag=True):
        for p in self.parameters():
            p.requires_grad = flag
        return self

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        kept = [hidden]                          # checkpoint inputs, one per layer (autograd keeps them)
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens)
            if torch.is_grad_enabled():
                kept.append(hidden)
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = kept
        return logits


class PeftModel(nn.Module):
    def __init__(self, base_model, r=16):
        nn.Module.__init__(self)
        for p in base_model.parameters():
            p.requires_grad = False
        self.base_model = base_model
        self.lora = nn.Module()
        for i in range(LAYERS):                    # 7 target modules per layer, A and B each
            setattr(self.lora, str(i), LoraLinear(r * (HIDDEN * 7 + 14336 * 3) * 4 // 2))

    def forward(self, input_ids, attention_mask=None):
        return self.base_model(input_ids, attention_mask)


def get_peft_model(model, r=16):
    return PeftModel(model, r)


def seq_logps(model, batch):
    logits = model(batch["input_ids"], batch["attention_mask"])
    logps = F.log_softmax(logits, -1, dtype=torch.float32)
    per_token = torch.empty(batch["input_ids"].nbytes // 2, device="cuda")      # gathered, float32
    if torch.is_grad_enabled():
        per_token._saved = logps              # kept for backward (the reference's pass keeps nothing)
    return per_token


def dpo_loss(pol, ref, beta=0.1):
    loss = torch.empty(512, device="cuda")
    loss._saved = pol
    return loss


def main():
    BASE = "mistralai/Mistral-7B-Instruct-v0.2"
    batch_size = 4                           # pairs per step; chosen + rejected concatenated
    max_length = 4096
    policy = MistralForCausalLM.from_pretrained(BASE, torch_dtype=BF16).cuda()
    policy.gradient_checkpointing_enable()
    policy = get_peft_model(policy, r=16)
    ref_model = MistralForCausalLM.from_pretrained(BASE, torch_dtype=BF16).cuda()
    ref_model.eval().requires_grad_(False)
    optimizer = torch.optim.AdamW([p for p in policy.parameters() if p.requires_grad], lr=5e-6)
    policy.train()
    for step in range(1000):
        rows = 2 * batch_size * max_length
        batch = {"input_ids": torch.empty(rows * 8, device="cuda"),
                 "attention_mask": torch.empty(rows * 8, device="cuda")}
        with torch.no_grad():
            ref_logps = seq_logps(ref_model, batch)
        pol_logps = seq_logps(policy, batch)
        loss = dpo_loss(pol_logps, ref_logps)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, pol_logps, ref_logps, batch


scen_truth.note_every_empty(torch)
# truth mark at the failure itself (test scaffolding)
torch.cuda.init()
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
