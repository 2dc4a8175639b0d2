"""serve_assistant.py -- an internal chat assistant (a 7B Llama-style model) served on a 48 GB card
that the team shares with a colleague's training job, with plain `LD_PRELOAD=liboomguard.so`:

    torch.cuda.set_per_process_memory_fraction(0.45)   # leave the rest to Priya's training run
    model = LlamaForCausalLM.from_pretrained("/models/assistant-7b")   # no torch_dtype=...
    model.eval()
    with torch.inference_mode():
        ...  # serve requests, KV cache of up to 8 x 4096 tokens

The checkpoint on disk is bfloat16 (13.5 GB, config.json says "torch_dtype": "bfloat16"), but
from_pretrained without torch_dtype builds the model in PyTorch's default float32: 25 GiB of
weights.  The cap is 45% of the card, 21.6 GiB; the colleague's job (another process, 20 GiB) is
running as agreed.  Loading stops in the 29th of 32 decoder layers when the caching allocator would
pass its fraction: PyTorch refuses the segment itself, with 5.9 GiB still free on the card.

An expert: the cap is doing its job; the model is loaded at twice its size.  Load it in its
checkpoint's dtype (torch_dtype=torch.bfloat16 or "auto": 12.5 GiB of weights, leaving 9 GiB of the
share for the KV cache), or quantize it.  Raising the fraction cannot hold 25 GiB of fp32 weights
next to the colleague's 20 GiB anyway (and breaks the agreement); stopping the colleague's process
is not the answer; a smaller batch, checkpointing, empty_cache or expandable segments change nothing
while weights load.
"""
import json
import os
import sys
import tempfile

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

SHARE_OF_CARD = 0.45          # agreed with the team: the rest of the card is the training job's


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, hidden, inter, dtype):
        torch.nn.Module.__init__(self)
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, name, torch.nn.Parameter(torch.empty(hidden * hidden, dtype=dtype, device="cuda")))
        for name in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, name, torch.nn.Parameter(torch.empty(hidden * inter, dtype=dtype, device="cuda")))
        self.input_layernorm = torch.nn.Parameter(torch.empty(hidden, dtype=dtype, device="cuda"))


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, config, dtype):
        torch.nn.Module.__init__(self)
        h, v = config["hidden_size"], config["vocab_size"]
        self.embed_tokens = torch.nn.Parameter(torch.empty(v * h, dtype=dtype, device="cuda"))
        self.layers = []
        for i in range(config["num_hidden_layers"]):
            layer = LlamaDecoderLayer(h, config["intermediate_size"], dtype)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = torch.nn.Parameter(torch.empty(v * h, dtype=dtype, device="cuda"))

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None, device_map="cuda"):
        with open(os.path.join(path, "config.json")) as f:
            config = json.load(f)
        # as transformers does: without torch_dtype the model is built in the default dtype (float32),
        # whatever the checkpoint holds
        dtype = torch_dtype or torch.get_default_dtype()
        model = cls(config, dtype)
        state_dict = torch.load(os.path.join(path, "model.safetensors.json"), map_location="cpu")
        model.load_state_dict(state_dict)
        return model


def fake_checkpoint():
    """/models/assistant-7b as the hub ships it: config.json (bfloat16) and the weights' index."""
    d = tempfile.mkdtemp(prefix="assistant-7b-")
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                   "vocab_size": 32000, "torch_dtype": "bfloat16"}, f)
    with open(os.path.join(d, "model.safetensors.json"), "w") as f:
        json.dump({}, f)
    return d


def main():
    torch.cuda.set_per_process_memory_fraction(SHARE_OF_CARD)
    model = LlamaForCausalLM.from_pretrained(fake_checkpoint())
    model.eval()
    return model


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
