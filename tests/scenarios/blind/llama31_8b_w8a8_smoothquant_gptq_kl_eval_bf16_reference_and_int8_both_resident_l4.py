"""eval_w8a8.py -- the last step of a team's quantization pipeline: before a W8A8 export of
Llama-3.1-8B-Instruct goes to the vLLM fleet (NVIDIA L4s, 24 GB), the engineer checks it against the bf16
original on the same kind of box (GCP g2-standard-16: one L4, 23,034 MiB; 64 GB of RAM).

The export was made the day before with llm-compressor's W8A8 int8 recipe (SmoothQuantModifier
smoothing_strength=0.8, then GPTQModifier scheme="W8A8" targets="Linear" ignore=["lm_head"], 512
calibration samples of ultrachat at 2048 tokens) and saved compressed (save_compressed=True): int8 weights
for the 224 Linear layers of the decoder, a bf16 per-channel scale for each, and the embeddings, the norms
and lm_head left in bf16 -- 9.08 GB on disk, 9.08 GB on the GPU (transformers keeps the compressed-tensors
weights int8 in CompressedLinear: run_compressed).  The gate for shipping is the usual one: wikitext-2
perplexity within 1% of the original, and the mean per-token KL divergence KL(bf16 || int8) and top-1
agreement over 40 windows of 2048 tokens.  The script, as written:

    BASE = "meta-llama/Llama-3.1-8B-Instruct"
    QUANT = "/models/Llama-3.1-8B-Instruct-W8A8-SQ-GPTQ"
    base = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map="cuda")
    quant = AutoModelForCausalLM.from_pretrained(QUANT, torch_dtype=torch.bfloat16, device_map="cuda")
    for ids in windows(wikitext, 2048)[:40]:
        with torch.no_grad():
            ref = F.log_softmax(base(ids).logits, -1, dtype=torch.float32)
            q = F.log_softmax(quant(ids).logits, -1, dtype=torch.float32)
            kl += F.kl_div(q, ref, log_target=True, reduction="sum") / ids.numel()
            agree += (ref.argmax(-1) == q.argmax(-1)).float().mean()
            nll_ref += ...; nll_q += ...

Both models side by side because the KL needs both distributions of the same window.  The bf16 reference
loads (8.03B parameters: 16.06 GB, 14.96 GiB, plus the CUDA context); the W8A8 model then needs 9.08 GB
(8.46 GiB) more and there are about 7 GiB left: the load fails about nine tenths of the way through the
decoder layers (a 56 MiB int8 MLP weight of model.layers.29, with 12 MiB free), with both models' weights
on the card and nothing run yet.  The two
together (23.4 GiB of weights) are more than the L4 has, whatever the allocator does.

An expert: nothing is wrong with either model; the script needs them at the same time only because it
computes the KL in one pass.  Evaluate one model at a time: run the bf16 reference alone over the 40
windows, keep what the comparison needs from it (its per-token NLL for the perplexity, and its log-probs for
the KL: the top-k per token as fp16 values + int32 ids, or the full distribution to a file on local disk as
llama.cpp's --kl-divergence-base does), free it (del base; gc.collect(); torch.cuda.empty_cache()) -- or
just run that pass as its own process -- then load the int8 model and compare against what was saved.
Each pass then needs one model (15 or 8.5 GiB) and fits on the very L4 the model will be served on.
Workable but not first: offload part of the reference to CPU (device_map="auto" with max_memory; several
times slower on every window), or rent an L40S (48 GB) for an evaluation that needs no more than the L4.
Wrong advice: quantize the weights (8-bit / 4-bit) -- the int8 model is the thing under test, and the
reference must stay bf16 or the KL measures nothing; loading in bf16 or mixed precision (both models are
already bf16 / int8); a smaller batch, shorter sequences, flash attention, inference_mode or gradient
checkpointing (the failure is in loading weights: no forward pass has run, and the loop is under no_grad
anyway); expandable_segments or empty_cache (nothing is cached or fragmented: the weights alone overfill the
card); 8-bit optimizers, ZeRO/FSDP, LoRA (nothing trains); using one model in both roles (evaluating
without a copy, an adapter-disabled reference): the int8 model has weights of its own, not a view of the
reference's; and "only 44 MiB short" readings (restart, empty_cache): the load still needs 1.44 GiB more.
"""
import gc
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F = torch.nn.functional
GB = 1000 ** 3
GiB = 1 << 30

# ---- stand-in gaps: transformers' loader (AutoModelForCausalLM.from_pretrained -> PreTrainedModel.from_pretrained
# -> _load_state_dict_into_meta_model) and compressed-tensors' CompressedLinear.  Compiled under the paths of the
# real packages so that the failing Python line is the program's own from_pretrained call, as with transformers.
_SITE = "/opt/conda/lib/python3.11/site-packages/"

_MODELING_UTILS = '''
class init_empty_weights(object):
    """accelerate.init_empty_weights: modules built on the meta device (no memory)."""
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class PreTrainedModel(torch.nn.Module):
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, config=None, torch_dtype=None,
                        device_map=None, **kwargs):
        if torch_dtype == "auto":
            torch_dtype = config.torch_dtype
        with init_empty_weights():
            model = cls(config)
        model._load_pretrained_model(model, pretrained_model_name_or_path, torch_dtype, device_map)
        model.eval()
        return model

    @staticmethod
    def _load_pretrained_model(model, path, dtype, device_map):
        device = device_map if isinstance(device_map, str) else "cuda"
        for shard in model.config.shards:
            print("Loading checkpoint shards: %s" % shard)
            state_dict = [k for k in model._expected_keys() if k[0] in model.config.shard_of(shard)]
            _load_state_dict_into_meta_model(model, state_dict, device, dtype)

    def get_memory_footprint(self):
        return sum(p.nbytes for p in self.parameters()) + sum(b.nbytes for b in self.buffers())


def _load_state_dict_into_meta_model(model, state_dict, device, dtype):
    for key, module, name, numel, ckpt_dtype, requires_grad in state_dict:
        # safetensors -> CPU, then set_module_tensor_to_device(model, key, device, value): param.to(device)
        param_dtype = ckpt_dtype if ckpt_dtype == torch.int8 else dtype
        value = torch.empty(numel, dtype=param_dtype, device=device)
        setattr(module, name, torch.nn.Parameter(value, requires_grad=requires_grad))
'''

_AUTO_FACTORY = '''
class _BaseAutoModelClass(object):
    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *model_args, **kwargs):
        config = AutoConfig.from_pretrained(pretrained_model_name_or_path)
        model_class = _MODEL_MAPPING[config.model_type]
        return model_class.from_pretrained(pretrained_model_name_or_path, *model_args, config=config, **kwargs)


class AutoModelForCausalLM(_BaseAutoModelClass):
    pass
'''

_mu = {"torch": torch, "print": print}
exec(compile(_MODELING_UTILS, _SITE + "transformers/modeling_utils.py", "exec"), _mu)
PreTrainedModel = _mu["PreTrainedModel"]
_MODEL_MAPPING = {}


class LlamaConfig(object):
    model_type = "llama"

    def __init__(self, name, quantization_config=None, shards=1):
        self.name_or_path = name
        self.hidden_size = 4096
        self.intermediate_size = 14336
        self.num_hidden_layers = 32
        self.num_attention_heads = 32
        self.num_key_value_heads = 8
        self.head_dim = 128
        self.vocab_size = 128256
        self.tie_word_embeddings = False
        self.torch_dtype = torch.bfloat16
        self.quantization_config = quantization_config
        self.shards = ["model-%05d-of-%05d.safetensors" % (i + 1, shards) for i in range(shards)]
        self._n = shards

    def shard_of(self, shard):
        """The keys of one shard: the decoder layers split evenly, embeddings in the first, head in the last."""
        i = self.shards.index(shard)
        per = -(-self.num_hidden_layers // self._n)
        keys = set("model.layers.%d" % l for l in range(i * per, min((i + 1) * per, self.num_hidden_layers)))
        if i == 0:
            keys.add("model.embed_tokens")
        if i == self._n - 1:
            keys.update(("model.norm", "lm_head"))
        return keys


_CONFIGS = {
    "meta-llama/Llama-3.1-8B-Instruct": LlamaConfig("meta-llama/Llama-3.1-8B-Instruct", shards=4),
    "/models/Llama-3.1-8B-Instruct-W8A8-SQ-GPTQ": LlamaConfig(
        "/models/Llama-3.1-8B-Instruct-W8A8-SQ-GPTQ", shards=2,
        quantization_config={"quant_method": "compressed-tensors", "format": "int-quantized",
                             "config_groups": {"group_0": {"targets": ["Linear"],
                                                           "weights": {"num_bits": 8, "type": "int",
                                                                       "strategy": "channel", "symmetric": True},
                                                           "input_activations": {"num_bits": 8, "type": "int",
                                                                                 "strategy": "token",
                                                                                 "dynamic": True}}},
                             "ignore": ["lm_head"], "run_compressed": True}),
}


class AutoConfig(object):
    @staticmethod
    def from_pretrained(name):
        return _CONFIGS[name]


_af = {"AutoConfig": AutoConfig, "_MODEL_MAPPING": _MODEL_MAPPING}
exec(compile(_AUTO_FACTORY, _SITE + "transformers/models/auto/auto_factory.py", "exec"), _af)
AutoModelForCausalLM = _af["AutoModelForCausalLM"]


# ---- the model, as transformers' modeling_llama lays it out (weights arrive at load time, as from the meta device)
class Linear(torch.nn.Module):
    def __init__(self, in_features, out_features):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features

    def _keys(self):
        return [("weight", self.in_features * self.out_features, torch.bfloat16, True)]

    def forward(self, x):
        return torch.empty(x.nbytes // 2 // self.in_features * self.out_features, dtype=torch.bfloat16,
                           device="cuda")


class CompressedLinear(Linear):
    """compressed_tensors.linear.compressed_linear.CompressedLinear, int-quantized (W8A8 int8, per-channel
    symmetric): weight int8 [out, in], weight_scale [out, 1]; decompressed per call in forward."""

    def _keys(self):
        return [("weight", self.in_features * self.out_features, torch.int8, False),
                ("weight_scale", self.out_features, torch.bfloat16, False)]


class Embedding(torch.nn.Module):
    def __init__(self, num, dim):
        torch.nn.Module.__init__(self)
        self.num, self.dim = num, dim

    def _keys(self):
        return [("weight", self.num * self.dim, torch.bfloat16, True)]


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim

    def _keys(self):
        return [("weight", self.dim, torch.bfloat16, True)]


def _linear(config, name, i, o):
    q = config.quantization_config
    if q and name not in q["ignore"]:
        return CompressedLinear(i, o)
    return Linear(i, o)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        kv = c.num_key_value_heads * c.head_dim
        self.q_proj = _linear(c, "q_proj", c.hidden_size, c.hidden_size)
        self.k_proj = _linear(c, "k_proj", c.hidden_size, kv)
        self.v_proj = _linear(c, "v_proj", c.hidden_size, kv)
        self.o_proj = _linear(c, "o_proj", c.hidden_size, c.hidden_size)


class LlamaMLP(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.gate_proj = _linear(c, "gate_proj", c.hidden_size, c.intermediate_size)
        self.up_proj = _linear(c, "up_proj", c.hidden_size, c.intermediate_size)
        self.down_proj = _linear(c, "down_proj", c.intermediate_size, c.hidden_size)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(c)
        self.mlp = LlamaMLP(c)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size)


class LlamaModel(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = [LlamaDecoderLayer(c) for _ in range(c.num_hidden_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.norm = LlamaRMSNorm(c.hidden_size)


class CausalLMOutputWithPast(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(PreTrainedModel):
    def __init__(self, config):
        PreTrainedModel.__init__(self)
        self.config = config
        self.model = LlamaModel(config)
        self.lm_head = _linear(config, "lm_head", config.hidden_size, config.vocab_size)

    def _expected_keys(self):
        """(prefix, module, name, numel, dtype, requires_grad) in checkpoint order."""
        out = []

        def add(prefix, mod):
            for name, numel, dt, rg in mod._keys():
                out.append((prefix, mod, name, numel, dt, rg))

        add("model.embed_tokens", self.model.embed_tokens)
        for i, layer in enumerate(self.model.layers):
            p = "model.layers.%d" % i
            for mod in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj,
                        layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj, layer.mlp.down_proj,
                        layer.input_layernorm, layer.post_attention_layernorm):
                add(p, mod)
        add("model.norm", self.model.norm)
        add("lm_head", self.lm_head)
        return out

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8
        h = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16, device="cuda")
        for layer in self.model.layers:
            h = torch.empty(tokens * self.config.hidden_size, dtype=torch.bfloat16, device="cuda")
        return CausalLMOutputWithPast(self.lm_head(h))


_MODEL_MAPPING["llama"] = LlamaForCausalLM


# ---- data (host side): datasets.load_dataset("wikitext", "wikitext-2-raw-v1", split="test") + the tokenizer
def load_wikitext_windows(seq_len, n_windows):
    n_tokens = 289_076   # wikitext-2-raw-v1 test, joined with "\n\n", Llama-3 tokenizer
    starts = list(range(0, n_tokens - seq_len, seq_len))[:n_windows]
    print("wikitext-2 test: %d tokens, %d windows of %d" % (n_tokens, len(starts), seq_len))
    return starts


BASE = "meta-llama/Llama-3.1-8B-Instruct"
QUANT = "/models/Llama-3.1-8B-Instruct-W8A8-SQ-GPTQ"
SEQ_LEN = 2048
N_WINDOWS = 40


def main():
    windows = load_wikitext_windows(SEQ_LEN, N_WINDOWS)

    print("Loading reference %s (bf16)" % BASE)
    base = AutoModelForCausalLM.from_pretrained(BASE, torch_dtype=torch.bfloat16, device_map="cuda")
    print("  footprint %.2f GB" % (base.get_memory_footprint() / GB))

    print("Loading W8A8 export %s" % QUANT)
    quant = AutoModelForCausalLM.from_pretrained(QUANT, torch_dtype=torch.bfloat16, device_map="cuda")
    print("  footprint %.2f GB" % (quant.get_memory_footprint() / GB))

    kl = agree = nll_ref = nll_q = 0.0
    for start in windows:
        ids = torch.empty(SEQ_LEN, dtype=torch.float64, device="cuda")   # input_ids, int64 [1, 2048] (8 bytes each)
        with torch.no_grad():
            ref = F.log_softmax(base(ids).logits, -1, dtype=torch.float32)
            q = F.log_softmax(quant(ids).logits, -1, dtype=torch.float32)
            # kl += F.kl_div(q, ref, log_target=True, reduction="sum") / SEQ_LEN; agree += top-1 match ...
        del ref, q, ids
    print("KL %.4f  top-1 agreement %.3f  ppl %.3f -> %.3f" % (kl, agree, nll_ref, nll_q))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
