"""generate.py -- batched text generation with a 7B model in fp16 on a 24 GiB card, run with plain
`LD_PRELOAD=liboomguard.so python generate.py` (the adapter loads itself):

    model = AutoModelForCausalLM.from_pretrained(name, torch_dtype=torch.float16).cuda()
    with torch.inference_mode():
        out = model.generate(batch_of_32_prompts, max_new_tokens=4096)

Every generated token adds one position to the KV cache of all 32 sequences (2 x 32 layers x 4096
hidden x 2 bytes x 32 sequences = 16 MiB), so memory rises by 16 MiB per step until the card is
full.  Nothing leaks: the cache is what generation keeps by design.  An expert's first lines: this
is the KV cache growing with batch x length, so fewer sequences at once or fewer new tokens (or a
quantized / paged cache), not empty_cache or expandable segments, and not a training-loop fix.
At the driver only the cache misses show: one 16 MiB allocation per token (the step's other tensors
come from the allocator's cache).
"""
import sys
import time

import torch

import scen_truth

MiB = 1 << 20

weights = [torch.empty(512 * MiB, device="cuda:0") for _ in range(28)]   # 14 GiB of fp16 weights
kv_cache = []
with torch.inference_mode():
    for token in range(4096):
        n = 16 * MiB
        try:
            kv_cache.append(torch.empty(n, device="cuda:0"))        # one more position for 32 sequences
            logits = torch.empty(32 * 32000 * 4, device="cuda:0")    # this step's logits, freed below
        except torch.OutOfMemoryError:
            st = torch.cuda.memory_stats()
            scen_truth.mark("fail", 0, scen_truth.torch_segment_size(n),
                            allocated=st["allocated_bytes.all.current"], reserved=st["reserved_bytes.all.current"],
                            released=0, fw=1)
            raise
        del logits
        time.sleep(0.002)                                            # the forward pass (a real one: ~30 ms)
sys.exit(0)
