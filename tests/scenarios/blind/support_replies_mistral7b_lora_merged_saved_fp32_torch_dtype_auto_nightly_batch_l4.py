"""draft_replies.py -- a nightly batch job that drafts first replies for the support backlog (about 3,000
tickets a night) with the team's LoRA fine-tune of Mistral-7B-Instruct-v0.3.  It runs on a GCP g2-standard-8
(one NVIDIA L4, 24 GB: 23,034 MiB), transformers 4.44, torch 2.3.

The adapter was trained in bf16 and worked fine through PEFT.  To drop the PEFT dependency in production,
an engineer merged it once, on a CPU box, "in full precision so the merge loses nothing":

    base = AutoModelForCausalLM.from_pretrained("mistralai/Mistral-7B-Instruct-v0.3", torch_dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, "out/lora-support-r64").merge_and_unload()
    merged.save_pretrained("models/support-mistral-7b-merged")   # 6 shards, 29 GB; config.json: "torch_dtype": "float32"

and the batch job was switched to the merged folder, keeping its loading line:

    model = AutoModelForCausalLM.from_pretrained("models/support-mistral-7b-merged",
                                                 torch_dtype="auto", device_map="cuda")
    for batch in batches(tickets, 16):
        out = model.generate(**tok(batch, return_tensors="pt", padding=True).to("cuda"), max_new_tokens=512)

torch_dtype="auto" means "the dtype the checkpoint was saved in" -- config.json's torch_dtype -- and the
merge wrote float32.  The model that was 13.5 GiB in bf16 yesterday is 27.0 GiB now: the job dies loading
shard 5 of 6 (the 27th of 32 decoder layers, 21.8 GiB in), before a single ticket.

An expert: load it in bf16 -- torch_dtype=torch.bfloat16 (the weights were trained in bf16; casting the
merged fp32 weights down loses nothing that matters) -- and re-save the merged model in bf16 so "auto" means
bf16 again (half the disk, half the download).  13.5 GiB leaves the L4 about 8 GiB for the KV cache and the
batch.
Wrong first advice: 8-bit / 4-bit quantization (the bf16 model fits; quantizing costs quality the team
measured the fine-tune for), CPU offload / device_map="auto" (spills the last layers to the CPU: every token
slower for nothing), a smaller batch or shorter sequences (nothing has run yet: this is the weights),
expandable_segments / empty_cache (27 GiB of live weights on a 22.5 GiB card), map_location="cpu" (the
shards are read to the host already; the dtype is the problem), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SITE = "/opt/conda/lib/python3.10/site-packages/"


def _library(relpath, src, **names):
    """Library code (transformers, accelerate) as it sits in site-packages: its frames show its files."""
    ns = {"torch": torch, "nn": torch.nn, "__name__": relpath[:-3].replace("/", ".")}
    ns.update(names)
    exec(compile(src, SITE + relpath, "exec"), ns)
    return ns


# ---- transformers 4.44 + accelerate 0.33: from_pretrained(..., torch_dtype="auto", device_map="cuda")
_ACCEL = """
def set_module_tensor_to_device(module, tensor_name, device, value=None, dtype=None):
    # the shard's tensor (read into host memory by safetensors) copied into a new tensor on the device,
    # in `dtype` (from_pretrained's torch_dtype, resolved)
    new_value = torch.empty(value, dtype=dtype, device=device)
    setattr(module, tensor_name, nn.Parameter(new_value))
"""
_accel = _library("accelerate/utils/modeling.py", _ACCEL)

_MISTRAL = """
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 32768, 1024


class MistralRMSNorm(nn.Module):
    shapes = {"weight": HIDDEN}


class Linear(nn.Module):
    def __init__(self, n_in, n_out):
        nn.Module.__init__(self)
        self.shapes = {"weight": n_in * n_out}


class Embedding(nn.Module):
    shapes = {"weight": VOCAB * HIDDEN}


class MistralSdpaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)


class MistralMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = MistralSdpaAttention()
        self.mlp = MistralMLP()
        self.input_layernorm = MistralRMSNorm()
        self.post_attention_layernorm = MistralRMSNorm()


class MistralModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding()
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, MistralDecoderLayer())
        self.norm = MistralRMSNorm()


class MistralForCausalLM(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.model = MistralModel()
        self.lm_head = Linear(HIDDEN, VOCAB)
"""
_mistral = _library("transformers/models/mistral/modeling_mistral.py", _MISTRAL)

_MODELING_UTILS = """
def _checkpoint_tensors(model):
    # the safetensors shards' tensors in file order: (name, module, tensor name, numel); the model was built
    # on the meta device (init_empty_weights): nothing is on the GPU until each tensor is loaded
    for prefix, m in _walk(model, ""):
        for name, numel in sorted(getattr(m, "shapes", {}).items()):
            yield prefix + name, m, name, numel


def _walk(m, prefix):
    yield prefix, m
    for k, sub in m._modules.items():
        for item in _walk(sub, prefix + k.replace("layers_", "layers.") + "."):
            yield item


def _load_state_dict_into_meta_model(model, state_dict, start_prefix, expected_keys, device_map=None,
                                     dtype=None):
    for param_name, module, tensor_name, numel in state_dict:
        set_module_tensor_to_device(module, tensor_name, device_map[""], value=numel, dtype=dtype)


class PreTrainedModel(object):
    @classmethod
    def from_pretrained(cls, model_class, pretrained_model_name_or_path, config, torch_dtype=None,
                        device_map=None):
        if torch_dtype == "auto":
            # "auto": config.json's torch_dtype (the dtype the checkpoint was saved in), else the first
            # floating-point tensor's dtype in the checkpoint
            torch_dtype = getattr(torch, config["torch_dtype"])
        elif torch_dtype is None:
            torch_dtype = torch.get_default_dtype()
        model = model_class(config)
        print("Instantiating %s model under default dtype torch.%s." % (model_class.__name__, torch_dtype))
        _load_state_dict_into_meta_model(model, _checkpoint_tensors(model), "", [], device_map={"": device_map},
                                         dtype=torch_dtype)
        return model.eval()
"""
_utils = _library("transformers/modeling_utils.py", _MODELING_UTILS,
                  set_module_tensor_to_device=_accel["set_module_tensor_to_device"])


class AutoModelForCausalLM(object):
    """transformers.AutoModelForCausalLM: config.json's "MistralForCausalLM"."""

    @staticmethod
    def from_pretrained(path, torch_dtype=None, device_map=None):
        # models/support-mistral-7b-merged/config.json as merged.save_pretrained() wrote it
        config = {"architectures": ["MistralForCausalLM"], "hidden_size": 4096, "num_hidden_layers": 32,
                  "vocab_size": 32768, "torch_dtype": "float32", "transformers_version": "4.44.2"}
        return _utils["PreTrainedModel"].from_pretrained(_mistral["MistralForCausalLM"], path, config,
                                                         torch_dtype=torch_dtype, device_map=device_map)
# ----

MODEL_DIR = "models/support-mistral-7b-merged"


def load_backlog():
    # open tickets without a first reply, from the helpdesk export (host memory)
    return [{"id": 880000 + i, "subject": "...", "body": "..."} for i in range(3012)]


def main():
    tickets = load_backlog()
    print("%d tickets in the backlog" % len(tickets))
    model = AutoModelForCausalLM.from_pretrained(MODEL_DIR, torch_dtype="auto", device_map="cuda")
    for start in range(0, len(tickets), 16):
        pass                                    # model.generate(...), post the drafts to the helpdesk


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
