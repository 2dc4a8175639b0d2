"""chat_demo.py -- an internal Gradio demo of Llama-2-13B-chat (fp16, 24.3 GiB) on a box with two
24 GB cards.  The model does not fit one card, so the developer spread it with accelerate, choosing
device_map="sequential" (fill GPU 0 first, then GPU 1) after "auto" had put the embedding on GPU 1
once:

    model = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-2-13b-chat-hf", torch_dtype=torch.float16,
                                                 device_map="sequential")       # no max_memory
    with torch.inference_mode():
        out = model.generate(**tok(history, return_tensors="pt").to("cuda:0"), max_new_tokens=512,
                             cache_implementation="static")

Sequential placement puts the embedding and decoder layers 0-33 on GPU 0 (20.4 GiB) and only layers
34-39, the norm and lm_head on GPU 1 (3.9 GiB).  generate() preallocates each layer's static KV
cache on that layer's GPU (4096 positions: 80 MiB per layer), and a long chat history's prefill
runs eager attention with 1.25 GiB score matrices per layer -- all on GPU 0, which runs out in the
first layer's attention while GPU 1 has ~19 GiB free.

An expert: the split is lopsided, not the model too big for two cards: balance it
(device_map="balanced", or max_memory={0: "14GiB", 1: "22GiB"}) so each GPU keeps room for its KV
cache and activations, i.e. put the work on the idle GPU.  Already fp16 inference under
inference_mode; no other process; empty_cache/expandable segments do nothing; a bigger card or
quantization are not needed.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

max_cache_len = 4096
prompt_len = 4000


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, device):
        torch.nn.Module.__init__(self)
        self.device = device
        self.weight = torch.nn.Parameter(torch.empty(303 * MiB, dtype=torch.float16, device=device),
                                         requires_grad=False)

    def forward(self, hidden, kv):
        # eager attention over the whole prompt: 40 heads x 4000 x 4000 fp16 scores, then softmax
        scores = torch.empty(40 * prompt_len * prompt_len * 2, device=self.device)
        probs = torch.empty(40 * prompt_len * prompt_len * 2, device=self.device)
        del scores
        out = torch.empty(prompt_len * 5120 * 2, device=self.device)
        del probs
        return out


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        # device_map="sequential": GPU 0 until it is full, the rest on GPU 1
        self.embed_tokens = torch.nn.Parameter(torch.empty(160 * MiB, dtype=torch.float16, device="cuda:0"),
                                               requires_grad=False)
        self.layers = []
        for i in range(40):
            layer = LlamaDecoderLayer("cuda:0" if i < 34 else "cuda:1")
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(160 * MiB, dtype=torch.float16, device="cuda:1"),
                                          requires_grad=False)

    def forward(self, input_ids, past_key_values):
        hidden = torch.empty(prompt_len * 5120 * 2, device="cuda:0")
        for layer, kv in zip(self.layers, past_key_values):
            hidden = layer(hidden, kv)
        return torch.empty(32000 * 2, device="cuda:1")

    def generate(self, input_ids, max_new_tokens):
        # StaticCache: keys and values for max_cache_len positions, on each layer's own device
        past_key_values = [torch.empty(2 * max_cache_len * 5120 * 2, device=layer.device) for layer in self.layers]
        logits = self(input_ids, past_key_values)
        return logits


def main():
    model = LlamaForCausalLM().eval()
    history = torch.empty(prompt_len * 8, device="cuda:0")
    with torch.inference_mode():
        out = model.generate(history, max_new_tokens=512)
    del out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
