"""extract_in1k_features.py -- a PhD student's feature-extraction script: DINOv2 ViT-L/14 CLS features for
the whole ImageNet-1k train set (1,281,167 images), to train linear and k-NN probes on later without running
the backbone again.  It runs on an AWS g5.xlarge (one NVIDIA A10G, 24 GB: 23,028 MiB), transformers 4.44,
torch 2.4, the backbone in float16 (304M parameters, 0.58 GB), batch 256 at 224x224, under inference_mode:

    model = AutoModel.from_pretrained("facebook/dinov2-large", torch_dtype=torch.float16).cuda().eval()
    loader = DataLoader(ImageFolder("/data/imagenet/train", transform=val_tf), batch_size=256,
                        num_workers=8, pin_memory=True)
    feats = []
    with torch.inference_mode():
        for images, _ in tqdm(loader):
            out = model(pixel_values=images.to("cuda", torch.float16, non_blocking=True))
            feats.append(out.last_hidden_state[:, 0])          # the CLS token: 256 x 1024
    feats = torch.cat(feats).cpu()                              # 1.28M x 1024 fp16 = 2.6 GB
    torch.save(feats, "in1k_train_dinov2_vitl14_cls.pt")

The student did the arithmetic: 1.28M x 1024 x 2 bytes = 2.6 GB of features, the card has 23 GB, so the
features can stay on the GPU until the end.  The job dies after about 165 of 5,005 batches (3 minutes in),
in the middle of a forward (an MLP's GELU output, 514 MiB), with torch reporting 21 GiB allocated.

Why: `out.last_hidden_state[:, 0]` is a view.  It keeps the storage of the whole last_hidden_state alive,
[256, 257, 1024] float16 = 128.5 MiB per batch, not the 512 KiB of the CLS rows.  Every batch pins another
128.5 MiB: 160 batches are 20 GiB, 257 times what the student thinks the list holds (and the full set would
be 628 GiB, which would not fit in host memory either).

An expert: memory grows batch after batch, held by the `feats` list of the script; the fix is to keep a
copy of only the rows you need, off the GPU: `feats.append(out.last_hidden_state[:, 0].cpu())` (or
`.clone()`; .cpu() also lets the 2.6 GB go to host memory), or write the features into a preallocated
host / memmap array as they come.  Then the run needs one batch of activations (about 1.5 GiB) whatever
the dataset's size.
Wrong first advice: a smaller batch (the total pinned is the same: it only fails later in the epoch),
mixed precision (already float16), inference_mode / no_grad (already on), gradient checkpointing (no
backward), expandable_segments / empty_cache (the memory is live: the list holds it), quantizing or
offloading the 0.58 GB backbone, a bigger GPU (an 80 GB card fails at batch ~600).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

SITE = "/opt/conda/lib/python3.11/site-packages/"

# ---- stand-in gaps, compiled as part of torch's file (C builtins in PyTorch: no Python frame of their own)
_GAPS = """
def _getitem(self, index):
    # basic indexing (t[:, 0]) returns a view: same storage, the base kept alive, as PyTorch's does
    return self.view()

def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    return torch.empty_like(input)

def linear(input, weight, bias=None, out_features=None, in_features=None):
    out = torch.empty(input.nbytes // in_features * out_features, device=input.device)
    out._dtype = input.dtype
    return out

def gelu(input, approximate="none"):
    return torch.empty_like(input)

def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
    # memory-efficient kernel on sm_86: the output only (batch x heads x tokens x head_dim)
    return torch.empty_like(query)

def add(input, other):
    return torch.empty_like(input)

def mul(input, other):
    return torch.empty_like(input)

def cat(tensors, dim=0):
    out = torch.empty(sum(t.nbytes for t in tensors), device=tensors[0].device)
    out._dtype = tensors[0].dtype
    return out

def _expand(self, *sizes):
    # Tensor.expand: a view with stride 0 along the new dimension (no memory); its size is what it reads as
    v = self.view()
    v.nbytes = self.nbytes * sizes[0]
    return v
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.__getitem__ = _ns["_getitem"]
torch.Tensor.expand = _ns["_expand"]
torch.layer_norm, torch.add, torch.mul, torch.cat = _ns["layer_norm"], _ns["add"], _ns["mul"], _ns["cat"]
torch.nn.functional.layer_norm = _ns["layer_norm"]
torch.nn.functional.linear = _ns["linear"]
torch.nn.functional.gelu = _ns["gelu"]
torch.nn.functional.scaled_dot_product_attention = _ns["scaled_dot_product_attention"]

_NN = """
class Linear(Module):
    def __init__(self, in_features, out_features, bias=True, device=None, dtype=None):
        Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = Parameter(torch.empty(in_features * out_features, dtype=dtype, device=device))
        if bias:
            self.bias = Parameter(torch.empty(out_features, dtype=dtype, device=device))

    def forward(self, input):
        return F.linear(input, self.weight, None, self.out_features, self.in_features)

class LayerNorm(Module):
    def __init__(self, normalized_shape, eps=1e-5, device=None, dtype=None):
        Module.__init__(self)
        self.weight = Parameter(torch.empty(normalized_shape, dtype=dtype, device=device))
        self.bias = Parameter(torch.empty(normalized_shape, dtype=dtype, device=device))

    def forward(self, input):
        return F.layer_norm(input, None, self.weight, self.bias)
"""
_nn = {"torch": torch, "Module": torch.nn.Module, "Parameter": torch.nn.Parameter, "F": torch.nn.functional,
       "__name__": "torch.nn.modules.linear"}
exec(compile(_NN, SITE + "torch/nn/modules/linear.py", "exec"), _nn)
torch.nn.Linear, torch.nn.LayerNorm = _nn["Linear"], _nn["LayerNorm"]

# ---- transformers' modeling_dinov2.py (4.44), as far as memory goes; sizes in elements of the model's dtype
_MODELING = """
class BaseModelOutputWithPooling(object):
    def __init__(self, last_hidden_state=None, pooler_output=None, hidden_states=None, attentions=None):
        self.last_hidden_state, self.pooler_output = last_hidden_state, pooler_output
        self.hidden_states, self.attentions = hidden_states, attentions


class Dinov2PatchEmbeddings(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.projection = nn.Conv2d(3, config["hidden_size"], 14, stride=14)

    def forward(self, pixel_values):
        # [B, 3, 224, 224] -> [B, 1024, 16, 16] -> [B, 256, 1024]
        B = self.batch
        return torch.empty(B * 256 * 1024, dtype=pixel_values.dtype, device=pixel_values.device)


class Dinov2Embeddings(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        d = config["hidden_size"]
        self.cls_token = nn.Parameter(torch.empty(d, dtype=dtype, device="cuda"))
        self.mask_token = nn.Parameter(torch.empty(d, dtype=dtype, device="cuda"))
        self.position_embeddings = nn.Parameter(torch.empty(1370 * d, dtype=dtype, device="cuda"))
        self.patch_embeddings = Dinov2PatchEmbeddings(config, dtype)

    def interpolate_pos_encoding(self, embeddings, height, width):
        # 37x37 -> 16x16 bicubic, computed in float32
        return torch.empty(257 * 1024, dtype=torch.float32, device=embeddings.device)

    def forward(self, pixel_values, bool_masked_pos=None):
        self.patch_embeddings.batch = pixel_values.nbytes // (3 * 224 * 224 * 2)
        embeddings = self.patch_embeddings(pixel_values)
        cls_tokens = self.cls_token.expand(self.patch_embeddings.batch, -1, -1)
        embeddings = torch.cat((cls_tokens, embeddings), dim=1)
        del cls_tokens
        pos = self.interpolate_pos_encoding(embeddings, 224, 224)
        embeddings = torch.add(embeddings, pos)
        del pos
        return embeddings


class Dinov2SelfAttention(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        d = config["hidden_size"]
        self.query = nn.Linear(d, d, dtype=dtype, device="cuda")
        self.key = nn.Linear(d, d, dtype=dtype, device="cuda")
        self.value = nn.Linear(d, d, dtype=dtype, device="cuda")


class Dinov2SdpaSelfAttention(Dinov2SelfAttention):
    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        query_layer = self.query(hidden_states)
        key_layer = self.key(hidden_states)
        value_layer = self.value(hidden_states)
        context_layer = F.scaled_dot_product_attention(query_layer, key_layer, value_layer, None, 0.0, False)
        del query_layer, key_layer, value_layer
        return (context_layer,)


class Dinov2SelfOutput(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.dense = nn.Linear(config["hidden_size"], config["hidden_size"], dtype=dtype, device="cuda")

    def forward(self, hidden_states, input_tensor):
        return self.dense(hidden_states)


class Dinov2SdpaAttention(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.attention = Dinov2SdpaSelfAttention(config, dtype)
        self.output = Dinov2SelfOutput(config, dtype)

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        self_outputs = self.attention(hidden_states, head_mask, output_attentions)
        attention_output = self.output(self_outputs[0], hidden_states)
        del self_outputs
        return (attention_output,)


class Dinov2LayerScale(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.lambda1 = nn.Parameter(torch.empty(config["hidden_size"], dtype=dtype, device="cuda"))

    def forward(self, hidden_state):
        return torch.mul(hidden_state, self.lambda1)


class Dinov2MLP(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        d = config["hidden_size"]
        self.fc1 = nn.Linear(d, 4 * d, dtype=dtype, device="cuda")
        self.fc2 = nn.Linear(4 * d, d, dtype=dtype, device="cuda")

    def forward(self, hidden_state):
        hidden_state = self.fc1(hidden_state)
        hidden_state = F.gelu(hidden_state)
        hidden_state = self.fc2(hidden_state)
        return hidden_state


class Dinov2Layer(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        d = config["hidden_size"]
        self.norm1 = nn.LayerNorm(d, dtype=dtype, device="cuda")
        self.attention = Dinov2SdpaAttention(config, dtype)
        self.layer_scale1 = Dinov2LayerScale(config, dtype)
        self.norm2 = nn.LayerNorm(d, dtype=dtype, device="cuda")
        self.mlp = Dinov2MLP(config, dtype)
        self.layer_scale2 = Dinov2LayerScale(config, dtype)

    def forward(self, hidden_states, head_mask=None, output_attentions=False):
        self_attention_outputs = self.attention(self.norm1(hidden_states), head_mask, output_attentions)
        attention_output = self.layer_scale1(self_attention_outputs[0])
        del self_attention_outputs
        hidden_states = torch.add(attention_output, hidden_states)
        del attention_output
        layer_output = self.norm2(hidden_states)
        layer_output = self.mlp(layer_output)
        layer_output = self.layer_scale2(layer_output)
        layer_output = torch.add(layer_output, hidden_states)
        return (layer_output,)


class Dinov2Encoder(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.layer = []
        for i in range(config["num_hidden_layers"]):
            setattr(self, "layer_%d" % i, Dinov2Layer(config, dtype))
            self.layer.append(getattr(self, "layer_%d" % i))

    def forward(self, hidden_states, head_mask=None, output_attentions=False, output_hidden_states=False):
        for layer_module in self.layer:
            layer_outputs = layer_module(hidden_states, None, output_attentions)
            hidden_states = layer_outputs[0]
            del layer_outputs
        return (hidden_states,)


class Dinov2Model(nn.Module):
    def __init__(self, config, dtype):
        nn.Module.__init__(self)
        self.config = config
        self.embeddings = Dinov2Embeddings(config, dtype)
        self.encoder = Dinov2Encoder(config, dtype)
        self.layernorm = nn.LayerNorm(config["hidden_size"], dtype=dtype, device="cuda")

    def forward(self, pixel_values=None, bool_masked_pos=None, head_mask=None, output_attentions=None,
                output_hidden_states=None, return_dict=None):
        embedding_output = self.embeddings(pixel_values, bool_masked_pos=bool_masked_pos)
        encoder_outputs = self.encoder(embedding_output, head_mask=head_mask)
        del embedding_output
        sequence_output = encoder_outputs[0]
        del encoder_outputs
        sequence_output = self.layernorm(sequence_output)
        pooled_output = sequence_output[:, 0, :]
        return BaseModelOutputWithPooling(last_hidden_state=sequence_output, pooler_output=pooled_output)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        config = {"hidden_size": 1024, "num_hidden_layers": 24, "patch_size": 14, "image_size": 518}
        return cls(config, torch_dtype or torch.float32)
"""
_hf = {"torch": torch, "nn": torch.nn, "F": torch.nn.functional,
       "__name__": "transformers.models.dinov2.modeling_dinov2"}
exec(compile(_MODELING, SITE + "transformers/models/dinov2/modeling_dinov2.py", "exec"), _hf)


class AutoModel(object):
    """transformers.AutoModel: config.json's model_type "dinov2" -> Dinov2Model."""

    @staticmethod
    def from_pretrained(name, torch_dtype=None):
        return _hf["Dinov2Model"].from_pretrained(name, torch_dtype=torch_dtype)
# ----

NUM_IMAGES = 1281167
BATCH_SIZE = 256


class ImageNetTrainLoader(object):
    """DataLoader(ImageFolder("/data/imagenet/train", val_tf), batch_size=256, num_workers=8, pin_memory=True):
    [256, 3, 224, 224] float32 batches in pinned host memory; .to("cuda", torch.float16) copies each over."""

    def __init__(self, n, batch_size):
        self.n, self.batch_size = n, batch_size

    def __len__(self):
        return (self.n + self.batch_size - 1) // self.batch_size

    def __iter__(self):
        for start in range(0, self.n, self.batch_size):
            yield min(self.batch_size, self.n - start), None


def main():
    model = AutoModel.from_pretrained("facebook/dinov2-large", torch_dtype=torch.float16).cuda().eval()
    n_params = sum(p.nbytes for p in model.parameters()) // 2
    print("facebook/dinov2-large: %.0fM parameters (float16)" % (n_params / 1e6))

    loader = ImageNetTrainLoader(NUM_IMAGES, BATCH_SIZE)
    feats = []
    with torch.inference_mode():
        for step, (bsz, _) in enumerate(loader):
            images = torch.empty(bsz * 3 * 224 * 224, dtype=torch.float16, device="cuda")   # images.to("cuda", fp16)
            out = model(pixel_values=images)
            feats.append(out.last_hidden_state[:, 0])          # the CLS token: 256 x 1024
            del images, out
            if step % 25 == 0:
                print("  %4d/%d batches  allocated %.2f GiB" % (step, len(loader),
                                                                torch.cuda.memory_allocated() / 2.0 ** 30))
    feats = torch.cat(feats)                                   # .cpu() afterwards
    torch.save({"feats": feats}, "in1k_train_dinov2_vitl14_cls.pt")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
