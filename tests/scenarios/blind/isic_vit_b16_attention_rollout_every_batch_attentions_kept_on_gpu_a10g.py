"""rollout_figures.py -- a dermatology group fine-tuned ViT-B/16 (Hugging Face ViTForImageClassification,
224px, 8 ISIC 2019 diagnoses, 86M parameters, fp32) and now writes the model card: calibration of the
validation predictions and attention-rollout maps (Abnar & Zuidema) of the misclassified melanomas for the
dermatologists to review.  The notebook-turned-script, on the lab's A10G (24 GB, 22.5 GiB usable):

    model = ViTForImageClassification.from_pretrained(CKPT).cuda().eval()
    all_attn, all_probs, all_labels = [], [], []
    with torch.no_grad():
        for batch in val_loader:                               # 5,067 images, batch 64 -> 80 batches
            out = model(pixel_values=batch["pixel_values"].cuda(), output_attentions=True)
            all_attn.append(out.attentions)                    # to roll out the errors afterwards
            all_probs.append(out.logits.softmax(-1))
            all_labels.append(batch["label"].cuda())
    ... find the misclassified images, rollout(all_attn[...]) for each ...

The forward pass is correct (no_grad, eval).  But out.attentions is a tuple of 12 tensors of
64 x 12 heads x 197 x 197 float32: 114 MiB each, 1.33 GiB per batch, and every batch's tuple stays in the
list, on the GPU, for the rollout "afterwards".  The 5,067 images would need 106 GiB.  Batch 16 of 80
(images 961-1,024) fails in the attention of its 6th layer (a 114 MiB request): the list holds the 15
finished batches, 20 GiB, the weights 0.3 GiB; ~0.7 GiB is cached in pieces the kept maps split.

An expert: a Python list keeps every batch's attention maps on the GPU -- memory grows by 1.33 GiB per
batch until it is full.  Do the rollout per batch right after the forward pass (it reduces 12 x 12 x
197 x 197 to a 14x14 map per image) and keep only that, moved to the CPU (.cpu()), or keep only what the
figures need (the maps of the misclassified images; probabilities on the CPU).  Wrong advice: a smaller
batch (the same bytes per image are kept: it fails at the same image), fp16 (fails at image ~2,000
instead), inference_mode (autograd is already off), empty_cache/expandable_segments (the memory is live,
held by the list), a bigger GPU (an 80 GB card fails too, at batch ~60).
"""
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
B, N, D, H, FF = 64, 197, 768, 12, 3072        # batch, tokens (196 patches + CLS), hidden, heads, MLP


def _t(nbytes):
    return torch.empty(nbytes, device="cuda")


# ---- transformers.models.vit.modeling_vit, as far as memory goes (fp32, no_grad: nothing saved)
class Linear(nn.Module):
    def __init__(self, i, o):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(_t(i * o * 4))
        self.bias = nn.Parameter(_t(o * 4))
        self.out_features = o

    def forward(self, x, tokens):
        return _t(tokens * self.out_features * 4)


class LayerNorm(nn.Module):
    def __init__(self, d):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(_t(d * 4))
        self.bias = nn.Parameter(_t(d * 4))

    def forward(self, x, tokens):
        return _t(x.nbytes)


def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0):
    attn_weights = _t(B * H * N * N * 4)                 # torch.matmul(query, key.transpose(-1, -2)) * scaling
    probs = _t(B * H * N * N * 4)                        # softmax(attn_weights, dim=-1, dtype=float32)
    del attn_weights
    attn_output = _t(B * N * D * 4)                      # torch.matmul(probs, value)
    return attn_output, probs


class ViTSelfAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.query, self.key, self.value = Linear(D, D), Linear(D, D), Linear(D, D)
        self.scaling = 64 ** -0.5

    def forward(self, hidden_states, output_attentions=False):
        t = B * N
        q, k, v = self.query(hidden_states, t), self.key(hidden_states, t), self.value(hidden_states, t)
        context_layer, attention_probs = eager_attention_forward(self, q, k, v, None, self.scaling)
        return (context_layer, attention_probs) if output_attentions else (context_layer,)


class ViTAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = ViTSelfAttention()
        self.output = Linear(D, D)

    def forward(self, hidden_states, output_attentions=False):
        self_outputs = self.attention(hidden_states, output_attentions)
        attention_output = self.output(self_outputs[0], B * N)
        return (attention_output,) + self_outputs[1:]


class ViTLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.layernorm_before = LayerNorm(D)
        self.attention = ViTAttention()
        self.layernorm_after = LayerNorm(D)
        self.intermediate = Linear(D, FF)
        self.output = Linear(FF, D)

    def forward(self, hidden_states, output_attentions=False):
        t = B * N
        self_attention_outputs = self.attention(self.layernorm_before(hidden_states, t), output_attentions)
        hidden_states = _t(t * D * 4)                                   # attention_output + hidden_states
        layer_output = self.layernorm_after(hidden_states, t)
        inter = self.intermediate(layer_output, t)                      # + GELU (in place in the sketch)
        layer_output = _t(t * D * 4)                                    # output(inter) + hidden_states
        del inter
        return (layer_output,) + self_attention_outputs[1:]


class ViTEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(12):
            setattr(self, "layer_%d" % i, ViTLayer())

    def forward(self, hidden_states, output_attentions=False):
        all_self_attentions = () if output_attentions else None
        for i in range(12):
            layer_outputs = getattr(self, "layer_%d" % i)(hidden_states, output_attentions)
            hidden_states = layer_outputs[0]
            if output_attentions:
                all_self_attentions = all_self_attentions + (layer_outputs[1],)
        return hidden_states, all_self_attentions


class ViTModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embeddings = nn.Conv2d(3, D, 16, stride=16, device="cuda")
        self.position_embeddings = nn.Parameter(_t(N * D * 4))
        self.cls_token = nn.Parameter(_t(D * 4))
        self.encoder = ViTEncoder()
        self.layernorm = LayerNorm(D)

    def forward(self, pixel_values, output_attentions=False):
        patches = self.patch_embeddings(pixel_values)
        embeddings = _t(B * N * D * 4)                       # cat(cls, patches) + position_embeddings
        del patches
        seq, attentions = self.encoder(embeddings, output_attentions)
        return self.layernorm(seq, B * N), attentions


class ImageClassifierOutput(object):
    def __init__(self, logits, attentions):
        self.loss, self.logits, self.hidden_states, self.attentions = None, logits, None, attentions


class ViTForImageClassification(nn.Module):
    def __init__(self, num_labels=8):
        nn.Module.__init__(self)
        self.vit = ViTModel()
        self.classifier = Linear(D, num_labels)
        self.num_labels = num_labels

    def forward(self, pixel_values=None, output_attentions=None):
        sequence_output, attentions = self.vit(pixel_values, output_attentions=output_attentions)
        logits = _t(B * self.num_labels * 4)
        return ImageClassifierOutput(logits, attentions)

    @classmethod
    def from_pretrained(cls, path):
        return cls(num_labels=8)


def softmax(t):
    return _t(t.nbytes)


# ---- the script
CKPT = "runs/vit-b16-isic2019-224/checkpoint-best"
model = ViTForImageClassification.from_pretrained(CKPT).cuda().eval()
n_val = 5067
n_batches = (n_val + B - 1) // B

all_attn, all_probs, all_labels = [], [], []
try:
    with torch.no_grad():
        for step in range(n_batches):
            pixel_values = _t(B * 3 * 224 * 224 * 4)                   # batch["pixel_values"].cuda()
            labels = _t(B * 8)                                           # batch["label"].cuda(), int64
            out = model(pixel_values=pixel_values, output_attentions=True)
            all_attn.append(out.attentions)
            all_probs.append(softmax(out.logits))
            all_labels.append(labels)
            del out, pixel_values
            if step % 4 == 0:
                print("val batch %d/%d  allocated %.1f GiB" % (step, n_batches, torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
print("rollout for the misclassified images ...")
sys.exit(0)
