"""eval_judge.py -- an LLM-as-judge evaluation on one A100 40GB: a 7B generator answers 300 prompts,
then a 14B judge grades the answers.  The two models are never needed at the same time, but the
script keeps the generator (its `generator` variable, still referenced) when it loads the judge:

    gen = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3",
                                               torch_dtype=torch.bfloat16).cuda()       # 13.5 GiB
    with torch.inference_mode():
        answers = [generate(gen, tok, p, max_new_tokens=512) for p in prompts]
    judge = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct",
                                                 torch_dtype=torch.bfloat16).cuda()     # 27.9 GiB
    with torch.inference_mode():
        scores = [grade(judge, tok_j, p, a) for p, a in zip(prompts, answers)]

Generation runs (the KV cache comes and goes, 2 GiB at most); loading the judge fails near its
last layers: 13.5 GiB of generator weights are still live, the judge alone needs 27.9 GiB of the
39.5 GiB the card has after the context.  Each model alone fits with room to spare.  An expert:
free the generator before loading the judge (`del gen; gc.collect(); torch.cuda.empty_cache()`),
or run the two stages as two processes; a 4/8-bit judge would also fit but is not needed.  Batch
size, checkpointing and inference_mode are beside the point (weights, already bf16, under
inference_mode).
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class DecoderLM(torch.nn.Module):
    """A decoder-only LM as from_pretrained(...).cuda() leaves it: bf16 weights, layer by layer."""

    def __init__(self, n_layers, layer_mib, embed_mib):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(embed_mib * MiB, dtype=torch.uint8, device="cuda"))
        self.layers = []
        for i in range(n_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(layer_mib // 3 * MiB, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty((layer_mib - layer_mib // 3) * MiB, device="cuda"))
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(embed_mib * MiB, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        if "Mistral-7B" in name:
            return cls(32, 416, 250)           # 7.2B params, bf16: 13.5 GiB
        return cls(48, 546, 1190)             # 14.7B params, bf16: 27.9 GiB

    def cuda(self, device=None):
        return self


def generate(model, prompt_tokens, max_new_tokens=512):
    """HF generate: the KV cache grows with every new token, then goes with the call."""
    cache = []
    for step in range(0, max_new_tokens, 64):
        cache.append(torch.empty(64 * MiB, device="cuda"))        # 32 layers x 2 x 64 tokens, bf16
    logits = torch.empty(32 * MiB, device="cuda")
    del cache
    return logits


def main():
    gen = DecoderLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3", torch_dtype=torch.bfloat16).cuda()
    answers = []
    with torch.inference_mode():
        for p in range(300):
            out = generate(gen, p)
            answers.append(int(out.nbytes > 0))                  # decoded text, on the host
            del out
    judge = DecoderLM.from_pretrained("Qwen/Qwen2.5-14B-Instruct", torch_dtype=torch.bfloat16).cuda()
    with torch.inference_mode():
        for a in answers:
            generate(judge, a, max_new_tokens=8)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
