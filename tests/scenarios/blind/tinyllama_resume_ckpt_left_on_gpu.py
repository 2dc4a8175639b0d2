"""pretrain_tinyllama.py --resume runs/tinyllama-1.1b/last.pt -- continued pre-training of a 1.1B
Llama-style model (22 layers, fp32 weights 4.1 GiB) with AdamW on one 24 GiB card.  From scratch the
job ran for 12,000 steps at batch 4 x 2048 tokens (weights 4.1 + AdamW moments 8.2 + activations and
logits 5.2 + gradients 4.1 GiB: about 22 of 24 GiB).  The node was preempted; resuming dies in the
first backward:

    model = TinyLlama().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4)
    ckpt = torch.load(args.resume)              # no map_location: every tensor comes back on cuda:0,
    model.load_state_dict(ckpt["model"])        #   where the last run saved it from
    optimizer.load_state_dict(ckpt["optimizer"])
    for batch in loader:
        loss = F.cross_entropy(model(batch["input_ids"]), batch["labels"])
        loss.backward()                         # <- OOM while making the gradients

torch.load puts the checkpoint's model weights (4.1 GiB) and optimizer moments (8.2 GiB) on the GPU.
load_state_dict copies the weights into the model; the optimizer adopts the moments (already on the
parameters' device: no copy).  But `ckpt` stays alive in main() for the whole run, so a second,
dead copy of the model's weights (4.1 GiB) sits on the card -- exactly the margin the first backward
needs for its gradients.

An expert: load the checkpoint to the CPU (torch.load(path, map_location="cpu"): load_state_dict
copies to the GPU, the optimizer moves its state to its parameters' device), or at least `del ckpt`
once it is loaded.  Not a smaller batch, checkpointing, an 8-bit optimizer or sharding: the job fit
for 12,000 steps with exactly this configuration.
"""
import json
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

N_LAYERS = 22
LAYER_BYTES = 168 * MiB          # fp32 weights of one decoder layer (attention with GQA + SwiGLU MLP)
EMBED_BYTES = 250 * MiB          # 32000 x 2048 fp32
ACT_PER_LAYER = 150 * MiB        # what one layer saves for backward at batch 4 x 2048
LOGITS_BYTES = 1000 * MiB        # 4 x 2048 x 32000 fp32
batch_size = 4


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(LAYER_BYTES, device="cuda"))

    def forward(self, h):
        out = torch.empty(ACT_PER_LAYER, device="cuda")     # attention + MLP activations
        out._saved = h
        return out


class TinyLlama(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = nn.Parameter(torch.empty(EMBED_BYTES, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(N_LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.lm_head = nn.Parameter(torch.empty(EMBED_BYTES, device="cuda"))

    def forward(self, input_ids):
        h = torch.empty(ACT_PER_LAYER, device="cuda")        # embeddings
        h._saved = (input_ids, self.embed_tokens)
        for layer in self.layers:
            h = layer(h)
        logits = torch.empty(LOGITS_BYTES, device="cuda")
        logits._saved = (h, self.lm_head)
        return logits


def write_last_run_checkpoint(path, model):
    """The previous run's torch.save({"model": ..., "optimizer": ...}) at step 12000 (test scaffolding:
    the stand-in's checkpoints are files of tensor sizes)."""
    sizes = {}
    for i, p in enumerate(model.parameters()):
        sizes["model.%d" % i] = p.nbytes
    for i, p in enumerate(model.parameters()):
        sizes["optimizer.state.%d.exp_avg" % i] = p.nbytes
        sizes["optimizer.state.%d.exp_avg_sq" % i] = p.nbytes
    with open(path, "w") as f:
        json.dump(sizes, f)


def nest(flat):
    """The stand-in's torch.load returns a flat dict; torch.save of the last run wrote
    {"model": state_dict, "optimizer": {"state": {i: {...}}, "param_groups": [...]}}."""
    ckpt = {"model": {}, "optimizer": {"state": {}, "param_groups": [{"lr": 4e-4}]}, "step": 12000}
    for k, v in flat.items():
        parts = k.split(".")
        if parts[0] == "model":
            ckpt["model"][parts[1]] = v
        else:
            ckpt["optimizer"]["state"].setdefault(int(parts[2]), {"step": 12000})[parts[3]] = v
    return ckpt


def load_optimizer_state(optimizer, sd):
    """torch.optim.Optimizer.load_state_dict (the stand-in has none): state already on the parameter's
    device and dtype is adopted as is (Tensor.to returns the same tensor)."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        optimizer.state[p] = dict(sd["state"][i])


def main(resume):
    model = TinyLlama().cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, weight_decay=0.1)
    if not os.path.exists(resume):
        write_last_run_checkpoint(resume, model)

    ckpt = nest(torch.load(resume))                       # back onto cuda:0, where it was saved from
    model.load_state_dict(ckpt["model"])
    load_optimizer_state(optimizer, ckpt["optimizer"])
    start_step = ckpt["step"]

    for step in range(start_step, 100000):
        optimizer.zero_grad(set_to_none=True)
        input_ids = torch.empty(batch_size * 2048 * 8, device="cuda")
        labels = torch.empty(batch_size * 2048 * 8, device="cuda")
        logits = model(input_ids)
        loss = F.cross_entropy(logits, labels)
        loss.backward()
        optimizer.step()
        if step % 100 == 0:
            print("step", step, flush=True)
        del loss, logits


run_dir = tempfile.mkdtemp(prefix="tinyllama-1.1b-")
try:
    main(os.path.join(run_dir, "last.pt"))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
