"""sft_lora.py -- LoRA SFT of Mistral-7B-v0.1 (bf16 base, 13.5 GiB frozen; r=16 on q,k,v,o,gate,up,down:
42M trainable fp32 params) on one 24 GB L4 (22.5 GiB usable), micro-batch 4 x 2048 tokens with
gradient checkpointing, AdamW.  Training is steady at 14.1 GiB allocated, 19.4 GiB reserved.  Every
100 steps I evaluate the *merged* model, because that is what we deploy, and I did not want
merge_and_unload() to touch the model I am training:

    if step % eval_steps == 0:
        eval_model = copy.deepcopy(model).merge_and_unload()    # keep training the adapters
        eval_model.eval()
        val_ppl = evaluate(eval_model, val_loader)
        del eval_model

Step 100: "CUDA out of memory" inside copy.deepcopy, after about 7.4 GiB of the copy.

What an expert sees: deepcopy of the PEFT model clones the whole 13.5 GiB bf16 base on the same GPU,
next to the live one; the card has ~8 GiB left.  Evaluate the training model itself (model.eval() +
torch.no_grad(): a LoRA forward gives the same outputs as the merged weights, up to rounding; PEFT's
merge_adapter()/unmerge_adapter() does it in place if the merged path matters), then model.train().
Nothing about the training step is wrong: batch size, checkpointing, precision, the optimizer
(AdamW over 42M LoRA params is 320 MiB) and LoRA itself are already right; not a cache, fragmentation
or other-process problem.
"""
import copy
import sys

import torch
from torch import nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
HIDDEN, KV, FFN, LAYERS, VOCAB = 4096, 1024, 14336, 32, 32000
SEQ = 2048


class LoraLinearGroup(nn.Module):
    """The frozen bf16 projections of one block and their LoRA A/B matrices (fp32, trainable)."""

    def __init__(self, base_params, lora_params):
        nn.Module.__init__(self)
        self.base_layer = nn.Parameter(torch.empty(base_params, dtype=torch.bfloat16, device="cuda"),
                                       requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(lora_params // 2 * 4, device="cuda"))
        self.lora_B = nn.Parameter(torch.empty(lora_params // 2 * 4, device="cuda"))
        self.merged = False

    def forward(self, x, work_bytes, out_bytes):
        work = torch.empty(work_bytes, device="cuda")      # base projections (+ x @ A @ B)
        out = torch.empty(out_bytes, device="cuda")
        del work
        return out

    def merge(self):
        self.merged = True


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        r = 16
        self.self_attn = LoraLinearGroup(2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV,
                                         r * (2 * (HIDDEN + HIDDEN) + 2 * (HIDDEN + KV)))
        self.mlp = LoraLinearGroup(3 * HIDDEN * FFN, r * 3 * (HIDDEN + FFN))
        self.norms = nn.Parameter(torch.empty(2 * HIDDEN, dtype=torch.bfloat16, device="cuda"), requires_grad=False)

    def forward(self, h, b):
        # gradient checkpointing: the block's internals are recomputed in backward; only its input is kept
        attn = self.self_attn(h, b * SEQ * (HIDDEN + 2 * KV) * 2, b * SEQ * HIDDEN * 2)
        out = self.mlp(attn, b * SEQ * FFN * 2 * 2, b * SEQ * HIDDEN * 2)
        del attn
        out._saved = h
        return out


class MistralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                    requires_grad=False)
        self.gradient_checkpointing = True

    def forward(self, input_ids, labels=None):
        b = input_ids.nbytes // (SEQ * 8)
        h = torch.empty(b * SEQ * HIDDEN * 2, device="cuda")
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h, b)
        logits = torch.empty(b * SEQ * VOCAB * 4, device="cuda")        # upcast to fp32 for the loss
        logits._saved = h
        loss = F.cross_entropy(logits, labels) if labels is not None else None
        return CausalLMOutput(loss, logits)


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss = loss
        self.logits = logits


class PeftModelForCausalLM(nn.Module):
    """peft's wrapper: merge_and_unload() folds B@A into the base weights and returns the base model."""

    def __init__(self, base_model):
        nn.Module.__init__(self)
        self.base_model = base_model

    def forward(self, *args, **kwargs):
        return self.base_model(*args, **kwargs)

    def merge_and_unload(self):
        for m in self.base_model.modules():
            if isinstance(m, LoraLinearGroup):
                m.merge()
        return self.base_model


def train_loader():
    while True:
        yield {"input_ids": torch.empty(4 * SEQ * 8, device="cuda"), "labels": torch.empty(4 * SEQ * 8, device="cuda")}


def evaluate(model, n_batches=50):
    total = 0.0
    with torch.no_grad():
        for _ in range(n_batches):
            out = model(torch.empty(4 * SEQ * 8, device="cuda"), labels=torch.empty(4 * SEQ * 8, device="cuda"))
            total += 1.0
            del out
    return total


def main():
    model = PeftModelForCausalLM(MistralForCausalLM())
    # truth mark at the failure itself (test scaffolding): unwinding copy.deepcopy frees part of the copy
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    model.train()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=2e-4, weight_decay=0.0)
    eval_steps = 100
    per_device_train_batch_size = 4
    for step, batch in enumerate(train_loader(), start=1):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        loss = out.loss
        del out
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch
        if step % eval_steps == 0:
            eval_model = copy.deepcopy(model).merge_and_unload()
            eval_model.eval()
            val_ppl = evaluate(eval_model)
            del eval_model
            model.train()
        if step >= 1000:
            break
    return per_device_train_batch_size


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
