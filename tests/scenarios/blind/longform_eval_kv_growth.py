"""eval_longform.py -- evaluating a 7B chat model (bf16, 12.6 GiB, multi-head attention: 512 KiB of
KV cache per token) on a long-form writing benchmark on a 24 GiB card, lm-eval-harness style:
24 prompts of ~400 tokens per batch, generation until EOS or max_gen_toks=4096:

    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.bfloat16).cuda()
    for batch in chunks(requests, 24):
        enc = tok(batch, padding=True, return_tensors="pt").to("cuda")
        with torch.no_grad():
            out = model.generate(**enc, max_new_tokens=4096, eos_token_id=tok.eos_token_id)
        results += tok.batch_decode(out)

The cache grows with every generated token (24 sequences x 512 KiB = 12 MiB a token).  The first
batches stop at EOS after 250-300 tokens and give everything back (memory is the same at the start
of every batch: the prefill's 4.7 GiB of cache and its fp32 logits over the whole prompt).  In the
fourth batch one answer never emits EOS, the batch keeps decoding, and at ~520 new tokens the
cache reaches the end of the card.  Nothing leaks between batches.  An expert: the generation's
worst case does not fit: fewer prompts per batch, a smaller max_gen_toks (or a stop criterion), or
a bounded/quantized/paged KV cache; not a leak fix, not gradient checkpointing (no training), not
a restart.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
KiB = 1 << 10
scen_truth.note_every_empty(torch)
BATCH, PROMPT, MAX_NEW = 24, 400, 4096
KV_PER_TOKEN = 512 * KiB
EOS_AT = [240, 310, 280, None]          # the fourth batch rambles on


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))
        for i in range(n_layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(388 * MiB, device="cuda")))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def generate(self, input_ids, max_new_tokens, eos_at):
        past_key_values = [torch.empty(BATCH * PROMPT * KV_PER_TOKEN, device="cuda")]    # prefill
        logits = torch.empty(BATCH * PROMPT * 32000 * 4, device="cuda")   # fp32 logits, every position
        del logits
        tokens = []
        for t in range(max_new_tokens):
            past_key_values.append(torch.empty(BATCH * KV_PER_TOKEN, device="cuda"))     # one more token
            logits = torch.empty(BATCH * 32000 * 4, device="cuda")
            tokens.append(t)
            del logits
            if eos_at is not None and t + 1 >= eos_at:
                break
        return tokens


def main():
    model = LlamaForCausalLM.from_pretrained("org/chat-7b", torch_dtype=torch.bfloat16)
    results = []
    for b, eos_at in enumerate(EOS_AT):
        input_ids = torch.empty(BATCH * PROMPT * 8, device="cuda")
        with torch.no_grad():
            out = model.generate(input_ids, max_new_tokens=MAX_NEW, eos_at=eos_at)
        results.append(len(out))
        del input_ids, out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
