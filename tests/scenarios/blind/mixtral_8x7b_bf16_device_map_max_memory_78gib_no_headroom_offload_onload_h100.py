"""chat_eval.py -- a researcher runs Mixtral-8x7B-Instruct in bf16 (87 GiB of weights) on one 80 GB
H100 with accelerate's big-model inference, and squeezes as much of it onto the GPU as they can:

    model = AutoModelForCausalLM.from_pretrained(
        "mistralai/Mixtral-8x7B-Instruct-v0.1", torch_dtype=torch.bfloat16,
        device_map="auto", max_memory={0: "78GiB", "cpu": "160GiB"})
    out = model.generate(**tok(prompts, return_tensors="pt", padding=True).to("cuda"), max_new_tokens=200)

User: "Loading works -- 28 of the 32 layers are on the GPU, 4 offloaded to the CPU, 76 GiB used --
but the very first generate() fails on a 112 MiB allocation. 112 MiB, on an 80 GB card?"

What fills the memory: max_memory={0: "78GiB"} tells accelerate the GPU may hold 78 GiB of weights,
and it packs them to 75.9 GiB; with the CUDA context that leaves ~3.2 GiB. During generate the
prefill's KV cache and activations (8 prompts x 1,500 tokens) take ~1.4 GiB, and accelerate's offload hooks copy each offloaded
layer's weights onto the GPU for its forward (2.7 GiB for one Mixtral layer, 24 expert matrices of
112 MiB): the first offloaded layer does not fit the room left. The failing 112 MiB is one expert
matrix of that layer, not fragmentation: the card is full of resident weights.

An expert, first: leave headroom on the GPU in the device map -- max_memory for GPU 0 well below the
card (e.g. 60-65 GiB), so the KV cache, activations and one offloaded layer's on-the-fly copy fit
(NEW remedy id: device_map_headroom; accelerate's balanced map with max_memory, i.e.
balance_device_map, or offloading more to the CPU, cpu_offload, say the same). Better still for speed:
quantize (8-bit: 47 GiB, 4-bit: 25 GiB, the whole model on the GPU). Wrong advice: a smaller batch
or shorter prompts (one offloaded layer alone is 2.7 GiB), expandable_segments or empty_cache (no
fragmentation, nothing cached), inference_mode (generate already runs without grad), flash attention,
stopping other processes (there are none).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

VOCAB, HIDDEN, FFN, EXPERTS, LAYERS, KV_DIM = 32000, 4096, 14336, 8, 32, 1024
MAX_MEMORY = {0: 78 * GiB, "cpu": 160 * GiB}


class CpuWeight(object):
    """A weight accelerate keeps in CPU RAM (offloaded): no device memory until its forward."""
    is_cuda = False

    def __init__(self, elems):
        self.elems = elems


class MixtralDecoderLayer(torch.nn.Module):
    def __init__(self, on_gpu):
        torch.nn.Module.__init__(self)
        self.on_gpu = on_gpu
        shapes = [("attn_%s" % n, HIDDEN * (HIDDEN if n in "qo" else KV_DIM)) for n in "qkvo"]
        shapes += [("expert%d_w%d" % (e, w), HIDDEN * FFN) for e in range(EXPERTS) for w in (1, 2, 3)]
        self.shapes = shapes
        for name, n in shapes:
            if on_gpu:
                setattr(self, name, torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"),
                                                       requires_grad=False))
            else:
                object.__setattr__(self, name, CpuWeight(n))

    def pre_forward(self):
        """accelerate's AlignDevicesHook(offload=True): the offloaded weights are copied onto the
        execution device for this layer's forward, and dropped after it."""
        self._onloaded = []
        for name, n in self.shapes:
            self._onloaded.append(torch.empty(n, dtype=torch.bfloat16, device="cuda"))

    def forward(self, tokens, cache):
        if not self.on_gpu:
            self.pre_forward()
        cache.append(torch.empty(tokens * KV_DIM * 2, dtype=torch.bfloat16, device="cuda"))
        routed = torch.empty(tokens * 2 * FFN, dtype=torch.bfloat16, device="cuda")     # top-2 experts' hidden
        del routed
        self._onloaded = []
        return torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")


class MixtralForCausalLM(torch.nn.Module):
    def __init__(self, max_memory):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"),
                                               requires_grad=False)
        budget = max_memory[0] - VOCAB * HIDDEN * 2
        layer_bytes = (2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + EXPERTS * 3 * HIDDEN * FFN) * 2
        self.layers = []
        for i in range(LAYERS):           # infer_auto_device_map: fill GPU 0 up to max_memory[0], then "cpu"
            on_gpu = budget >= layer_bytes
            if on_gpu:
                budget -= layer_bytes
            layer = MixtralDecoderLayer(on_gpu)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = CpuWeight(VOCAB * HIDDEN)
        self.hf_device_map = dict(("model.layers.%d" % i, 0 if l.on_gpu else "cpu") for i, l in enumerate(self.layers))

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, device_map=None, max_memory=None):
        return cls(max_memory)

    def generate(self, batch, prompt_len, max_new_tokens=200):
        with torch.no_grad():
            cache = []
            tokens = batch * prompt_len
            h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
            for layer in self.layers:
                h = layer(tokens, cache)
        return ["..."] * batch


def main():
    model = MixtralForCausalLM.from_pretrained("mistralai/Mixtral-8x7B-Instruct-v0.1", torch_dtype=torch.bfloat16,
                                               device_map="auto", max_memory=MAX_MEMORY)
    on_gpu = sum(1 for v in model.hf_device_map.values() if v == 0)
    print("device map: %d layers on cuda:0, %d on cpu; allocated %.1f GiB" % (
        on_gpu, LAYERS - on_gpu, torch.cuda.memory_allocated() / GiB), flush=True)
    model.eval()
    out = model.generate(batch=8, prompt_len=1500, max_new_tokens=200)
    print(out[0])


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
