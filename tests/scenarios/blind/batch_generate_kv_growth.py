"""gen_synthetic.py -- offline synthetic-data generation with an 8B instruction model (bf16, 15 GiB,
grouped-query attention: 128 KiB of KV cache per token) on a 24 GiB card, 32 prompts at a time,
up to 2048 new tokens each:

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    for prompts in batched(dataset, 32):
        enc = tok(prompts, padding=True, return_tensors="pt").to("cuda")      # ~512 tokens
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=2048, do_sample=True)

The KV cache grows with every generated token (32 sequences x 128 KiB = 4 MiB a token, taken in
blocks of 16 tokens); the prefill's 2 GiB plus the growth reach the card's end at ~1650 new
tokens of the first batch, long before 2048.  The growth is the cache doing its job, not a leak:
nothing can be released.  An expert: fewer sequences per batch, a smaller max_new_tokens (or
max length), or a bounded/paged or quantized KV cache (a serving engine such as vLLM schedules
within a fixed KV budget); not gradient checkpointing, not a restart.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
KiB = 1 << 10
scen_truth.note_every_empty(torch)
BATCH, PROMPT, MAX_NEW, BLOCK = 32, 512, 2048, 16
KV_PER_TOKEN = 128 * KiB


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(1002 * MiB, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(1002 * MiB, device="cuda"))
        for i in range(n_layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(417 * MiB, device="cuda")))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def generate(self, input_ids, max_new_tokens):
        cache = []                                                     # the KV cache's blocks
        cache.append(torch.empty(BATCH * PROMPT * KV_PER_TOKEN, device="cuda"))       # prefill
        work = torch.empty(BATCH * PROMPT * 4096 * 2 * 6, device="cuda")   # the prefill's activations
        del work
        tokens = []
        for t in range(max_new_tokens):
            if t % BLOCK == 0:
                cache.append(torch.empty(BATCH * BLOCK * KV_PER_TOKEN, device="cuda"))
            logits = torch.empty(BATCH * 128256 * 4, device="cuda")   # last position, fp32
            tokens.append(t)
            del logits
        return tokens


def main():
    model = LlamaForCausalLM.from_pretrained("org/instruct-8b", torch_dtype=torch.bfloat16)
    for batch in range(100):
        with torch.inference_mode():
            input_ids = torch.empty(BATCH * PROMPT * 8, device="cuda")
            out = model.generate(input_ids, max_new_tokens=MAX_NEW)
            del input_ids, out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
