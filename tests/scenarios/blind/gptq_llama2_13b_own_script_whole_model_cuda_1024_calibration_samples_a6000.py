"""quantize_13b.py -- an ML engineer at a small company quantizes their fine-tuned Llama-2-13B (fp16,
24.2 GiB) to 4-bit GPTQ for a cheaper serving card, on the team's RTX A6000 (48 GB, 47.5 GiB usable).
The script is adapted from the GPTQ reference code (llama.py: llama_sequential), with two "simplifications":
the reference keeps the model on the CPU and moves one decoder layer at a time to the GPU; this version
does `model.cuda()` once ("the card has 48 GB, the layer shuffling was slow"), and the calibration set,
first 128 C4 segments of 2048 tokens, was raised to 1024 because the 4-bit model's wikitext perplexity
came out 0.2 worse than a public GPTQ build:

    model = LlamaForCausalLM.from_pretrained(FT, torch_dtype=torch.float16).cuda()
    model.seqlen = 2048
    dataloader = get_c4(nsamples=args.nsamples, seqlen=2048)           # --nsamples 1024
    @torch.no_grad()
    def llama_sequential(model, dataloader, dev):
        inps = torch.zeros((nsamples, model.seqlen, hidden_size), dtype=dtype, device=dev)
        ... Catcher on layers[0] fills inps with every sample's embeddings ...
        torch.cuda.empty_cache()
        outs = torch.zeros_like(inps)
        for i, layer in enumerate(layers): ... GPTQ per linear, outs -> inps ...

With 128 samples it ran (weights 24.2 + inps 2.5 + outs 2.5 GiB).  With 1024, inps is 1024 x 2048 x 5120
fp16 = 20 GiB; the weights and inps take 44.4 GiB allocated, and `outs = torch.zeros_like(inps)` asks for
another 20 GiB with 3.1 GiB free.  Autograd is off, nothing is cached, no layer has been quantized yet.

An expert: the whole 13B model sits on the GPU while GPTQ works on one decoder layer at a time -- 24 GiB
idle.  Keep the model on the CPU and move each layer to the GPU only while it is quantized (what the
reference code and AutoGPTQ do), which leaves room for inps and outs; and/or go back to a few hundred
calibration samples (or keep inps/outs in pinned host memory and stream them).  Wrong advice:
quantization or 8-bit loading (this job IS the quantization; loading the base in 8-bit would quantize
twice), loading in fp16 (it is), inference_mode/no_grad (already @torch.no_grad), gradient checkpointing,
flash attention or shorter sequences as a first fix (attention is not where the memory is; 2048-token
segments are GPTQ's standard), expandable_segments/empty_cache (the script already calls empty_cache;
nothing is cached).
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
HIDDEN, FF, V, NLAYERS = 5120, 13824, 32000, 40        # Llama-2-13B


def _half(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float16, device="cuda"), requires_grad=False)


# ---- transformers' Llama, as far as memory goes (fp16 weights, loaded on the CPU then .cuda())
class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj, self.k_proj = _half(HIDDEN * HIDDEN), _half(HIDDEN * HIDDEN)
        self.v_proj, self.o_proj = _half(HIDDEN * HIDDEN), _half(HIDDEN * HIDDEN)
        self.gate_proj, self.up_proj = _half(HIDDEN * FF), _half(HIDDEN * FF)
        self.down_proj = _half(FF * HIDDEN)
        self.input_layernorm, self.post_attention_layernorm = _half(HIDDEN), _half(HIDDEN)

    def forward(self, hidden_states, attention_mask=None):
        return (torch.empty(hidden_states.nbytes, device="cuda"),)


class LlamaModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = _half(V * HIDDEN)
        self.layers = [LlamaDecoderLayer() for _ in range(NLAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.norm = _half(HIDDEN)

    def forward(self, input_ids, seqlen):
        hidden_states = torch.empty(seqlen * HIDDEN, dtype=torch.float16, device="cuda")
        attention_mask = torch.empty(seqlen * seqlen, dtype=torch.float16, device="cuda")
        for layer in self.layers:
            hidden_states = layer(hidden_states, attention_mask=attention_mask)[0]
        return hidden_states


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = LlamaModel()
        self.lm_head = _half(HIDDEN * V)
        self.seqlen = 2048

    def forward(self, input_ids):
        return self.model(input_ids, self.seqlen)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()


def get_c4(nsamples, seqlen):
    for _ in range(nsamples):
        yield torch.empty(seqlen * 8, device="cuda")          # one random 2048-token C4 segment, int64


# ---- the script (GPTQ's llama_sequential, model already on the GPU)
class Catcher(nn.Module):
    def __init__(self, module, inps, cache):
        nn.Module.__init__(self)
        self.module = module
        self.inps, self.cache = inps, cache

    def forward(self, inp, attention_mask=None):
        # self.inps[cache['i']] = inp: the sample's embeddings copied into the preallocated buffer
        self.cache["i"] += 1
        self.cache["attention_mask"] = attention_mask
        raise ValueError


def llama_sequential(model, dataloader, dev, nsamples):
    with torch.no_grad():
        layers = model.model.layers
        dtype = torch.float16
        inps = torch.empty(nsamples * model.seqlen * HIDDEN, dtype=dtype, device=dev)   # torch.zeros(...)
        cache = {"i": 0, "attention_mask": None}
        layers[0] = Catcher(layers[0], inps, cache)
        for batch in dataloader:
            try:
                model(batch)
            except ValueError:
                pass
        layers[0] = layers[0].module
        torch.cuda.empty_cache()
        print("calibration inputs captured: %d samples, allocated %.1f GiB"
              % (cache["i"], torch.cuda.memory_allocated() / GiB))
        outs = torch.empty(inps.nbytes // 2, dtype=dtype, device=dev)                  # torch.zeros_like(inps)
        quantizers = {}
        for i in range(len(layers)):
            pass                                                  # add_batch hooks, fasterquant per linear ...
            inps, outs = outs, inps
        return quantizers


FT = "/data/ckpt/llama2-13b-support-sft-v3"
model = LlamaForCausalLM.from_pretrained(FT, torch_dtype=torch.float16).cuda()
model.eval()
print("model on cuda: %.1f GiB" % (torch.cuda.memory_allocated() / GiB))
nsamples = 1024
try:
    quantizers = llama_sequential(model, get_c4(nsamples, model.seqlen), "cuda", nsamples)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
