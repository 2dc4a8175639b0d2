"""eval_mmlu.py -- a researcher evaluates a fine-tuned Llama-3.1-8B checkpoint with a Hugging Face
script on her 24 GiB workstation GPU:

    model = AutoModelForCausalLM.from_pretrained("out/llama31-8b-sft", torch_dtype=torch.bfloat16).cuda()
    with torch.inference_mode():
        for batch in mmlu_loader: ...

In another tmux window, `vllm serve out/llama31-8b-sft` from yesterday's demo is still running: vLLM
reserved gpu_memory_utilization=0.9 of the card (21.6 GiB: weights plus its KV-cache pool) at start
and keeps it while idle; nvidia-smi lists it as pid 48213, python3.  The script's 15 GiB of weights
fail to load after ~1.9 GiB.  This process holds nothing else, and it has never run on this card
with the server up.  An expert: the memory belongs to the other process -- stop the vLLM server (or
send the evaluation's requests to it instead of loading the model a second time); quantizing or
shrinking this job is not the fix.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(1002 * MiB, dtype=torch.uint8, device="cuda"))
        for i in range(n_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(80 * MiB, dtype=torch.uint8, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty(336 * MiB, dtype=torch.uint8, device="cuda"))
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(1002 * MiB, dtype=torch.uint8, device="cuda"))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()


def main():
    model = LlamaForCausalLM.from_pretrained("out/llama31-8b-sft", torch_dtype=torch.bfloat16).cuda()
    model.eval()
    with torch.inference_mode():
        for batch in range(1000):
            x = torch.empty(8 * 2048 * 8, device="cuda")
            del x


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
