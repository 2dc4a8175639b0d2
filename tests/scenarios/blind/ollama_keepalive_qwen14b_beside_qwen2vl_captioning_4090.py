"""caption_products.py -- captioning 40k product photos for our shop's alt texts with
Qwen2-VL-7B-Instruct in bf16 (8.3B parameters: 15.4 GiB) on my workstation's RTX 4090 (24 GiB):

    model = Qwen2VLForConditionalGeneration.from_pretrained(
        "Qwen/Qwen2-VL-7B-Instruct", torch_dtype=torch.bfloat16, device_map="cuda")
    processor = AutoProcessor.from_pretrained("Qwen/Qwen2-VL-7B-Instruct")
    for batch in loader: ...generate(max_new_tokens=64)...

Yesterday it loaded fine.  Today it dies while loading the weights, in the language model's layers,
with 12.7 GiB free.  I had been chatting with qwen2.5:14b in Ollama an hour ago (Open WebUI set
keep_alive to 24h): the `ollama` runner still holds 10.4 GiB on the card, and the X server 0.35 GiB.
This process has nothing else: the CUDA context and the weights loaded so far.

An expert: stop the other process (`ollama stop qwen2.5:14b`, or keep_alive=0 / OLLAMA_KEEP_ALIVE=5m),
then load again -- the model fits the card alone with 8 GiB to spare for generation.  The weights are
already bf16 and loaded straight onto the GPU from safetensors, so torch_dtype, map_location and
loading onto the CPU first change nothing; 4-bit quantization or offloading would make it fit beside
Ollama but cost quality or speed for no reason; restarting this script does not free Ollama's memory.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, VOCAB = 3584, 18944, 28, 152064


def bf16(n):
    return torch.empty(n, dtype=torch.bfloat16, device="cuda")


class Qwen2VLDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = torch.nn.Parameter(bf16(HIDDEN * HIDDEN + HIDDEN), requires_grad=False)
        self.k_proj = torch.nn.Parameter(bf16(HIDDEN * 512 + 512), requires_grad=False)
        self.v_proj = torch.nn.Parameter(bf16(HIDDEN * 512 + 512), requires_grad=False)
        self.o_proj = torch.nn.Parameter(bf16(HIDDEN * HIDDEN), requires_grad=False)
        self.gate_proj = torch.nn.Parameter(bf16(HIDDEN * INTER), requires_grad=False)
        self.up_proj = torch.nn.Parameter(bf16(HIDDEN * INTER), requires_grad=False)
        self.down_proj = torch.nn.Parameter(bf16(INTER * HIDDEN), requires_grad=False)


class Qwen2VisionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Module()
        for i in range(32):
            setattr(self.blocks, "b%d" % i, torch.nn.Parameter(bf16(675000000 // 32), requires_grad=False))


class Qwen2VLModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(bf16(VOCAB * HIDDEN), requires_grad=False)
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, Qwen2VLDecoderLayer())


class Qwen2VLForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.visual = Qwen2VisionTransformer()
        self.model = Qwen2VLModel()
        self.lm_head = torch.nn.Parameter(bf16(VOCAB * HIDDEN), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None):
        """transformers: the model is built on the meta device, then each shard's tensors are
        materialised on device_map's device in torch_dtype (safetensors, straight to the GPU)."""
        torch.set_default_dtype(torch_dtype)
        model = cls()
        model.eval()
        return model


def main():
    model = Qwen2VLForConditionalGeneration.from_pretrained("Qwen/Qwen2-VL-7B-Instruct", torch_dtype=torch.bfloat16,
                                                            device_map="cuda")
    print("loaded", file=sys.stderr)
    return model


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
