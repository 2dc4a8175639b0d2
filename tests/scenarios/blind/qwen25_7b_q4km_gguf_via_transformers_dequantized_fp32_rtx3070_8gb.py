"""chat_local.py -- a developer wants a local assistant for their notes app on a home desktop with an
RTX 3070 (8 GB; the desktop session holds ~0.4 GB of it) and 64 GB of RAM.  llama.cpp users report
Qwen2.5-7B-Instruct at Q4_K_M "runs in 5-6 GB", and the 4.7 GB GGUF file is on the Hub; the app is Python +
transformers, and transformers can read GGUF files, so:

    model_id = "bartowski/Qwen2.5-7B-Instruct-GGUF"
    gguf = "Qwen2.5-7B-Instruct-Q4_K_M.gguf"
    tok = AutoTokenizer.from_pretrained(model_id, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(model_id, gguf_file=gguf, device_map="cuda")

transformers does not run GGUF quantized: it dequantizes every tensor into an ordinary PyTorch model, in
the dtype from_pretrained is given -- none here, so float32.  7.6B parameters x 4 bytes = 28.4 GiB for a
card with 7.1 GiB left after the context and the desktop.  The load fails while placing layer 5 (of 28)
on the GPU, after the 2.0 GiB embedding and five 0.87 GiB layers.

An expert: the file's 4-bit size only holds while it stays quantized.  Keep the weights quantized: run
the GGUF with llama.cpp / llama-cpp-python (n_gpu_layers=-1: ~5.5 GB), or in transformers load the
original Qwen/Qwen2.5-7B-Instruct safetensors with BitsAndBytesConfig(load_in_4bit=True, nf4,
bnb_4bit_compute_dtype=bfloat16) (~5.5 GB), or an AWQ/GPTQ checkpoint.  Wrong first advice:
torch_dtype=torch.bfloat16 alone (halves it to 14.2 GiB: still twice the card), a smaller batch or
shorter prompts (nothing has run yet), expandable_segments / empty_cache, closing the desktop's 0.4 GB,
a bigger GPU (a 4-bit 7B is meant for this card).  device_map="auto" with CPU offload would load it,
at a speed useless for chat.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

nn = torch.nn


# ---- transformers, as far as this script reaches (modeling_utils.py, integrations/ggml.py,
# ---- modeling_gguf_pytorch_utils.py, models/qwen2/modeling_qwen2.py) ----
class GGUFTensor(object):
    def __init__(self, name, numel, ggml_type):
        self.name, self.numel, self.ggml_type = name, numel, ggml_type


def read_gguf(repo, filename):
    """gguf.GGUFReader: the file's tensor infos (Q4_K for most, Q6_K for some ffn_down/attn_v, F32 norms)."""
    H, I, KV, V, L = 3584, 18944, 512, 152064, 28
    out = [GGUFTensor("token_embd.weight", V * H, "Q4_K")]
    for i in range(L):
        b = "blk.%d." % i
        out += [GGUFTensor(b + "attn_q.weight", H * H, "Q4_K"), GGUFTensor(b + "attn_q.bias", H, "F32"),
                GGUFTensor(b + "attn_k.weight", H * KV, "Q4_K"), GGUFTensor(b + "attn_k.bias", KV, "F32"),
                GGUFTensor(b + "attn_v.weight", H * KV, "Q6_K"), GGUFTensor(b + "attn_v.bias", KV, "F32"),
                GGUFTensor(b + "attn_output.weight", H * H, "Q4_K"),
                GGUFTensor(b + "ffn_gate.weight", H * I, "Q4_K"), GGUFTensor(b + "ffn_up.weight", H * I, "Q4_K"),
                GGUFTensor(b + "ffn_down.weight", I * H, "Q6_K"),
                GGUFTensor(b + "attn_norm.weight", H, "F32"), GGUFTensor(b + "ffn_norm.weight", H, "F32")]
    out += [GGUFTensor("output_norm.weight", H, "F32"), GGUFTensor("output.weight", V * H, "Q6_K")]
    return out


GGUF_TO_HF = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head",
              "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
              "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
              "ffn_down": "mlp.down_proj", "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm"}


def hf_name(gguf_name):
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return "model.layers.%s.%s.%s" % (parts[1], GGUF_TO_HF[parts[2]], parts[3])
    return "%s.%s" % (GGUF_TO_HF[parts[0]], parts[1])


def load_gguf_checkpoint(repo, filename):
    """Every tensor dequantized (numpy, on the CPU) to a plain float array: {hf name: element count}."""
    return dict((hf_name(t.name), t.numel) for t in read_gguf(repo, filename))


class Qwen2ForCausalLM(nn.Module):
    """Built on the meta device (no memory); from_pretrained then places each weight where device_map says."""

    def __init__(self):
        nn.Module.__init__(self)
        object.__setattr__(self, "_placed", {})


def _load_state_dict_into_meta_model(model, state_dict, device_map, dtype):
    for name, numel in state_dict.items():
        # set_module_tensor_to_device(model, name, device, value=param.to(dtype))
        model._placed[name] = nn.Parameter(torch.empty(numel, dtype=dtype, device=device_map), requires_grad=False)


class AutoModelForCausalLM(object):
    @classmethod
    def from_pretrained(cls, repo, gguf_file=None, torch_dtype=None, device_map=None):
        state_dict = load_gguf_checkpoint(repo, gguf_file)
        dtype = torch_dtype or torch.get_default_dtype()
        model = Qwen2ForCausalLM()
        _load_state_dict_into_meta_model(model, state_dict, device_map, dtype)
        return model.eval()


class AutoTokenizer(object):
    @classmethod
    def from_pretrained(cls, repo, gguf_file=None):
        return cls()


# ---- the app ----
model_id = "bartowski/Qwen2.5-7B-Instruct-GGUF"
gguf = "Qwen2.5-7B-Instruct-Q4_K_M.gguf"
try:
    tok = AutoTokenizer.from_pretrained(model_id, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(model_id, gguf_file=gguf, device_map="cuda")
    print("loaded: %.2f GiB" % (torch.cuda.memory_allocated() / 2.0 ** 30))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
