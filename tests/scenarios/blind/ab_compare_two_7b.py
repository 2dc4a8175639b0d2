"""ab_eval.py -- a side-by-side evaluation of a 7B base model and its DPO-tuned version on a 24 GiB
card: both are loaded in bf16 so that every prompt can be answered by the two models in turn and
the answers sent to a judge:

    base = AutoModelForCausalLM.from_pretrained("org/7b", torch_dtype=torch.bfloat16).to("cuda").eval()
    tuned = AutoModelForCausalLM.from_pretrained("runs/7b-dpo", torch_dtype=torch.bfloat16).to("cuda").eval()
    with torch.inference_mode():
        for prompt in prompts:
            a = base.generate(**tok(prompt, return_tensors="pt").to("cuda"), max_new_tokens=512)
            b = tuned.generate(...)

Each model is 12.6 GiB in bf16 (already the checkpoint's dtype).  The first one loads; the second
fails in its layer 29 of 32 with 26 MiB free: two copies of a 7B model do not fit a 24 GiB card.
An inference job that never ran a prompt; nothing cached, nothing grows, no other process.  An
expert: one model at a time -- generate all answers with the base model, save them, del the model
and empty the cache, then load the tuned one (the judge compares saved texts); or put the second
model on another GPU.  Quantizing both to 8-bit would fit but changes what is compared; a smaller
batch, checkpointing or mixed precision are beside the point.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
HIDDEN, FFN, LAYERS, VOCAB = 4096, 11008, 32, 32000
scen_truth.note_every_empty(torch)


# bf16 tensors: the stand-in sizes tensors in bytes and types each one by the default dtype when it is
# made, so bf16 ones are made with the default dtype set to bfloat16 (what from_pretrained(...,
# torch_dtype=torch.bfloat16) does while it builds the model); compiled as part of torch's file (as
# scen_truth's wrappers are) so that the failing Python line stays the program's.
_BF16 = """
def bf16_empty(nbytes):
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        return torch.empty(nbytes, device="cuda")
    finally:
        torch.set_default_dtype(prev)
"""
_ns = {"torch": torch}
exec(compile(_BF16, torch.__file__, "exec"), _ns)
bf16_empty = _ns["bf16_empty"]


def weight(numel):
    return torch.nn.Parameter(bf16_empty(numel * 2))        # bf16, loaded from the shard


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, n, weight(HIDDEN * HIDDEN))
        for n in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, n, weight(HIDDEN * FFN))


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.lm_head = weight(VOCAB * HIDDEN)

    def generate(self, ids, max_new_tokens=512):
        kv = [bf16_empty(2 * 2048 * HIDDEN * 2) for _ in range(LAYERS)]
        return ids


def from_pretrained(path, torch_dtype=None):
    """Loads the checkpoint shard by shard straight onto the GPU (device_map="cuda" / .to("cuda"))."""
    return LlamaForCausalLM()


def main():
    base = from_pretrained("org/7b", torch_dtype=torch.bfloat16).eval()
    tuned = from_pretrained("runs/7b-dpo", torch_dtype=torch.bfloat16).eval()
    with torch.inference_mode():
        for prompt in range(500):
            ids = torch.empty(2048 * 8, device="cuda")
            a = base.generate(ids)
            b = tuned.generate(ids)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
