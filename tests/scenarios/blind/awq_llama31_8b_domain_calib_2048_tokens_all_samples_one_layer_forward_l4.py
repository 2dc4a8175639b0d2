"""AutoAWQ 4-bit quantization of Llama-3.1-8B-Instruct on a single NVIDIA L4 (24 GB, 22.5 GiB usable),
with a domain calibration set of long texts.

The real script (quantize_awq.py, AutoAWQ 0.2.x, transformers 4.4x):

    from awq import AutoAWQForCausalLM
    from transformers import AutoTokenizer

    model_path = "meta-llama/Llama-3.1-8B-Instruct"
    model = AutoAWQForCausalLM.from_pretrained(model_path, low_cpu_mem_usage=True, use_cache=False)  # on the CPU
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    calib = [r["text"] for r in load_dataset("json", data_files="claims_notes.jsonl")["train"]]
    quant_config = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}
    model.quantize(tokenizer, quant_config=quant_config, calib_data=calib,
                   max_calib_samples=128, max_calib_seq_len=2048)     # defaults are 128 and 512
    model.save_quantized("llama31-8b-claims-awq")

AutoAWQ keeps the fp16 model on the CPU and moves one decoder layer at a time to the GPU.  It first runs
the embedding on every calibration token (the "Catcher") and keeps the result, `self.inps`, on the GPU:
128 samples x 2048 tokens = 262,144 tokens x 4096 x 2 B = 2 GiB.  Then, for layer 0, `_get_input_feat`
registers forward hooks on every nn.Linear that cache their inputs (input_feat, used for the scale
search) and runs the whole decoder layer on all 262,144 tokens at once, because
`n_parallel_calib_samples` was left at its default (None = no chunking).  The user raised
max_calib_seq_len from the default 512 to 2048 "so the scales see long notes".

Sizes on the card (GiB): CUDA context 0.5, layer 0 weights 0.41 (218M fp16 params), inps 2,
input_layernorm output 2 (kept by the q/k/v hooks), attention output 2 (kept by the o_proj hook),
residual 2, post_attention_layernorm output 2 (kept by the gate/up hooks), then the MLP:
gate_proj output 262,144 x 14336 x 2 B = 7 GiB (lives), up_proj output another 7 GiB: with 17.4 GiB
allocated by PyTorch and 4.0 GiB free, up_proj's "Tried to allocate 7.00 GiB" raises
torch.OutOfMemoryError inside LlamaMLP.forward of layer 0 (no backward; the whole quantizer runs under
torch.no_grad()).

What an expert says first: the calibration forward is done on every calibration token at once; a single
MLP activation of the calibration set is 7 GiB.  Chunk it (n_parallel_calib_samples=8..16: AutoAWQ's
own knob for this OOM) and/or go back to max_calib_seq_len=512 / fewer samples.  The model itself
(16 GB fp16) is never on the GPU whole, so nothing about the weights needs changing.
Wrong advice: gradient checkpointing or mixed precision (no backward; already fp16), expandable_segments or
empty_cache (the memory is live activations, not cache), "quantize the model" (that is what it is doing),
inference_mode (already no_grad), CPU-offloading the model (it is already on the CPU).
"""
import collections
import functools

import scen_truth
import torch
from torch import nn

scen_truth.note_every_empty(torch)

MODEL_PATH = "meta-llama/Llama-3.1-8B-Instruct"
HIDDEN, INTERMEDIATE, KV_DIM, N_LAYERS, VOCAB = 4096, 14336, 1024, 32, 128256

QUANT_CONFIG = {"zero_point": True, "q_group_size": 128, "w_bit": 4, "version": "GEMM"}
MAX_CALIB_SAMPLES = 128
MAX_CALIB_SEQ_LEN = 2048          # AutoAWQ's default is 512
N_PARALLEL_CALIB_SAMPLES = None   # None: the whole calibration set in one forward per layer


def new_tensor(shape, dtype=torch.float16, device="cuda"):
    """torch.empty(*shape, dtype=dtype, device=device): the stand-in torch counts elements, so the
    shape is kept beside it as real tensors carry it."""
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype, device=device)
    t.shape = tuple(shape)
    return t


# ---- transformers' Llama modules, as far as memory goes -------------------------------------------------
class HookedModule(nn.Module):
    """nn.Module with register_forward_hook / handle.remove(), as torch.nn.Module has them."""

    def __init__(self):
        nn.Module.__init__(self)
        object.__setattr__(self, "_forward_hooks", collections.OrderedDict())

    def register_forward_hook(self, hook):
        key = len(self._forward_hooks) + 1
        self._forward_hooks[key] = hook
        module = self

        class _Handle(object):
            def remove(self_inner):
                module._forward_hooks.pop(key, None)
        return _Handle()

    def __call__(self, *args, **kwargs):
        out = nn.Module.__call__(self, *args, **kwargs)
        for hook in list(self._forward_hooks.values()):
            hook(self, args, out)
        return out


class Linear(HookedModule):
    def __init__(self, in_features, out_features):
        HookedModule.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(new_tensor((out_features, in_features)))

    def forward(self, x):
        return new_tensor(x.shape[:-1] + (self.out_features,))


class LlamaRMSNorm(HookedModule):
    def __init__(self, hidden):
        HookedModule.__init__(self)
        self.weight = nn.Parameter(new_tensor((hidden,)))

    def forward(self, x):
        return new_tensor(x.shape)


def apply_rotary_pos_emb(q, k):
    return new_tensor(q.shape), new_tensor(k.shape)


def scaled_dot_product_attention(q, k, v):
    return new_tensor(q.shape)


class LlamaAttention(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, hidden_states):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        q, k = apply_rotary_pos_emb(q, k)
        attn_output = scaled_dot_product_attention(q, k, v)
        return self.o_proj(attn_output)


class LlamaMLP(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        return self.down_proj(new_tensor(gate.shape))     # act_fn(gate) * up


class LlamaDecoderLayer(HookedModule):
    def __init__(self, index):
        HookedModule.__init__(self)
        self.layer_idx = index
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.self_attn = LlamaAttention()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)
        self.mlp = LlamaMLP()

    def forward(self, hidden_states):
        residual = hidden_states
        h = self.input_layernorm(hidden_states)
        h = self.self_attn(h)
        hidden_states = new_tensor(residual.shape)       # residual + h
        del h
        residual = hidden_states
        h = self.post_attention_layernorm(hidden_states)
        h = self.mlp(h)
        return new_tensor(residual.shape)                 # residual + h


class CpuDecoderLayer(object):
    """A decoder layer of the model AutoAWQ loaded on the CPU: .cuda() copies its weights to the GPU."""

    def __init__(self, index):
        self.index = index

    def cuda(self):
        return LlamaDecoderLayer(self.index)


class CpuEmbedding(object):
    def cuda(self):
        return Embedding()


class Embedding(HookedModule):
    def __init__(self):
        HookedModule.__init__(self)
        self.weight = nn.Parameter(new_tensor((VOCAB, HIDDEN)))

    def forward(self, input_ids):
        return new_tensor(input_ids.shape + (HIDDEN,))


class LlamaAWQForCausalLM(object):
    """AutoAWQForCausalLM.from_pretrained(..., low_cpu_mem_usage=True): the fp16 model stays on the CPU."""

    def __init__(self, path):
        self.path = path
        self.embed_tokens = CpuEmbedding()
        self.layers = [CpuDecoderLayer(i) for i in range(N_LAYERS)]

    def quantize(self, tokenizer, quant_config, calib_data, max_calib_samples, max_calib_seq_len,
                 n_parallel_calib_samples=None):
        quantizer = AwqQuantizer(self, tokenizer, quant_config, calib_data, max_calib_samples,
                                 max_calib_seq_len, n_parallel_calib_samples)
        quantizer.quantize()


# ---- awq/quantize/quantizer.py, as far as memory goes ---------------------------------------------------
def get_calib_dataset(data, tokenizer, n_samples, max_seq_len):
    """AutoAWQ concatenates the texts and cuts them into n_samples blocks of max_seq_len tokens."""
    return new_tensor((n_samples, max_seq_len), dtype=torch.float32)  # the token ids (int64 in torch: 2 MiB)


def get_named_linears(module):
    out = {}
    for pname, parent in (("self_attn", module.self_attn), ("mlp", module.mlp)):
        for cname, child in parent._modules.items():
            if isinstance(child, Linear):
                out["%s.%s" % (pname, cname)] = child
    return out


class AwqQuantizer(object):
    def __init__(self, awq_model, tokenizer, quant_config, calib_data, max_calib_samples, max_calib_seq_len,
                 n_parallel_calib_samples):
        self.awq_model = awq_model
        self.tokenizer = tokenizer
        self.w_bit = quant_config["w_bit"]
        self.group_size = quant_config["q_group_size"]
        self.calib_data = calib_data
        self.max_calib_samples = max_calib_samples
        self.max_calib_seq_len = max_calib_seq_len
        self.n_parallel_calib_samples = n_parallel_calib_samples
        self.modules = awq_model.layers
        self.inps = self.init_quant()

    def init_quant(self):
        with torch.no_grad():
            samples = get_calib_dataset(self.calib_data, self.tokenizer, self.max_calib_samples,
                                        self.max_calib_seq_len)
            samples.shape = (self.max_calib_samples * self.max_calib_seq_len,)
            embed = self.awq_model.embed_tokens.cuda()
            inps = embed(samples)        # the Catcher stops at layer 0 with every sample's hidden states
            del embed                    # best_device -> cpu
        return inps

    def _module_forward(self, x, module):
        if self.n_parallel_calib_samples is None:
            return module(x)             # every calibration token in one forward
        raise NotImplementedError

    def _get_input_feat(self, layer, named_linears):
        def cache_input_hook(m, x, y, name, feat_dict):
            feat_dict[name].append(x[0].detach())

        input_feat = collections.defaultdict(list)
        handles = []
        for name, lin in named_linears.items():
            handles.append(lin.register_forward_hook(
                functools.partial(cache_input_hook, name=name, feat_dict=input_feat)))
        self.inps = self._module_forward(self.inps, layer)
        for h in handles:
            h.remove()
        return input_feat

    def quantize(self):
        with torch.no_grad():            # AutoAWQ: @torch.no_grad() on the quantizer's methods
            for i in range(len(self.modules)):
                layer = self.modules[i].cuda()
                named_linears = get_named_linears(layer)
                input_feat = self._get_input_feat(layer, named_linears)
                self._search_and_apply_scales(layer, input_feat)
                self.modules[i] = CpuDecoderLayer(i)
                del layer, input_feat

    def _search_and_apply_scales(self, layer, input_feat):
        pass


class Tokenizer(object):
    pass


def load_calibration_texts(path):
    return ["claim note %d" % i for i in range(4000)]


def main():
    model = LlamaAWQForCausalLM(MODEL_PATH)
    tokenizer = Tokenizer()
    calib = load_calibration_texts("claims_notes.jsonl")
    model.quantize(tokenizer, quant_config=QUANT_CONFIG, calib_data=calib,
                   max_calib_samples=MAX_CALIB_SAMPLES, max_calib_seq_len=MAX_CALIB_SEQ_LEN,
                   n_parallel_calib_samples=N_PARALLEL_CALIB_SAMPLES)
    print("saving llama31-8b-claims-awq")


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
