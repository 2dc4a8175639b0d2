"""serve.py -- loading a 7B-parameter model for inference on a 24 GiB card:

    model = AutoModelForCausalLM.from_pretrained("org/7b")      # no torch_dtype: fp32, 28 GiB
    model.to("cuda").eval()

The checkpoint is stored in bf16 (14 GiB), but without torch_dtype the weights are materialized in
fp32: 4 bytes per parameter, 28 GiB, and the load fails at layer 27 of 32.  An expert:
from_pretrained(..., torch_dtype=torch.bfloat16) (it fits with 9 GiB to spare); quantization is a
fallback, not needed; nothing else is on the card.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
empty = scen_truth.torch_empty
weights = []
try:
    with torch.inference_mode():
        weights.append(empty(500 * MiB, device="cuda"))                   # embeddings, fp32
        for layer in range(32):
            for _ in range(4):
                weights.append(empty(216 * MiB, device="cuda"))           # one layer's fp32 matrices
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
