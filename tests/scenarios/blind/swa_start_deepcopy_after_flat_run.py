"""train_lm.py -- continued pre-training of a 1.4B-parameter decoder (Pythia-1.4B class) in fp32 with
AdamW on a 24 GiB card, gradient checkpointing on, micro-batch 4 x 1024.  Weights 5.2 GiB, gradients
5.2 GiB (zero_grad at the top of each step, so they stay allocated between steps), AdamW moments
10.4 GiB, ~2 GiB of checkpointed activations per step: a flat 23.4 GiB at every step's peak for 6,000
steps.  For the last quarter of the schedule the script starts stochastic weight averaging by hand:

    for step, batch in enumerate(loader):
        optimizer.zero_grad()
        loss = model(**batch).loss; loss.backward(); optimizer.step()
        if step == swa_start:
            swa_model = copy.deepcopy(model)        # the running average, on the GPU like the model
            swa_n = 0
        if step >= swa_start:
            update_swa(swa_model, model, swa_n); swa_n += 1

The deepcopy wants another 5.2 GiB on the card; after the step only the freed activations (~2 GiB)
are cached and ~0.6 GiB free, so the copy fails part way through.

An expert: a one-off copy of the weights after a long flat run: keep the averaged copy in CPU memory
(swa_utils.AveragedModel(model, device="cpu"), or copy the state dict to the CPU and average there),
or average fewer/lower-precision weights.  Not a smaller batch or more checkpointing (activations are
gone at that point), not the allocator's settings, not a leak.
"""
import copy
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS = 24


class GPTNeoXLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query_key_value = torch.nn.Parameter(torch.empty(48 * MiB, device="cuda"))    # 2048 x 6144 fp32
        self.dense = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
        self.dense_h_to_4h = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.dense_4h_to_h = torch.nn.Parameter(torch.empty(64 * MiB, device="cuda"))
        self.input_layernorm = torch.nn.Parameter(torch.empty(16 * 1024, device="cuda"))
        self.post_attention_layernorm = torch.nn.Parameter(torch.empty(16 * 1024, device="cuda"))

    def forward(self, h):
        out = torch.empty(4 * 1024 * 2048 * 4, device="cuda")          # the checkpointed layer input
        out._saved = h
        return out


class GPTNeoXForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_in = torch.nn.Parameter(torch.empty(50304 * 2048 * 4, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), GPTNeoXLayer())
        self.embed_out = torch.nn.Parameter(torch.empty(50304 * 2048 * 4, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        h = torch.empty(4 * 1024 * 2048 * 4, device="cuda")
        h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self.layers, str(i))(h)
        logits = torch.empty(4 * 1024 * 50304 * 2, device="cuda")      # bf16 logits under autocast
        logits._saved = h
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = tuple(self.parameters())
        return loss


def update_swa(swa_model, model, n):
    pass                                                  # p_swa.mul_(n / (n + 1)).add_(p / (n + 1)), in place


batch_size = 4
num_steps = 8000
swa_start = 6000


def train(model, optimizer, start_step=0):
    swa_model = None
    swa_n = 0
    for step in range(start_step, num_steps):
        optimizer.zero_grad()                             # at the top of the step: the gradients stay between steps
        input_ids = torch.empty(batch_size * 1024 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        del loss, input_ids
        if step == swa_start:
            swa_model = copy.deepcopy(model)
            swa_n = 0
        if step >= swa_start:
            update_swa(swa_model, model, swa_n)
            swa_n += 1
    return swa_model


try:
    model = GPTNeoXForCausalLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    train(model, optimizer, start_step=5990)            # resumed after a preemption (the stand-in runs from here)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
