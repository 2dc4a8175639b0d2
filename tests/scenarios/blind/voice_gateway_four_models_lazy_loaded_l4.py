"""gateway.py -- one FastAPI process serving our voice assistant's four models on a 24 GiB L4, each model
loaded on the first request to its route and kept in a dict for the next ones; run with plain
`LD_PRELOAD=liboomguard.so`:

    MODELS = {}
    def get_model(route):
        if route not in MODELS:
            MODELS[route] = load(route)             # from_pretrained(..., torch_dtype=bfloat16).cuda()
        return MODELS[route]

    /transcribe  whisper-large-v3       fp16   2.9 GiB
    /summarize   Llama-3.1-8B-Instruct  bf16  15.0 GiB
    /embed       bge-m3                 fp16   1.1 GiB
    /moderate    Llama-Guard-3-8B       bf16  15.0 GiB   (the route added this week)

The first three together with the context take 19.5 GiB.  The first /moderate request loads
Llama-Guard: after 4 GiB of its weights the card is full, and the request dies while loading.  No model
is being used when it happens; the transcriber, embedder and summarizer sit idle in MODELS.

An expert: the resident set of models does not fit one 24 GiB card -- two 8B models alone are 30 GiB.
Keep only the models in use on the GPU (an LRU bound on the model dict that moves idle models to CPU
memory, or one model at a time), or serve the moderation model from another GPU/process, or quantize
the 8B models to 4-bit.  Not a smaller batch (one request), not inference_mode, not a cache or
fragmentation problem, not a leak.
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self, mib, dtype):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, dtype=dtype, device="cuda"), requires_grad=False)


class PretrainedModel(torch.nn.Module):
    def __init__(self, n_layers, layer_mib, embed_mib, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Block(embed_mib, dtype)
        self.layers = []
        for i in range(n_layers):
            layer = Block(layer_mib, dtype)
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)

    def forward(self, x):
        return torch.empty(4 * MiB, device="cuda")


class WhisperForConditionalGeneration(PretrainedModel):
    pass


class LlamaForCausalLM(PretrainedModel):
    pass


class XLMRobertaModel(PretrainedModel):
    pass


def from_pretrained(name, torch_dtype):
    if name == "openai/whisper-large-v3":
        return WhisperForConditionalGeneration(64, 23, 40, torch_dtype)          # 1.55B fp16
    if name == "BAAI/bge-m3":
        return XLMRobertaModel(24, 8, 352, torch_dtype)                          # 568M fp16
    # Llama-3.1-8B and Llama-Guard-3-8B: 32 layers of 218M + embeddings and head of 525M each
    return LlamaForCausalLM(32, 208, 1002, torch_dtype)


ROUTES = {
    "transcribe": ("openai/whisper-large-v3", torch.float16),
    "summarize": ("meta-llama/Llama-3.1-8B-Instruct", torch.bfloat16),
    "embed": ("BAAI/bge-m3", torch.float16),
    "moderate": ("meta-llama/Llama-Guard-3-8B", torch.bfloat16),
}
MODELS = {}


def load(route):
    name, dtype = ROUTES[route]
    model = from_pretrained(name, torch_dtype=dtype)
    return model.cuda().eval()


def get_model(route):
    if route not in MODELS:
        MODELS[route] = load(route)
    return MODELS[route]


def handle(route, payload):
    model = get_model(route)
    with torch.inference_mode():
        out = model(payload)
    return out.nbytes


def main():
    # the morning's traffic, in the order the routes were first hit
    requests = [("transcribe", 1), ("transcribe", 2), ("summarize", 3), ("embed", 4), ("summarize", 5),
                ("transcribe", 6), ("embed", 7), ("moderate", 8), ("summarize", 9)]
    for route, payload in requests:
        handle(route, payload)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
