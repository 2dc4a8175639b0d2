"""serve_mixtral.py -- we want Mixtral-8x7B-Instruct behind our internal chat API and got one H100 80GB
(79.6 GiB as torch reports it) for it.  "It only uses 13B parameters per token", so it should fit:

    model = MixtralForCausalLM.from_pretrained("mistralai/Mixtral-8x7B-Instruct-v0.1",
                                               torch_dtype=torch.bfloat16, device_map="cuda:0")

The checkpoint is already bf16 and we load it as bf16 -- 19 safetensors shards, 87 GiB.  Every one of
the 8 experts of every layer must be resident, whichever 2 a token uses: 46.7B parameters x 2 bytes.
Loading stops in the 18th shard, at the experts of layer 29, with 78.9 GiB loaded and 0.1 GiB left,
before a single token was generated (the KV cache would still need room on top).

An expert: the weights alone are larger than the card.  Quantize them (AWQ/GPTQ 4-bit: ~24 GiB, or
8-bit: ~47 GiB; quality holds well for Mixtral), or split the model across two GPUs with tensor
parallelism; offloading experts to CPU works but is slow for serving.  Not load_in_bf16 (it is bf16
already), not map_location/CPU loading tricks, not a smaller batch or KV cache (nothing ran yet),
not empty_cache / expandable_segments.
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS, EXPERTS = 32, 8
SHARD_BYTES = 4800 * MiB


def checkpoint_index():
    """model.safetensors.index.json: tensor name -> (bytes), in shard order."""
    names = [("model.embed_tokens.weight", 250 * MiB)]
    for i in range(LAYERS):
        for p, n in (("q_proj", 32), ("k_proj", 8), ("v_proj", 8), ("o_proj", 32)):
            names.append(("model.layers.%d.self_attn.%s.weight" % (i, p), n * MiB))
        for e in range(EXPERTS):
            for w in ("w1", "w2", "w3"):
                names.append(("model.layers.%d.block_sparse_moe.experts.%d.%s.weight" % (i, e, w), 112 * MiB))
    names.append(("lm_head.weight", 250 * MiB))
    shards, cur, size = [], [], 0
    for name, n in names:
        if size + n > SHARD_BYTES and cur:
            shards.append(cur)
            cur, size = [], 0
        cur.append((name, n))
        size += n
    shards.append(cur)
    return shards


def load_file(shard, device):
    """safetensors.torch.load_file(filename, device="cuda:0"): every tensor of the shard on the device."""
    result = {}
    for name, n in shard:
        result[name] = torch.empty(n // 2, dtype=torch.bfloat16, device=device)
    return result


class MixtralDecoderLayer(nn.Module):
    pass


class MixtralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, MixtralDecoderLayer())

    def _load_state_dict_into_model(self, state_dict):
        for name, tensor in state_dict.items():
            parts = name.split(".")
            owner = getattr(self, "layer_%s" % parts[2]) if parts[1] == "layers" else self
            setattr(owner, "_".join(parts[3:] if parts[1] == "layers" else parts[:-1]).replace(".", "_"),
                    nn.Parameter(tensor, requires_grad=False))

    @classmethod
    def from_pretrained(cls, repo, torch_dtype=None, device_map=None):
        model = cls()                                         # on the meta device: nothing allocated
        for i, shard in enumerate(checkpoint_index()):
            state_dict = load_file(shard, device=device_map)
            model._load_state_dict_into_model(state_dict)
            del state_dict
        return model.eval()


def main():
    model = MixtralForCausalLM.from_pretrained("mistralai/Mixtral-8x7B-Instruct-v0.1",
                                               torch_dtype=torch.bfloat16, device_map="cuda:0")
    return model


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
