"""nightly_eval.py -- the nightly evaluation of our 1.7B-parameter code model.  The trainer (8x A100
80GB) writes `last.pt` every 2,000 steps with its own save_checkpoint(): the model's state dict and
AdamW's state, flattened into one dict of tensors, straight from the GPU, as most training loops do.
The eval job runs on a single 24 GB card (an A10G box next to the trainer's shared storage):

    model = CodeLM(cfg).cuda().eval()                          # fp32, 6.4 GiB
    ckpt = torch.load("runs/codelm-1.8b/last.pt")              # no map_location
    model.load_state_dict({k[6:]: v for k, v in ckpt.items() if k.startswith("model.")})
    with torch.inference_mode():
        run_humaneval(model)

It worked for months while the trainer saved `model.state_dict()` only.  Since someone added the
optimizer state to `last.pt` (so that a preempted run can resume from it), the eval dies inside
torch.load: the tensors are restored onto the device they were saved from (cuda:0), so the card holds
the model (6.4 GiB), the checkpoint's copy of the weights (6.4 GiB) and AdamW's exp_avg/exp_avg_sq
(12.8 GiB): 25.6 GiB on a 24 GiB card.  It fails part way through the moments, before any evaluation.

An expert: load the checkpoint on the host, `torch.load(path, map_location="cpu")` (and only take
the "model." entries; better, have the trainer also write a weights-only file for eval).  Nothing
about batches, activations, precision of compute, caches or fragmentation: the model alone fits
with 17 GiB to spare.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, LAYERS, FFN = 49152, 2048, 32, 8192


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn_qkv = torch.nn.Parameter(torch.empty(HIDDEN * 3 * HIDDEN, dtype=torch.float32, device="cuda"))
        self.attn_out = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.float32, device="cuda"))
        self.mlp_up = torch.nn.Parameter(torch.empty(HIDDEN * FFN, dtype=torch.float32, device="cuda"))
        self.mlp_down = torch.nn.Parameter(torch.empty(FFN * HIDDEN, dtype=torch.float32, device="cuda"))


class CodeLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "h%d" % i, Block())

    def forward(self, ids):
        return torch.empty(4 * 2048 * VOCAB * 4, device="cuda")

    def state_names(self):
        """(qualified name, parameter), as PyTorch's named_parameters() gives them: wte, h0.attn_qkv, ..."""
        out = [("wte", self.wte)]
        for i in range(LAYERS):
            out.extend(("h%d.%s" % (i, k), p) for k, p in getattr(self, "h%d" % i)._parameters.items())
        return out


def trainer_checkpoint(path, model):
    """What the trainer's save_checkpoint() wrote (the stand-in's torch.save keeps only the sizes):
    model.<name> for every weight, then optimizer.state.<i>.exp_avg / exp_avg_sq for every weight."""
    sizes = {}
    params = model.state_names()
    for name, p in params:
        sizes["model." + name] = p.nbytes
    for i, (name, p) in enumerate(params):
        sizes["optimizer.state.%d.exp_avg" % i] = p.nbytes
        sizes["optimizer.state.%d.exp_avg_sq" % i] = p.nbytes
    sizes["optimizer.step"] = 512
    with open(path, "w") as fh:
        json.dump(sizes, fh)


def load_for_eval(path):
    model = CodeLM().cuda().eval()
    print("model on cuda:0: %.1f GiB" % (torch.cuda.memory_allocated() / 2.0 ** 30), file=sys.stderr)
    if not os.path.exists(path):
        trainer_checkpoint(path, model)                    # (the trainer's file; made here for the test)
    ckpt = torch.load(path)                                # restored onto cuda:0, where it was saved from
    model.load_state_dict({k[6:]: v for k, v in ckpt.items() if k.startswith("model.")})
    del ckpt
    return model


def run_humaneval(model):
    with torch.inference_mode():
        for _ in range(164):
            model(torch.empty(4 * 2048 * 8, device="cuda"))


def main():
    path = os.path.join(tempfile.mkdtemp(prefix="codelm-"), "last.pt")
    model = load_for_eval(path)
    run_humaneval(model)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
