"""compare.py -- answers of a base model and its fine-tuned version, side by side, on one 24 GiB card; both
loaded in bf16 (10 GiB each) and kept on the GPU, run with plain `LD_PRELOAD=liboomguard.so`:

    base = LM.from_pretrained("org/base", torch_dtype=torch.bfloat16).cuda().eval()
    tuned = LM.from_pretrained("runs/tuned", torch_dtype=torch.bfloat16).cuda().eval()
    with torch.inference_mode():
        for prompt in prompts:
            a = base.generate(prompt, max_new_tokens=1024)
            b = tuned.generate(prompt, max_new_tokens=1024)

Both models load; the first generate() builds its KV cache (128 MiB per layer) and fails at layer 28 of
32: the two models leave 3.5 GiB.  An expert: one model at a time (all answers of the first, saved, then
the second), or the second model on another GPU; not a leak, not a restart, not a smaller batch first.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
LAYERS = 32
scen_truth.note_every_empty(torch)
# the weights (and every tensor made without a dtype) in bfloat16, sized in bytes as the stand-in's tensors are
torch.set_default_dtype(torch.bfloat16)


class LM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(40):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"),
                                                      requires_grad=False))

    def generate(self, prompt, max_new_tokens=1024):
        kv = []
        for layer in range(LAYERS):
            kv.append(torch.empty(128 * MiB, device="cuda"))   # keys and values
        return prompt


def main():
    base = LM()
    tuned = LM()
    with torch.inference_mode():
        for p in range(100):
            prompt = torch.empty(64 * 1024, device="cuda")
            a = base.generate(prompt)
            b = tuned.generate(prompt)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
