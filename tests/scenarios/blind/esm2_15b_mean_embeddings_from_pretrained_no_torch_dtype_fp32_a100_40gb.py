"""ESM-2 15B loaded with from_pretrained(device_map="cuda") and no torch_dtype: float32 weights fill an A100 40GB.

The real program (transformers 4.44, accelerate 0.33, PyTorch 2.3, one A100-SXM4-40GB of a university
cluster), embedding a deep-mutational-scanning library for a downstream fitness regressor:

    tok = AutoTokenizer.from_pretrained("facebook/esm2_t48_15B_UR50D")
    model = EsmModel.from_pretrained("facebook/esm2_t48_15B_UR50D", device_map="cuda")
    model.eval()
    for batch in DataLoader(variants, batch_size=8, collate_fn=collate):   # 238-residue GFP variants
        with torch.no_grad():
            h = model(**batch.to("cuda")).last_hidden_state
        emb.append((h * mask).sum(1).div(mask.sum(1)).cpu())

The user had run the 3B model the same way (3B x 4 B = 11 GiB, fine) and only changed the name.
Without torch_dtype, from_pretrained materializes every weight in torch.get_default_dtype(), float32.
ESM-2 15B: 48 layers of hidden 5,120 (40 heads) and intermediate 20,480: per layer q, k, v, o
(4 x 5120^2) + the two FFN matrices (2 x 5120 x 20480) = 314.6 M parameters, 1,258 MB = 1,200 MiB in
float32; 48 layers = 56.3 GiB, plus embeddings and the contact head: 15.1 B parameters, 56.3 GiB.
The card has 40 GiB, 39.5 GiB after the CUDA context: accelerate's set_module_tensor_to_device places
the weights shard by shard and the failure comes in the 34th of 48 layers (encoder.layer.33.output.dense:
39.5 GiB of weights already on the card, 38 MiB free, the next 400 MiB FFN matrix does not fit).  Nothing has run yet: no
activations, no cache, batch and sequence length play no part.

What an expert says first: load it in half precision, from_pretrained(..., torch_dtype=torch.bfloat16)
(A100: bf16 is supported; float16 also works for ESM-2 inference): 15.1 B x 2 B = 28.1 GiB of
weights, leaving ~11 GiB for batches of 8 x 240 tokens under no_grad (a few hundred MB).  Alternatives:
8-bit loading (load_in_8bit, ~14 GiB), device_map="auto" with CPU offload (slow), an 80 GB card (the
float32 weights alone, 56.3 GiB, fit there), or the 3B model.
Wrong advice: a smaller batch or shorter sequences (the failure is in loading; no batch ran),
gradient checkpointing (inference, nothing trained), empty_cache/expandable_segments (the cache holds
nothing: every byte is a live weight), inference_mode (no forward has run; the weights are what fail).
"""
import torch
import torch.nn as nn
import scen_truth

scen_truth.note_every_empty(torch)


class EsmConfig(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)

    @classmethod
    def from_pretrained(cls, name):
        # facebook/esm2_t48_15B_UR50D/config.json
        return cls(hidden_size=5120, num_hidden_layers=48, num_attention_heads=40, intermediate_size=20480,
                   vocab_size=33, max_position_embeddings=1026, torch_dtype="float32")


class ModuleList(nn.Module):
    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())

    def __len__(self):
        return len(self._modules)


class Linear(nn.Module):
    """nn.Linear made under init_empty_weights(): its weight and bias are filled by the checkpoint load."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self._parameters["weight"] = None
        self._parameters["bias"] = None
        self.shapes = {"weight": in_features * out_features, "bias": out_features}

    def forward(self, x):
        rows = x.nbytes // (4 * self.in_features)
        out = torch.empty(rows * self.out_features, dtype=x.dtype)
        if torch.is_grad_enabled():
            out._saved = (x, self.weight)
        return out


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self._parameters["weight"] = None
        self._parameters["bias"] = None
        self.shapes = {"weight": dim, "bias": dim}

    def forward(self, x):
        return torch.empty(x.nbytes // 4, dtype=x.dtype)


class EsmSelfAttention(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.query = Linear(config.hidden_size, config.hidden_size)
        self.key = Linear(config.hidden_size, config.hidden_size)
        self.value = Linear(config.hidden_size, config.hidden_size)


class EsmSelfOutput(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.dense = Linear(config.hidden_size, config.hidden_size)


class EsmAttention(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.self = EsmSelfAttention(config)
        self.output = EsmSelfOutput(config)
        self.LayerNorm = LayerNorm(config.hidden_size)


class EsmIntermediate(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.dense = Linear(config.hidden_size, config.intermediate_size)


class EsmOutput(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.dense = Linear(config.intermediate_size, config.hidden_size)


class EsmLayer(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.attention = EsmAttention(config)
        self.intermediate = EsmIntermediate(config)
        self.output = EsmOutput(config)
        self.LayerNorm = LayerNorm(config.hidden_size)


class EsmEncoder(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.layer = ModuleList([EsmLayer(config) for _ in range(config.num_hidden_layers)])
        self.emb_layer_norm_after = LayerNorm(config.hidden_size)


class EsmEmbeddings(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self._parameters["word_embeddings"] = None
        self.shapes = {"word_embeddings": config.vocab_size * config.hidden_size}


class EsmContactPredictionHead(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.regression = Linear(config.num_hidden_layers * config.num_attention_heads, 1)


class EsmModel(nn.Module):
    def __init__(self, config):
        nn.Module.__init__(self)
        self.config = config
        self.embeddings = EsmEmbeddings(config)
        self.encoder = EsmEncoder(config)
        self.contact_head = EsmContactPredictionHead(config)

    @classmethod
    def from_pretrained(cls, name, device_map=None, torch_dtype=None):
        config = EsmConfig.from_pretrained(name)
        # with init_empty_weights(): the skeleton on the meta device, no memory yet
        model = cls(config)
        # torch_dtype not given: the weights are loaded in the default dtype (float32)
        dtype = torch_dtype if torch_dtype is not None else torch.get_default_dtype()
        model._load_pretrained_model(checkpoint_shards(config), device_map, dtype)
        return model

    def _load_pretrained_model(self, shards, device_map, dtype):
        for shard_file, state_dict in shards:
            _load_state_dict_into_meta_model(self, state_dict, device_map, dtype)

    def forward(self, input_ids_len, batch):
        h = torch.empty(batch * input_ids_len * self.config.hidden_size, dtype=torch.get_default_dtype())
        return h


def named_modules(model, prefix=""):
    yield prefix, model
    for name, child in model._modules.items():
        for n, m in named_modules(child, prefix + ("." if prefix else "") + name):
            yield n, m


def checkpoint_shards(config):
    """pytorch_model-000NN-of-00013.bin: the embeddings first, then four encoder layers a shard
    (loaded on the CPU one at a time: load_state_dict(shard_file))."""
    names = []
    for prefix, module in named_modules(EsmModel(config)):
        for pname in getattr(module, "shapes", {}):
            names.append((prefix + "." + pname, module.shapes[pname]))
    per_shard = []
    for name, numel in names:
        layer = int(name.split(".")[2]) if name.startswith("encoder.layer.") else -1
        shard = 0 if layer < 0 else 1 + layer // 4
        while len(per_shard) <= shard:
            per_shard.append([])
        per_shard[shard].append((name, numel))
    for i, entries in enumerate(per_shard):
        yield "pytorch_model-%05d-of-%05d.bin" % (i + 1, len(per_shard)), entries


def set_module_tensor_to_device(model, tensor_name, device, numel, dtype):
    """accelerate.utils.set_module_tensor_to_device: the checkpoint's tensor, cast to dtype, on device."""
    module = model
    parts = tensor_name.split(".")
    for p in parts[:-1]:
        module = module._modules[p]
    new_value = torch.empty(numel, dtype=dtype, device=device)
    module._parameters[parts[-1]] = nn.Parameter(new_value, requires_grad=False)


def _load_state_dict_into_meta_model(model, state_dict, device_map, dtype):
    for param_name, numel in state_dict:
        param_device = device_map if isinstance(device_map, str) else device_map[param_name]
        set_module_tensor_to_device(model, param_name, "cuda:0" if param_device == "cuda" else param_device,
                                    numel, dtype)


def embed_variants(model, variants, batch_size=8):
    emb = []
    for i in range(0, len(variants), batch_size):
        with torch.no_grad():
            h = model(240, batch_size)
        emb.append(h.nbytes)
    return emb


def main():
    model = EsmModel.from_pretrained("facebook/esm2_t48_15B_UR50D", device_map="cuda")
    model.eval()
    variants = ["gfp_variant_%05d" % i for i in range(51714)]
    emb = embed_variants(model, variants)
    print("embedded", len(emb))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
