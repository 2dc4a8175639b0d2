"""finetune_phi2.py -- full fine-tuning of Phi-2 (2.76B parameters) on one 24 GiB card with a
hand-written mixed-precision recipe (the Apex O2 / Megatron style): the model in bf16, an fp32 master
copy of every weight for the optimizer, gradient checkpointing on, batch 2 x 2048 tokens:

    model = load_phi2(torch_dtype=torch.bfloat16).cuda()           # 5.1 GiB
    model.gradient_checkpointing = True
    master = [nn.Parameter(p.detach().float()) for p in model.parameters()]   # fp32: 10.3 GiB
    optimizer = torch.optim.AdamW(master, lr=1e-5)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(batch["input_ids"]), batch["labels"])
        loss.backward()                                   # bf16 gradients: 5.1 GiB
        for m, p in zip(master, model.parameters()):
            m.grad = p.grad.float()                       # <- OOM: fp32 master gradients, 10.3 GiB
        optimizer.step()                                  # would add AdamW's fp32 moments: 20.5 GiB
        copy_master_to_model(master, model)

The user expected "mixed precision" to halve the memory.  It halves the activations, not the training
state: bf16 weights (2 B/param) + bf16 grads (2) + fp32 master weights (4) + fp32 master grads (4) +
fp32 AdamW moments (8) = 20 bytes per parameter, about 51 GiB for 2.76B parameters on a 24 GiB card.
Forward and backward fit (activations are small with checkpointing); copying the gradients to fp32
runs out, and the optimizer step would need 20.5 GiB more still.

An expert: this full fine-tune does not fit one 24 GiB card in any precision arrangement -- train LoRA
adapters on the bf16 model (a few hundred MiB of state), or shard/offload the fp32 master weights,
gradients and optimizer state (DeepSpeed ZeRO-Offload / FSDP with CPU offload), or use more GPUs.
Not mixed precision (already on), not a smaller batch or more checkpointing (activations are freed
and small), not load_in_bf16 (the model already is bf16); an 8-bit optimizer alone still leaves
~36 GiB.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_LAYERS = 32
LAYER_PARAMS = 78000000          # parameters of one Phi-2 layer (2560 hidden, 10240 MLP)
EMBED_PARAMS = 51200 * 2560      # the token embedding and the LM head, each
CKPT_ACT = 2 * 2048 * 2560       # elements a checkpointed layer keeps (its bf16 input) at batch 2 x 2048
LOGITS = 2 * 2048 * 51200        # bf16 logits' elements
batch_size = 2


class PhiLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(LAYER_PARAMS, dtype=torch.bfloat16, device="cuda"))

    def forward(self, h):
        out = torch.empty(CKPT_ACT, dtype=torch.bfloat16, device="cuda")
        out._saved = h
        return out


class PhiForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_PARAMS, dtype=torch.bfloat16, device="cuda"))
        self.layers = [PhiLayer() for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(EMBED_PARAMS, dtype=torch.bfloat16, device="cuda"))

    def forward(self, input_ids):
        h = torch.empty(CKPT_ACT, dtype=torch.bfloat16, device="cuda")
        h._saved = (input_ids, self.embed_tokens)
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(LOGITS, dtype=torch.bfloat16, device="cuda")
        logits._saved = (h, self.lm_head)
        return logits


def load_phi2(torch_dtype):
    return PhiForCausalLM()          # AutoModelForCausalLM.from_pretrained("microsoft/phi-2", torch_dtype=...)


def numel(t):
    return t.nbytes // 2             # the model's tensors are bf16


def fp32_copy(p):
    """p.detach().float(): a new fp32 tensor of p's element count."""
    return torch.empty(numel(p), dtype=torch.float32, device="cuda")


def copy_master_to_model(master, model):
    with torch.no_grad():
        for m, p in zip(master, model.parameters()):
            pass                     # p.copy_(m): in place


def main():
    model = load_phi2(torch_dtype=torch.bfloat16).cuda()
    model.gradient_checkpointing = True
    model.train()
    master = [nn.Parameter(fp32_copy(p)) for p in model.parameters()]
    optimizer = torch.optim.AdamW(master, lr=1e-5, weight_decay=0.0)
    for step in range(20000):
        input_ids = torch.empty(batch_size * 2048 * 8, device="cuda")
        labels = torch.empty(batch_size * 2048 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids)
            loss = F.cross_entropy(logits, labels)
        loss.backward()
        del logits, loss
        for m, p in zip(master, model.parameters()):
            m.grad = fp32_copy(p.grad)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        copy_master_to_model(master, model)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
