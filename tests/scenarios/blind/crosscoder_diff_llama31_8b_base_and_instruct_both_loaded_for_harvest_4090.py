"""harvest.py -- model diffing with a crosscoder: the residual stream at layer 16 of Llama-3.1-8B and of
Llama-3.1-8B-Instruct on the same tokens (FineWeb-Edu and LMSYS-Chat, 1024-token contexts), saved as paired
fp16 shards for training an acausal crosscoder afterwards.  One RTX 4090 (24 GB) at a PhD student's desk.

Last month the student harvested the base model alone for an SAE with the same script and batch: 15 GiB of
weights, 1.5 GiB of working memory, fine.  For the diff they load the second model beside the first so that
each batch goes through both and the shards stay paired:

    base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.bfloat16,
                                                device_map="cuda")
    chat = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                                device_map="cuda")
    acts = {}
    for m, name in ((base, "base"), (chat, "chat")):
        m.model.layers[16].register_forward_hook(save_and_stop(name))    # stop after layer 16: no logits
    with torch.inference_mode():
        for i, batch in enumerate(loader):                                 # 32 x 1024 tokens
            for m in (base, chat):
                try: m(batch)
                except StopForward: pass
            save_shard(i, acts["base"].cpu(), acts["chat"].cpu())

It dies while the Instruct model loads, in layer 18 of 32 with 8.3 GiB of it on the card ("Tried to allocate
8.00 MiB ... 12.00 MiB is free"): the base model holds 14.96 GiB (8.03B parameters in bf16), the context
0.5 GiB, and the Instruct model's weights need another 14.96 GiB on a 24 GiB card.  No batch has run.

An expert: two 8B models in bf16 are 30 GiB; they cannot share a 24 GB card, however small the batch.  The
pairing does not need them at the same time: harvest the base model over the fixed token order, write its
shards, free it (`del base; gc.collect(); torch.cuda.empty_cache()`), then load the Instruct model and harvest
the same order; the crosscoder's loader zips the two shard sets.  Or a card that holds both (48 GB+), or
offload part of one model to the CPU (slow: each forward streams the offloaded layers).
Wrong advice: quantizing either model to 8-bit or 4-bit (the crosscoder would then learn quantization error as
"Instruct-only" features: it corrupts the very activations under study), a smaller batch, gradient
checkpointing or inference_mode (no batch has run; it fails in from_pretrained), bf16 loading (already bf16),
expandable_segments / empty_cache (nothing is cached: every byte is weights), looking for other processes.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: nn.Linear / nn.Embedding (torch.nn in PyTorch).  Compiled as part of torch's files so that
# the failing line stays the program's own.
_NN_GAPS = """
class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features, dtype=dtype or torch.float32, device=device),
                                requires_grad=False)
        self.bias = None


class Embedding(Module):
    def __init__(self, num_embeddings, embedding_dim, device=None, dtype=None):
        Module.__init__(self)
        self.embedding_dim = embedding_dim
        self.weight = Parameter(torch.empty(num_embeddings * embedding_dim, dtype=dtype or torch.float32,
                                            device=device), requires_grad=False)
"""
import torch.nn.modules.module as _mm  # noqa: E402

_ns = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter}
exec(compile(_NN_GAPS, _mm.__file__, "exec"), _ns)
if not hasattr(torch.nn, "Linear"):
    torch.nn.Linear, torch.nn.Embedding = _ns["Linear"], _ns["Embedding"]
# ----

GiB = 1 << 30
BF16 = torch.bfloat16


# ---------------------------------------------------------------- transformers' Llama (as far as memory goes)
class LlamaConfig(object):
    vocab_size = 128256
    hidden_size = 4096
    intermediate_size = 14336
    num_hidden_layers = 32
    num_key_value_heads = 8
    head_dim = 128


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, h, dtype, device):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(h, dtype=dtype, device=device), requires_grad=False)


class LlamaAttention(torch.nn.Module):
    def __init__(self, c, dtype, device):
        torch.nn.Module.__init__(self)
        kv = c.num_key_value_heads * c.head_dim
        self.q_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False, dtype=dtype, device=device)
        self.k_proj = torch.nn.Linear(c.hidden_size, kv, bias=False, dtype=dtype, device=device)
        self.v_proj = torch.nn.Linear(c.hidden_size, kv, bias=False, dtype=dtype, device=device)
        self.o_proj = torch.nn.Linear(c.hidden_size, c.hidden_size, bias=False, dtype=dtype, device=device)


class LlamaMLP(torch.nn.Module):
    def __init__(self, c, dtype, device):
        torch.nn.Module.__init__(self)
        self.gate_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, dtype=dtype, device=device)
        self.up_proj = torch.nn.Linear(c.hidden_size, c.intermediate_size, bias=False, dtype=dtype, device=device)
        self.down_proj = torch.nn.Linear(c.intermediate_size, c.hidden_size, bias=False, dtype=dtype, device=device)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c, dtype, device):
        torch.nn.Module.__init__(self)
        self.self_attn = LlamaAttention(c, dtype, device)
        self.mlp = LlamaMLP(c, dtype, device)
        self.input_layernorm = LlamaRMSNorm(c.hidden_size, dtype, device)
        self.post_attention_layernorm = LlamaRMSNorm(c.hidden_size, dtype, device)


class LlamaModel(torch.nn.Module):
    def __init__(self, c, dtype, device):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Embedding(c.vocab_size, c.hidden_size, dtype=dtype, device=device)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = LlamaDecoderLayer(c, dtype, device)      # accelerate: set_module_tensor_to_device, shard by shard
            self.layers.append(layer)
            setattr(self, "layers_%d" % i, layer)
        self.norm = LlamaRMSNorm(c.hidden_size, dtype, device)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c, dtype, device):
        torch.nn.Module.__init__(self)
        self.model = LlamaModel(c, dtype, device)
        self.lm_head = torch.nn.Linear(c.hidden_size, c.vocab_size, bias=False, dtype=dtype, device=device)


class AutoModelForCausalLM(object):
    @staticmethod
    def from_pretrained(name, torch_dtype=None, device_map=None):
        """transformers + accelerate with device_map="cuda": the model is built on the meta device and every
        tensor of the safetensors shards is materialised straight on the GPU, in the order of the shards."""
        print("Loading checkpoint shards: %s" % name)
        model = LlamaForCausalLM(LlamaConfig(), torch_dtype or torch.float32, "cuda")
        model.eval()
        return model


# ---------------------------------------------------------------- harvest.py
class StopForward(Exception):
    pass


acts = {}


def save_and_stop(name):
    def hook(module, inputs, output):
        acts[name] = output[0].to(torch.float16)
        raise StopForward
    return hook


def main():
    cfg = {"layer": 16, "batch_size": 32, "context_len": 1024, "n_tokens": 100_000_000,
           "out_dir": "/scratch/crosscoder/l16_shards"}
    print("harvest config: %s" % cfg)
    base = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B", torch_dtype=torch.bfloat16,
                                                device_map="cuda")
    print("base loaded: %.2f GiB allocated" % (torch.cuda.memory_allocated() / GiB))
    chat = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.1-8B-Instruct", torch_dtype=torch.bfloat16,
                                                device_map="cuda")
    print("chat loaded: %.2f GiB allocated" % (torch.cuda.memory_allocated() / GiB))
    for m, name in ((base, "base"), (chat, "chat")):
        m.model.layers[cfg["layer"]].register_forward_hook(save_and_stop(name))
    # with torch.inference_mode(): for each batch, both models up to layer 16, save_shard(...)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
