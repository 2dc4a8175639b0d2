"""harvest_acts.py -- step 1 of training a sparse autoencoder on Llama-3.1-8B's residual stream: run 50k
FineWeb prompts (1,024 tokens, batches of 32) through the model on one A100 80GB and collect the
output of decoder layer 16 with a forward hook; step 2 trains the SAE on the collected tensor.

    acts = []
    def save_resid(module, inputs, output):
        acts.append(output[0].detach().float())          # the SAE trains in float32
    model.model.layers[16].register_forward_hook(save_resid)
    with torch.no_grad():
        for batch in loader:
            model(**batch)
    torch.save(torch.cat(acts), "resid_l16.pt")

It runs for a few minutes, then at batch 100 of 1,563: "CUDA out of memory. Tried to allocate 7.83
GiB. ... 4.24 GiB is free ... 10.05 GiB is reserved by PyTorch but unallocated" in the lm_head.  The
user: "It's under no_grad, batch 32 never changes, and 99 batches were fine -- is batch 100 unusually
long?  And 10 GB reserved but unallocated -- fragmentation?  Should I use a smaller batch or 8-bit
weights?"

What fills the memory: the list.  Every batch adds 32 x 1,024 x 4,096 float32 values, 512 MiB, kept
on the GPU (detach() drops the graph -- there is none under no_grad -- not the device).  At batch
100 that is 50 GiB beside the 15 GiB of weights, and the batch's 7.8 GiB of bf16 logits (which the
job never uses) no longer fits.  The cached 10 GiB are the earlier batches' logits blocks, split by
the list's 512 MiB tensors: a symptom of the growth, worth ~12 more batches at most.  All batches
have the same shape; memory rose by 512 MiB per batch from the start.  The whole set would need
780 GiB: no GPU holds it.

An expert: move each batch's activations off the GPU as they are collected --
`acts.append(output[0].float().cpu())`, or better write them to a memory-mapped / sharded file on
disk (an activation store, as SAELens does) and let the SAE trainer stream them back a batch at a
time.  Secondary: call model.model (or stop after layer 16) so the lm_head's logits are never built.
Wrong first answers: a smaller batch or 8-bit weights (the list keeps growing; it only fails
later), inference_mode (no_grad is on; nothing autograd-related is kept), empty_cache or
expandable_segments (they buy a dozen batches of 1,563), gradient checkpointing or mixed precision
(no training here), a bigger GPU (780 GiB).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, LAYERS, VOCAB = 4096, 14336, 32, 128256
LAYER_BYTES = 416 * MiB
SEQ_LEN = 1024


def frozen_bf16(nbytes):
    return nn.Parameter(torch.empty(nbytes // 2, dtype=BF16, device="cuda"), requires_grad=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = frozen_bf16(LAYER_BYTES)
        self._forward_hooks = []

    def register_forward_hook(self, hook):
        self._forward_hooks.append(hook)

    def forward(self, hidden, tokens):
        attn_out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        mlp = torch.empty(tokens * INTER * 3, dtype=BF16, device="cuda")    # gate, up, act
        del mlp
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        del attn_out
        output = (out,)
        for hook in self._forward_hooks:
            hook(self, (hidden,), output)
        return output


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = frozen_bf16(VOCAB * HIDDEN * 2)
        self.layers = [LlamaDecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.norm = frozen_bf16(HIDDEN * 2)

    def forward(self, input_ids, attention_mask=None):
        tokens = input_ids.nbytes // 8
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens)[0]
        return hidden


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = frozen_bf16(VOCAB * HIDDEN * 2)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        return cls().eval()

    def forward(self, input_ids, attention_mask=None):
        hidden = self.model(input_ids, attention_mask)
        tokens = input_ids.nbytes // 8
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")   # every position, bf16
        return {"logits": logits}


def float32_copy(t):
    """Tensor.float() of a bf16 tensor: a new float32 tensor, twice its bytes."""
    out = torch.empty(t.nbytes // 2, dtype=torch.float32, device="cuda")
    return out


torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))

model = LlamaForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=BF16, device_map="cuda")

acts = []


def save_resid(module, inputs, output):
    acts.append(float32_copy(output[0].detach()))          # output[0].detach().float()


model.model.layers[16].register_forward_hook(save_resid)

batch_size = 32
num_prompts = 50000
try:
    with torch.no_grad():
        for i in range(0, num_prompts, batch_size):
            batch = {"input_ids": torch.empty(batch_size * SEQ_LEN * 8, device="cuda"),
                     "attention_mask": torch.empty(batch_size * SEQ_LEN * 8, device="cuda")}
            model(**batch)
            del batch
except torch.OutOfMemoryError:
    raise
print("collected %d batches" % len(acts))
sys.exit(0)
