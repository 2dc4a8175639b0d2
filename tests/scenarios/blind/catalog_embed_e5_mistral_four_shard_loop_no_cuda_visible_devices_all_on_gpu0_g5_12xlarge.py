"""embed_shard.py -- a marketplace's search team re-embeds its 12M product listings with
intfloat/e5-mistral-7b-instruct (7.1B parameters, float16: 13.2 GiB) for a new vector index.  They rent an
AWS g5.12xlarge (four NVIDIA A10G, 24 GB each: 23,028 MiB), split the listings into four shards and start
one process per shard from a shell loop, "one per GPU":

    # run_all.sh
    for i in 0 1 2 3; do
        python embed_shard.py --shard $i --num-shards 4 > logs/shard$i.log 2>&1 &
    done
    wait

    # embed_shard.py (sentence-transformers 3.0, torch 2.3)
    model = SentenceTransformer("intfloat/e5-mistral-7b-instruct", device="cuda",
                                model_kwargs={"torch_dtype": torch.float16})
    emb = model.encode(shard_texts, batch_size=32, normalize_embeddings=True, show_progress_bar=True)
    np.save(f"emb/shard{args.shard}.npy", emb)

Nothing in either file picks a GPU: device="cuda" is cuda:0 in every process, since each sees all four
cards.  Shard 0 loads first and holds 14.6 GiB on GPU 0; shards 2 and 3 are part-way through their own
loads there too; this process (shard 1) dies loading its 9th decoder layer.  nvidia-smi shows GPU 0 full
and GPUs 1-3 at 0 MiB.  (Shards 2 and 3 die the same way moments later; shard 0 runs alone, 4x slower than
planned.)

An expert: the memory on GPU 0 belongs to three other python processes -- this job's own other shards --
while the other three GPUs are idle.  Give each shard its own card: `CUDA_VISIBLE_DEVICES=$i python
embed_shard.py ...` in the loop (or device=f"cuda:{args.shard}").  Each A10G then holds one 13.2 GiB
model and its batches, as planned.
Wrong first advice: quantizing the model or a smaller embedding model (one copy fits a card with 8 GiB to
spare), CPU offload, a bigger GPU (an 80 GB card would hide the bug by stacking four copies on it),
a smaller batch or shorter sequences (no batch has run: this is the weights), expandable_segments /
empty_cache / restarting (the memory is other processes' live weights; a restart lands on GPU 0 again),
killing the other processes (they are the job's own shards; three cards would stay idle).
"""
import argparse
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SITE = "/opt/conda/lib/python3.10/site-packages/"


def _library(relpath, src, **names):
    """Library code (transformers, accelerate, sentence-transformers) as it sits in site-packages."""
    ns = {"torch": torch, "nn": torch.nn, "__name__": relpath[:-3].replace("/", ".")}
    ns.update(names)
    exec(compile(src, SITE + relpath, "exec"), ns)
    return ns


_ACCEL = """
def set_module_tensor_to_device(module, tensor_name, device, value=None, dtype=None):
    # the shard's tensor (read into host memory by safetensors) copied into a new tensor on the device
    new_value = torch.empty(value, dtype=dtype, device=device)
    setattr(module, tensor_name, nn.Parameter(new_value))
"""
_accel = _library("accelerate/utils/modeling.py", _ACCEL)

_MISTRAL = """
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 32000, 1024


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
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.embed_tokens = Embedding()
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, MistralDecoderLayer())
        self.norm = MistralRMSNorm()
"""
_mistral = _library("transformers/models/mistral/modeling_mistral.py", _MISTRAL)

_MODELING_UTILS = """
def _checkpoint_tensors(model):
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
    def from_pretrained(cls, model_class, name, config, torch_dtype=None, device_map=None):
        model = model_class(config)
        _load_state_dict_into_meta_model(model, _checkpoint_tensors(model), "", [], device_map={"": device_map},
                                         dtype=torch_dtype)
        return model.eval()
"""
_utils = _library("transformers/modeling_utils.py", _MODELING_UTILS,
                  set_module_tensor_to_device=_accel["set_module_tensor_to_device"])

_ST = """
class Transformer(nn.Module):
    # sentence_transformers.models.Transformer: AutoModel.from_pretrained(name, **model_kwargs), here with
    # the target device as the load's device map (low_cpu_mem_usage), as SentenceTransformer(device=...) ends up
    def __init__(self, model_name_or_path, model_args, device):
        nn.Module.__init__(self)
        config = {"architectures": ["MistralModel"], "hidden_size": 4096, "num_hidden_layers": 32,
                  "torch_dtype": "float16"}
        self.auto_model = PreTrainedModel.from_pretrained(MistralModel, model_name_or_path, config,
                                                          torch_dtype=model_args.get("torch_dtype"),
                                                          device_map=device)


class SentenceTransformer(nn.Module):
    def __init__(self, model_name_or_path, device=None, model_kwargs=None):
        nn.Module.__init__(self)
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self._target_device = device
        self.first = Transformer(model_name_or_path, model_kwargs or {}, device)

    def encode(self, sentences, batch_size=32, normalize_embeddings=False, show_progress_bar=None):
        return []
"""
_st = _library("sentence_transformers/SentenceTransformer.py", _ST, PreTrainedModel=_utils["PreTrainedModel"],
               MistralModel=_mistral["MistralModel"])
SentenceTransformer = _st["SentenceTransformer"]
# ----


def load_shard(shard, num_shards):
    # listings/part-*.parquet, every num_shards-th row group (host memory)
    n = 12000000 // num_shards
    return n


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--shard", type=int, default=1)
    parser.add_argument("--num-shards", type=int, default=4)
    args = parser.parse_args()

    n = load_shard(args.shard, args.num_shards)
    print("shard %d/%d: %d listings; %d GPUs visible" % (args.shard, args.num_shards, n, torch.cuda.device_count()))
    model = SentenceTransformer("intfloat/e5-mistral-7b-instruct", device="cuda",
                                model_kwargs={"torch_dtype": torch.float16})
    emb = model.encode(n, batch_size=32, normalize_embeddings=True, show_progress_bar=True)
    return emb


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
