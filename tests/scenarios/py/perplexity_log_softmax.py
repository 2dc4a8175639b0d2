"""ppl.py -- perplexity of a 7B model (bf16 weights, 14 GiB) over long documents on a 24 GiB card, under
inference_mode, run with plain `LD_PRELOAD=liboomguard.so`:

    logits = model(input_ids).logits                          # [4, 4096, 131072] bf16: 4 GiB
    logp = F.log_softmax(logits, dim=-1, dtype=torch.float32) # 8 GiB more
    nll = -logp.gather(-1, labels[..., None]).mean()

log_softmax's float32 copy of the logits fails.  An expert: never make the full logits' log-probabilities:
a fused / chunked cross-entropy (F.cross_entropy over chunks of tokens), or fewer tokens at a time; not
quantization first, not a restart.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
# the weights (and every tensor made without a dtype) in bfloat16, sized in bytes as the stand-in's tensors are
torch.set_default_dtype(torch.bfloat16)


class LM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(28):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(512 * MiB, device="cuda"),
                                                      requires_grad=False))

    def forward(self, ids):
        return torch.empty(4096 * MiB, device="cuda")    # the logits


def main():
    model = LM()
    with torch.inference_mode():
        for doc in range(100):
            ids = torch.empty(128 * 1024, device="cuda")
            logits = model(ids)
            logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            del logits, logp, ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
