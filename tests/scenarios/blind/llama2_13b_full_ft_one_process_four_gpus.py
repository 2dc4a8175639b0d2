"""finetune_llama2_13b.py -- full fine-tuning of Llama-2-13B in bf16 on a node with four 80 GB GPUs,
started as `python finetune_llama2_13b.py` (the launcher line of the team's README, `accelerate launch
--config_file fsdp.yaml`, was not used), so one process trains on cuda:0 alone:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-hf", torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.to("cuda")                                   # 24.2 GiB of bf16 weights on GPU 0
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:                               # batch 4 x 4096 tokens
        loss = model(**batch).loss
        loss.backward()                                # bf16 gradients: 24.2 GiB
        optimizer.step()                               # <- OOM creating exp_avg / exp_avg_sq (48.5 GiB)
        optimizer.zero_grad(set_to_none=True)

Forward and backward fit (weights + gradients 48.5 GiB, checkpointed activations and logits 8.4 GiB, freed after
backward).  The first optimizer.step() needs two more bf16 copies of the weights, 48.5 GiB, and runs out
about two thirds of the way: 97 GiB of training state for one 80 GB card.  GPUs 1-3 hold nothing.

An expert: shard the training state over the four GPUs that are already there -- FSDP FULL_SHARD /
DeepSpeed ZeRO-3 through the intended launcher (about 24 GiB of state per GPU) -- i.e. launch one
process per GPU.  Not a smaller batch or more checkpointing (activations are freed at the step), not
mixed precision or load_in_bf16 (already bf16), not a bigger GPU (there is none bigger on the node;
the three idle ones are the answer), not inference mode.  LoRA or an 8-bit optimizer would change the
experiment the user runs.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_LAYERS = 40
LAYER_PARAMS = 317 * 1000 * 1000     # one Llama-2-13B decoder layer (5120 hidden, 13824 MLP)
EMBED_PARAMS = 32000 * 5120
CKPT_ACT = 4 * 4096 * 5120           # elements a checkpointed layer keeps (its bf16 input)
LOGITS = 4 * 4096 * 32000
per_device_train_batch_size = 4


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(LAYER_PARAMS, dtype=torch.bfloat16, device="cuda"))

    def forward(self, h):
        out = torch.empty(CKPT_ACT, dtype=torch.bfloat16, device="cuda")
        out._saved = h
        return out


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_PARAMS, dtype=torch.bfloat16, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(EMBED_PARAMS, dtype=torch.bfloat16, device="cuda"))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        h = torch.empty(CKPT_ACT, dtype=torch.bfloat16, device="cuda")
        h._saved = (input_ids, self.embed_tokens)
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(LOGITS, dtype=torch.bfloat16, device="cuda")
        logits._saved = (h, self.lm_head)
        return CausalLMOutput(F.cross_entropy(logits, labels), logits)


def from_pretrained(name, torch_dtype):
    return LlamaForCausalLM()


def main():
    model = from_pretrained("meta-llama/Llama-2-13b-hf", torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    model.to("cuda")
    model.train()
    # truth mark at the failure itself (test scaffolding): AdamW's half-built state is gone by the except
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    for step in range(3000):
        input_ids = torch.empty(per_device_train_batch_size * 4096 * 8, device="cuda")
        labels = torch.empty(per_device_train_batch_size * 4096 * 8, device="cuda")
        out = model(input_ids, labels=labels)
        out.loss.backward()
        del out
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    raise                               # marked by the observer above
sys.exit(0)
