"""Full fine-tune of llava-onevision-qwen2-0.5b-ov on an in-house interleaved image-text set (inspection
reports: a few photos per report, some reports with dozens) on one L40S 48GB; one 40-image report arrives.

The real program is LLaVA-NeXT's trainer (llava/train/train_mem.py), launched by hand on the one GPU:

    python llava/train/train_mem.py --model_name_or_path lmms-lab/llava-onevision-qwen2-0.5b-ov \
        --version qwen_1_5 --data_path reports_interleaved.json --image_folder ./reports \
        --vision_tower google/siglip-so400m-patch14-384 --mm_projector_type mlp2x_gelu \
        --mm_tunable_parts "mm_vision_tower,mm_mlp_adapter,mm_language_model" --mm_vision_tower_lr 2e-6 \
        --image_aspect_ratio anyres_max_9 --image_grid_pinpoints "(1x1),...,(6x6)" \
        --bf16 True --per_device_train_batch_size 1 --gradient_accumulation_steps 8 \
        --model_max_length 32768 --gradient_checkpointing True --attn_implementation sdpa ...

model_max_length 32768 is the OneVision default, so nothing is truncated.  A single photo goes through
anyres (a few 384px crops of 729 tokens each); a multi-image sample gets 729 tokens per image.  Typical
samples are 1-4 photos and 2,500-4,100 tokens; the run is stable (7.3 GB live between samples, a 14 GB
peak in the loss; the program below runs 60 such samples, then the outlier).  Then a report with 40 photos
comes: 40 x 729 = 29,160 image tokens + 1,000 text tokens = 30,160 tokens in one sample.

Where the memory goes for that sample (batch 1, bf16, checkpointing on both towers, SDPA attention):
  static: 0.91B params (Qwen2-0.5B 0.49B with tied 151,936 x 896 embeddings, SigLIP-so400m 0.41B,
          projector 1.8M): weights 1.8 GB + grads 1.8 GB + AdamW state 3.6 GB = 7.3 GB
  vision tower, 40 images: 27 layer inputs x 40 x 729 x 1152 x 2 B = 1.8 GB kept
  LLM: 25 layer inputs x 30,160 x 896 x 2 B = 1.35 GB kept
  loss (transformers' ForCausalLMLoss): logits = lm_head(h): 30,160 x 151,936 x 2 B = 9.2 GB (bf16);
          logits.float(): 18.3 GB; cross_entropy's log_softmax: another 18.3 GB
L40S (46,068 MiB = 48.3 GB): 0.5 GB context + 7.3 + 1.8 + 1.35 + 9.2 + 18.3 = 38.5 GB live when
cross_entropy asks for its 18.3 GB (17,480 MiB) log_softmax: out of memory in the loss, after the whole
forward.  The vocabulary of 151,936 words makes the loss cost ~1.5 MB per token (a typical 4,000-token sample:
6 GB), and this sample has 7.5 times the usual tokens.

What an expert says: a sequence-length outlier; the batch is already 1 and checkpointing is on.  Bound the
sample: model_max_length ~8k-16k with truncation, or drop/split documents with more than N images (cap the
images per sample), or downsample multi-image samples (OneVision pools video frames to 196 tokens); or stop
materialising the full logits: a fused / chunked linear cross-entropy (Liger Kernel's
FusedLinearCrossEntropy, which LLaVA-NeXT's trainer can use) computes the loss block by block.  Wrong advice:
smaller batch (it is 1), gradient checkpointing or mixed precision (both on), 8-bit optimizer / LoRA / ZeRO
(7.3 GB of state is not the problem), empty_cache / expandable_segments (the request is 18 GB of live need),
inference mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB, KV_DIM = 896, 4864, 24, 151936, 128
VISION_HIDDEN, VISION_MLP, VISION_LAYERS, TOKENS_PER_CROP = 1152, 4304, 27, 729


class TrainingArguments(object):
    bf16 = True
    per_device_train_batch_size = 1
    gradient_accumulation_steps = 8
    model_max_length = 32768
    gradient_checkpointing = True
    learning_rate = 1e-5
    mm_vision_tower_lr = 2e-6


def weight(numel):
    return nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device=DEVICE))


def bf16(numel, after=None):
    t = torch.empty(numel, dtype=torch.bfloat16, device=DEVICE)
    t._saved = after
    return t


def checkpoint(function, *args):
    """torch.utils.checkpoint.checkpoint as transformers' gradient_checkpointing_enable() wires it: the
    layer's activations are freed when it returns and recomputed in backward; its input is kept."""
    return function(*args)


class SiglipEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = weight(4 * VISION_HIDDEN * VISION_HIDDEN)
        self.mlp = weight(2 * VISION_HIDDEN * VISION_MLP)

    def forward(self, hidden_states, n_tokens):
        qkv = bf16(3 * n_tokens * VISION_HIDDEN)
        fc1 = bf16(n_tokens * VISION_MLP)
        act = bf16(n_tokens * VISION_MLP)
        del qkv, fc1, act
        return bf16(n_tokens * VISION_HIDDEN, after=hidden_states)


class SiglipVisionTower(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = weight(3 * 14 * 14 * VISION_HIDDEN + TOKENS_PER_CROP * VISION_HIDDEN)
        self.layers = []
        for i in range(VISION_LAYERS):
            layer = SiglipEncoderLayer()
            setattr(self, "encoder_layers_%d" % i, layer)
            self.layers.append(layer)
        self.gradient_checkpointing = False

    def forward(self, pixel_values, n_crops):
        n = n_crops * TOKENS_PER_CROP
        hidden_states = bf16(n * VISION_HIDDEN, after=pixel_values)
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(layer.__call__, hidden_states, n)
            else:
                hidden_states = layer(hidden_states, n)
        return hidden_states


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj, self.k_proj = weight(HIDDEN * HIDDEN), weight(HIDDEN * KV_DIM)
        self.v_proj, self.o_proj = weight(HIDDEN * KV_DIM), weight(HIDDEN * HIDDEN)
        self.gate_proj, self.up_proj = weight(HIDDEN * INTERMEDIATE), weight(HIDDEN * INTERMEDIATE)
        self.down_proj = weight(INTERMEDIATE * HIDDEN)
        self.input_layernorm, self.post_attention_layernorm = weight(HIDDEN), weight(HIDDEN)

    def forward(self, hidden_states, n_tokens):
        q = bf16(n_tokens * HIDDEN)
        kv = bf16(2 * n_tokens * KV_DIM)
        gate = bf16(n_tokens * INTERMEDIATE)
        up = bf16(n_tokens * INTERMEDIATE)
        del q, kv, gate, up
        return bf16(n_tokens * HIDDEN, after=hidden_states)


class LlavaQwenModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = weight(HIDDEN)
        self.vision_tower = SiglipVisionTower()
        self.mm_projector = weight(VISION_HIDDEN * HIDDEN + HIDDEN * HIDDEN)
        self.gradient_checkpointing = False

    def forward(self, inputs_embeds, n_tokens):
        hidden_states = inputs_embeds
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = checkpoint(layer.__call__, hidden_states, n_tokens)
            else:
                hidden_states = layer(hidden_states, n_tokens)
        return bf16(n_tokens * HIDDEN, after=hidden_states)             # final norm


class LlavaQwenForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = LlavaQwenModel()

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True
        self.model.vision_tower.gradient_checkpointing = True

    def prepare_inputs_labels_for_multimodal(self, input_ids, pixel_values, n_crops, n_tokens):
        embed_tokens = self.model.embed_tokens
        image_features = self.model.vision_tower(pixel_values, n_crops)
        projector = self.model.mm_projector
        image_features = bf16(n_crops * TOKENS_PER_CROP * HIDDEN, after=image_features)   # mm_projector(...)
        return bf16(n_tokens * HIDDEN, after=image_features)          # text embeds and image features, merged

    def forward(self, input_ids, pixel_values, labels, n_crops, n_tokens):
        inputs_embeds = self.prepare_inputs_labels_for_multimodal(input_ids, pixel_values, n_crops, n_tokens)
        hidden_states = self.model(inputs_embeds, n_tokens)
        logits = bf16(n_tokens * VOCAB, after=hidden_states)            # lm_head (tied to embed_tokens)
        loss = self.loss_function(logits, labels, n_tokens)
        return {"loss": loss, "logits": logits}

    def loss_function(self, logits, labels, n_tokens):
        """transformers.loss.loss_utils.ForCausalLMLoss: upcast, then cross-entropy over the vocabulary."""
        logits_fp32 = torch.empty(n_tokens * VOCAB, dtype=torch.float32, device=DEVICE)   # logits.float()
        logits_fp32._saved = logits
        return F.cross_entropy(logits_fp32, labels)


class InterleavedReports(object):
    """LazySupervisedDataset over reports_interleaved.json, in the order the sampler draws them."""

    def __init__(self):
        self.samples = []
        for i in range(60):
            n_images = 1 + i % 4
            crops = 5 if n_images == 1 else n_images                     # anyres crops for a single photo
            self.samples.append((n_images, crops, crops * TOKENS_PER_CROP + 300 + 150 * n_images))
        self.samples.append((40, 40, 40 * TOKENS_PER_CROP + 1000))       # report RPT-2291: 40 photos

    def __iter__(self):
        for n_images, crops, n_tokens in self.samples:
            yield dict(input_ids=torch.empty(n_tokens * 8, dtype=torch.uint8, device=DEVICE),
                       pixel_values=torch.empty(crops * 3 * 384 * 384, dtype=torch.bfloat16, device=DEVICE),
                       labels=torch.empty(n_tokens * 8, dtype=torch.uint8, device=DEVICE),
                       n_crops=crops, n_tokens=n_tokens)


def train(model, args):
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=args.learning_rate)
    batch_size = args.per_device_train_batch_size
    for step, inputs in enumerate(InterleavedReports()):
        outputs = model(**inputs)
        loss = outputs["loss"]
        del outputs
        scen_truth.backward(loss)                                          # accelerator.backward(loss)
        del loss, inputs
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def main():
    args = TrainingArguments()
    model = LlavaQwenForCausalLM()        # from_pretrained(..., torch_dtype=torch.bfloat16, attn_implementation="sdpa")
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    train(model, args)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
