"""GPTQ of Qwen2.5-14B layer by layer on an 8 GB RTX 3070 with 128 unpadded in-domain calibration documents of every
length: the cache splinters within the first layers, and a Hessian-sized request fails with 3 GiB reserved but
unallocated.

The real program (the user's `gptq_qwen14b.py`, the GPTQ repository's sequential loop as GPTQModel runs it, batch
size 1; the calibration samples are 128 of the firm's own contracts, each kept at its own length instead of the
repository's fixed 2048-token windows, "so that the model sees whole documents"):

    tok = AutoTokenizer.from_pretrained("Qwen/Qwen2.5-14B-Instruct")
    calib = [tok(doc, truncation=True, max_length=8192, return_tensors="pt").input_ids
             for doc in random.sample(contracts, 128)]                              # 62 to 8192 tokens each
    model = AutoModelForCausalLM.from_pretrained(..., torch_dtype=torch.float16)   # on the CPU (29.5 GB of RAM)
    layer_inputs, layer_kwargs = catch_layer0_inputs(model, calib, dev)            # embed_tokens on the GPU, then back
    for i, layer in enumerate(model.model.layers):
        layer.to(dev)
        subset = find_layers(layer)
        gptq = {n: GPTQ(subset[n]) for n in subset}                                # H: zeros(cols, cols) float32
        hooks = [subset[n].register_forward_hook(add_batch(gptq[n])) for n in subset]
        for inp, kw in zip(layer_inputs, layer_kwargs):
            layer(inp, **kw)
        for h in hooks: h.remove()
        for n in subset:
            gptq[n].fasterquant(blocksize=128, percdamp=0.01, group_size=128, actorder=True)
            quantizers[f"model.layers.{i}.{n}"] = gptq[n].quantizer.to("cpu")
            gptq[n].free()
        layer_outputs = [layer(inp, **kw)[0] for inp, kw in zip(layer_inputs, layer_kwargs)]
        layer.cpu(); del gptq; torch.cuda.empty_cache()
        layer_inputs = layer_outputs

Sizes: Qwen2.5-14B: 48 layers, hidden 5120, MLP 13824, 40 query / 8 KV heads of 128.  A layer's fp16 weights:
0.65 GiB.  The 128 documents hold 262,324 tokens (median ~1500, longest 8192): the list of one layer's inputs is
262324 x 5120 x 2 B = 2.5 GiB, and while the outputs list is built both are alive (5 GiB).  Hessians: six of
5120^2 x 4 B = 100 MiB and down_proj's 13824^2 x 4 B = 729 MiB; fasterquant adds the fp32 copy of W, its permuted
copy, Q and Losses (270 MiB each for an MLP projection) and the Cholesky factors (729 MiB each for down_proj).
Per sample the layer makes temporaries of that sample's length (the MLP's 8192 x 13824 x 2 B = 216 MiB tensors
for the longest, add_batch's float32 copy of each projection's input, up to 432 MiB).  The peak of live tensors is
5.9 GiB (+0.5 GiB CUDA context) on a card of 8 GiB: the job fits, with 1.6 GiB to spare.

What happens: every tensor has its own size -- 128 lengths times five widths -- and the caching allocator serves
each from the best-fitting cached block, splitting it.  What outlives the samples' temporaries (each projection's
quantized weight written back into the layer, its scales and zeros, the permuted Hessian and weight copies of
fasterquant) is carved out of the middle of blocks that those temporaries left, so the segments can neither be
merged nor returned to the driver (the allocator's release-and-retry frees only wholly free segments).  In the
fourth layer (model.layers.3), fasterquant of down_proj asks for its Cholesky factor (13824^2 x 4 B = 729 MiB)
and cudaMalloc fails: 464 MiB free on the device, 4.0 GiB allocated, 3.0 GiB reserved by PyTorch but unallocated,
in pieces all smaller than 729 MiB.

What an expert says first: fragmentation of the caching allocator -- export
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb) before starting; cutting the calibration
into fixed 2048-token windows (as the GPTQ paper does) or sorting the samples by length removes the mix of sizes.
Wrong advice: a bigger GPU or a smaller model, fewer calibration samples "because the data does not fit",
gradient checkpointing or mixed precision (nothing trains; fp16 already), inference_mode (the whole loop runs under
torch.no_grad), torch.cuda.empty_cache() (it is called after every layer already, and cannot return split segments).
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL = "Qwen/Qwen2.5-14B-Instruct"
HIDDEN, INTERMEDIATE, N_LAYERS, VOCAB = 5120, 13824, 48, 152064
N_HEADS, N_KV_HEADS, HEAD_DIM = 40, 8, 128
NSAMPLES, MAX_LENGTH = 128, 8192
GROUP_SIZE = 128
DEV = "cuda:0"


def empty(numel, dtype=torch.float16):
    return torch.empty(numel, dtype=dtype, device=DEV)


def tokens_of(x, width):
    return x.nbytes // (width * 2)


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.forward_hooks = []

    def to(self, dev):
        self.weight = nn.Parameter(empty(self.in_features * self.out_features), requires_grad=False)
        return self

    def cpu(self):
        self._parameters.pop("weight", None)       # the fp16 weight goes back to the CPU copy
        return self

    def register_forward_hook(self, hook):
        self.forward_hooks.append(hook)
        return hook

    def forward(self, x):
        for hook in self.forward_hooks:
            hook(self, x)
        return empty(tokens_of(x, self.in_features) * self.out_features)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, N_HEADS * HEAD_DIM)
        self.k_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM)
        self.v_proj = Linear(HIDDEN, N_KV_HEADS * HEAD_DIM)
        self.o_proj = Linear(N_HEADS * HEAD_DIM, HIDDEN)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def projections(self):
        return {"self_attn.q_proj": self.q_proj, "self_attn.k_proj": self.k_proj, "self_attn.v_proj": self.v_proj,
                "self_attn.o_proj": self.o_proj, "mlp.gate_proj": self.gate_proj, "mlp.up_proj": self.up_proj,
                "mlp.down_proj": self.down_proj}

    def to(self, dev):
        for lin in self.projections().values():
            lin.to(dev)
        return self

    def cpu(self):
        for lin in self.projections().values():
            lin.cpu()
        return self

    def forward(self, hidden_states, position_ids=None, position_embeddings=None):
        n = tokens_of(hidden_states, HIDDEN)
        x = empty(n * HIDDEN)                                   # input_layernorm
        q, k, v = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        attn = empty(n * HIDDEN)                                # sdpa
        del q, k, v
        h = self.o_proj(attn)
        del attn, x
        x = empty(n * HIDDEN)                                   # post_attention_layernorm
        gate, up = self.gate_proj(x), self.up_proj(x)
        act = empty(n * INTERMEDIATE)                           # silu(gate) * up
        del gate, up
        out = self.down_proj(act)
        del act, x, h
        return (out,)


class GPTQ(object):
    def __init__(self, layer):
        self.layer = layer
        self.rows, self.columns = layer.out_features, layer.in_features
        self.H = empty(self.columns * self.columns, torch.float32)
        self.nsamples = 0

    def add_batch(self, module, inp):
        inp32 = empty(tokens_of(inp, self.columns) * self.columns, torch.float32)   # math.sqrt(2 / n) * inp.float()
        self.nsamples += 1                                                          # self.H += inp32 @ inp32.t()
        del inp32

    def fasterquant(self, blocksize=128, percdamp=.01, group_size=-1, actorder=False):
        n = self.rows * self.columns
        W = empty(n, torch.float32)                              # self.layer.weight.data.clone().float()
        H = self.H
        del self.H
        if actorder:
            W = empty(n, torch.float32)                          # W[:, perm]
            H = empty(self.columns ** 2, torch.float32)          # H[perm][:, perm]
        Losses = empty(n, torch.float32)
        Q = empty(n, torch.float32)
        Hinv = empty(self.columns ** 2, torch.float32)           # torch.linalg.cholesky(H)
        del H
        Hinv = empty(self.columns ** 2, torch.float32)           # cholesky_inverse, then cholesky(upper=True)
        self.scale = empty(self.columns // group_size * self.rows)
        self.zero = empty(self.columns // group_size * self.rows)
        self.layer.weight = nn.Parameter(empty(n), requires_grad=False)   # Q.reshape(W.shape).to(fp16)
        del W, Losses, Hinv, Q

    def free(self):
        self.H = None
        self.scale = self.zero = None


def contract_calibration(nsamples, max_length, seed=0):
    """Token counts of nsamples of the firm's contracts, truncated at max_length, not padded."""
    rng = random.Random(seed)
    return [min(max_length, max(62, int(rng.lognormvariate(7.3, 0.9)))) for _ in range(nsamples)]


def catch_layer0_inputs(lengths):
    embed_tokens = empty(VOCAB * HIDDEN)                         # model.model.embed_tokens.to(dev)
    layer_inputs, layer_kwargs = [], []
    for n in lengths:
        layer_inputs.append(empty(n * HIDDEN))                   # the Catcher keeps hidden_states
        layer_kwargs.append({"position_ids": None})
    del embed_tokens                                             # back to the CPU
    torch.cuda.empty_cache()
    return layer_inputs, layer_kwargs


def quantize_sequential(layers, lengths):
    layer_inputs, layer_kwargs = catch_layer0_inputs(lengths)
    quantizers = {}
    for i, layer in enumerate(layers):
        layer.to(DEV)
        subset = layer.projections()
        gptq = {name: GPTQ(subset[name]) for name in subset}
        for name in subset:
            subset[name].register_forward_hook(gptq[name].add_batch)
        for inp, kw in zip(layer_inputs, layer_kwargs):
            layer(inp, **kw)
        for name in subset:
            subset[name].forward_hooks = []
        for name in subset:
            gptq[name].fasterquant(blocksize=128, percdamp=0.01, group_size=GROUP_SIZE, actorder=True)
            quantizers["model.layers.%d.%s" % (i, name)] = "on cpu"
            gptq[name].free()
        layer_outputs = [layer(inp, **kw)[0] for inp, kw in zip(layer_inputs, layer_kwargs)]
        layer.cpu()
        del gptq
        torch.cuda.empty_cache()
        layer_inputs = layer_outputs
        print("layer %d/%d done" % (i + 1, len(layers)), flush=True)
    return quantizers


def main():
    lengths = contract_calibration(NSAMPLES, MAX_LENGTH)
    print("%s: %d calibration samples, %d tokens, longest %d" % (MODEL, len(lengths), sum(lengths), max(lengths)))
    layers = [Qwen2DecoderLayer() for _ in range(N_LAYERS)]     # the fp16 model, on the CPU
    with torch.no_grad():
        quantizers = quantize_sequential(layers, lengths)
    print("quantized %d linear layers" % len(quantizers))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
