"""summarize.py -- batched beam search with a 7B fp16 model on a 24 GiB card, inside the model's own
generate() (the Python adapter reads a generation from the stack):

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16).cuda()   # 14 GiB
    with torch.inference_mode():
        out = model.generate(batch_of_8, num_beams=4, max_new_tokens=2048)

Every new token adds one position to the KV cache of 8 x 4 sequences (24 MiB), held by generate()'s
own past_key_values, until the card is full after about 400 tokens.  Nothing leaks: the cache is the
generation's working set.  An expert: fewer sequences per call, fewer new tokens or beams, or a
quantized / offloaded cache; "stop keeping tensors alive across iterations" is not the first line.
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class CausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(28):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(512 * MiB, device="cuda")))

    def generate(self, input_ids, max_new_tokens, num_beams):
        past_key_values = []
        for _ in range(max_new_tokens):
            past_key_values.append(torch.empty(24 * MiB, device="cuda"))      # one position, 32 sequences
            logits = torch.empty(8 * num_beams * 32000 * 4, device="cuda")     # this step's logits
            del logits
            time.sleep(0.001)
        return past_key_values


model = CausalLM().eval()
try:
    with torch.inference_mode():
        input_ids = torch.empty(8 * 512 * 8, device="cuda")
        out = model.generate(input_ids, max_new_tokens=2048, num_beams=4)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
