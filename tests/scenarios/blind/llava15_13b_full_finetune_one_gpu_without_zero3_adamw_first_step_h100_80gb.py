"""LLaVA-1.5-13B stage-2 (visual instruction tuning) full fine-tune on a single H100 80GB, without DeepSpeed.

The real program is the LLaVA repo's trainer, launched by hand on the one GPU the user rented:

    python llava/train/train_mem.py \
        --model_name_or_path lmsys/vicuna-13b-v1.5 --version v1 \
        --data_path ./playground/data/llava_v1_5_mix665k.json --image_folder ./playground/data \
        --vision_tower openai/clip-vit-large-patch14-336 \
        --pretrain_mm_mlp_adapter ./checkpoints/llava-v1.5-13b-pretrain/mm_projector.bin \
        --mm_projector_type mlp2x_gelu --mm_vision_select_layer -2 --image_aspect_ratio pad \
        --bf16 True --per_device_train_batch_size 4 --gradient_accumulation_steps 32 \
        --learning_rate 2e-5 --model_max_length 2048 --gradient_checkpointing True ...

scripts/v1_5/finetune.sh runs the same thing as `deepspeed ... --deepspeed ./scripts/zero3.json` on 8x A100;
the user dropped the deepspeed launcher ("I only have one card, and 80 GB is a lot") and compensated the
global batch of 128 with 4 x 32 accumulation.  With --bf16 the model is loaded in bfloat16, the vision tower
is frozen (its forward runs under @torch.no_grad()), the LLM and the projector train, and HF Trainer uses
torch.optim.AdamW, whose exp_avg / exp_avg_sq are made, in the parameters' dtype, at the first step.

Sizes (Vicuna-13B: 40 layers, hidden 5120, MLP 13824, vocab 32000 -> 13.02B parameters; CLIP ViT-L/14-336:
0.30B, frozen; projector 1024->5120->5120: 31.5M):
  weights bf16:           26.0 GB LLM + 0.6 GB vision tower + 0.06 GB projector = 26.7 GB
  gradients (bf16):       26.1 GB, made by the first backward and kept across the 32 micro-batches
  activations per micro-batch (4 x ~1,400 tokens = 5,600 tokens, checkpointing on, flash attention):
                          40 layer inputs x 57 MB = 2.3 GB kept, ~0.5 GB recomputed per layer,
                          logits 0.36 GB bf16 + 0.72 GB fp32 + 0.72 GB log_softmax: ~4 GB peak
  AdamW state (bf16 x 2): 52.2 GB, created during the first optimizer.step()
80 GiB card: 0.5 GB context + 26.7 + 26.1 = 53.3 GB before the step; the 32 micro-batches run fine (about a
quarter of an hour), then optimizer.step() creates states parameter by parameter and runs out about 60% of the
way through the decoder layers.  Static need: 26.7 + 26.1 + 52.2 = 105 GB, more than any 80 GB card.

What an expert says: this is the memory of the training state itself (2 + 2 + 4 bytes per trainable
parameter), not of the batch.  Either shard it (the repo's own recipe: DeepSpeed ZeRO-3 over several GPUs,
or on this one GPU zero3_offload.json, i.e. ZeRO-3 with the optimizer state and parameters offloaded to CPU
RAM), or train far fewer parameters: LoRA (scripts/v1_5/finetune_lora.sh, which the LLaVA README recommends
for limited GPU memory).  An 8-bit optimizer alone (~26 GB of state) still leaves 79 GB + activations: not
enough on this card.  Wrong advice: smaller batch, shorter sequences, gradient checkpointing (already on),
mixed precision (already bf16), expandable_segments / empty_cache (the cache holds ~4 GB at most; the
shortfall is ~20 GB of live state), inference mode.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)


class TrainingArguments(object):
    """transformers.TrainingArguments as train_mem.py parses them from the command line."""
    bf16 = True
    per_device_train_batch_size = 4
    gradient_accumulation_steps = 32
    learning_rate = 2e-5
    model_max_length = 2048
    gradient_checkpointing = True
    num_train_epochs = 1
    output_dir = "./checkpoints/llava-v1.5-13b"


DEVICE = "cuda"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 5120, 13824, 40, 32000
VISION_HIDDEN, VISION_LAYERS, IMAGE_TOKENS = 1024, 24, 576


def weight(numel, dtype=torch.bfloat16, requires_grad=True):
    return nn.Parameter(torch.empty(numel, dtype=dtype, device=DEVICE), requires_grad=requires_grad)


class Linear(nn.Module):
    def __init__(self, in_features, out_features, requires_grad=True):
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        self.weight = weight(in_features * out_features, requires_grad=requires_grad)

    def forward(self, x, n_tokens):
        out = torch.empty(n_tokens * self.out_features, dtype=torch.bfloat16, device=DEVICE)
        out._saved = x
        return out


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = weight(hidden)

    def forward(self, x, n_tokens):
        out = torch.empty(n_tokens * HIDDEN, dtype=torch.bfloat16, device=DEVICE)
        out._saved = x
        return out


class LlamaAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, HIDDEN)
        self.v_proj = Linear(HIDDEN, HIDDEN)
        self.o_proj = Linear(HIDDEN, HIDDEN)

    def forward(self, x, n_tokens):
        q, k, v = self.q_proj(x, n_tokens), self.k_proj(x, n_tokens), self.v_proj(x, n_tokens)
        attn = torch.empty(n_tokens * HIDDEN, dtype=torch.bfloat16, device=DEVICE)   # flash_attn_varlen_func
        return self.o_proj(attn, n_tokens)


class LlamaMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate_proj = Linear(HIDDEN, INTERMEDIATE)
        self.up_proj = Linear(HIDDEN, INTERMEDIATE)
        self.down_proj = Linear(INTERMEDIATE, HIDDEN)

    def forward(self, x, n_tokens):
        gate, up = self.gate_proj(x, n_tokens), self.up_proj(x, n_tokens)
        act = torch.empty(n_tokens * INTERMEDIATE, dtype=torch.bfloat16, device=DEVICE)   # silu(gate) * up
        return self.down_proj(act, n_tokens)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = LlamaAttention()
        self.mlp = LlamaMLP()
        self.input_layernorm = LlamaRMSNorm(HIDDEN)
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN)

    def forward(self, hidden_states, n_tokens):
        # run inside the checkpoint: everything made here is dropped when the layer returns and recomputed in
        # backward; autograd keeps only the layer's input
        h = self.self_attn(self.input_layernorm(hidden_states, n_tokens), n_tokens)
        h = self.mlp(self.post_attention_layernorm(h, n_tokens), n_tokens)
        out = torch.empty(n_tokens * HIDDEN, dtype=torch.bfloat16, device=DEVICE)
        out._saved = hidden_states
        return out


class LlamaModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = LlamaRMSNorm(HIDDEN)
        self.gradient_checkpointing = False

    def forward(self, inputs_embeds, n_tokens):
        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = self._gradient_checkpointing_func(decoder_layer.__call__, hidden_states, n_tokens)
            else:
                hidden_states = decoder_layer(hidden_states, n_tokens)
        return self.norm(hidden_states, n_tokens)


class CLIPVisionTower(nn.Module):
    """llava/model/multimodal_encoder/clip_encoder.py: frozen (requires_grad False), forward without autograd."""

    def __init__(self):
        super().__init__()
        self.layers = [weight(12 * VISION_HIDDEN * VISION_HIDDEN, requires_grad=False) for _ in range(VISION_LAYERS)]
        for i, w in enumerate(self.layers):
            setattr(self, "encoder_layer_%d" % i, w)
        self.embeddings = weight(3 * 14 * 14 * VISION_HIDDEN + 577 * VISION_HIDDEN, requires_grad=False)

    def forward(self, images, n_images):
        with torch.no_grad():                          # the repo decorates this forward with @torch.no_grad()
            x = torch.empty(n_images * 577 * VISION_HIDDEN, dtype=torch.bfloat16, device=DEVICE)
            for _ in self.layers:
                mlp = torch.empty(n_images * 577 * 4 * VISION_HIDDEN, dtype=torch.bfloat16, device=DEVICE)
                x = torch.empty(n_images * 577 * VISION_HIDDEN, dtype=torch.bfloat16, device=DEVICE)
                del mlp
            return torch.empty(n_images * IMAGE_TOKENS * VISION_HIDDEN, dtype=torch.bfloat16, device=DEVICE)


def checkpoint(function, *args):
    """torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=True) as transformers calls it: the
    layer's own activations are freed as soon as it returns (recomputed in backward); its input is kept."""
    return function(*args)


class LlavaLlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = LlamaModel()
        self.vision_tower = CLIPVisionTower()
        self.mm_projector_0 = Linear(VISION_HIDDEN, HIDDEN)     # mlp2x_gelu
        self.mm_projector_2 = Linear(HIDDEN, HIDDEN)
        self.lm_head = Linear(HIDDEN, VOCAB)

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True
        self.model._gradient_checkpointing_func = checkpoint

    def prepare_inputs_labels_for_multimodal(self, input_ids, images, n_images, n_tokens):
        embed_tokens = self.model.embed_tokens          # text part: self.get_model().embed_tokens(input_ids)
        feats = self.vision_tower(images, n_images)
        feats = self.mm_projector_2(self.mm_projector_0(feats, n_images * IMAGE_TOKENS), n_images * IMAGE_TOKENS)
        inputs_embeds = torch.empty(n_tokens * HIDDEN, dtype=torch.bfloat16, device=DEVICE)   # torch.cat of text
        inputs_embeds._saved = feats                                                           # and image embeds
        return inputs_embeds

    def forward(self, input_ids, images, labels, n_images, n_tokens):
        inputs_embeds = self.prepare_inputs_labels_for_multimodal(input_ids, images, n_images, n_tokens)
        hidden_states = self.model(inputs_embeds, n_tokens)
        logits = self.lm_head(hidden_states, n_tokens)
        logits_fp32 = torch.empty(n_tokens * VOCAB, dtype=torch.float32, device=DEVICE)         # logits.float()
        logits_fp32._saved = logits
        loss = F.cross_entropy(logits_fp32, labels)
        return {"loss": loss}


def supervised_batches(args):
    """LazySupervisedDataset + DataCollatorForSupervisedDataset: 4 conversations padded to the longest."""
    while True:
        n_tokens = 4 * 1400
        input_ids = torch.empty(n_tokens, dtype=torch.int8, device=DEVICE)
        labels = torch.empty(n_tokens, dtype=torch.int8, device=DEVICE)
        images = torch.empty(args.per_device_train_batch_size * 3 * 336 * 336, dtype=torch.bfloat16, device=DEVICE)
        yield dict(input_ids=input_ids, images=images, labels=labels,
                   n_images=args.per_device_train_batch_size, n_tokens=n_tokens)


def train(model, args):
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=args.learning_rate, weight_decay=0.0)
    for step, inputs in enumerate(supervised_batches(args)):
        loss = model(**inputs)["loss"]               # / gradient_accumulation_steps
        scen_truth.backward(loss)                    # accelerator.backward(loss)
        del loss
        if (step + 1) % args.gradient_accumulation_steps == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


def main():
    args = TrainingArguments()
    model = LlavaLlamaForCausalLM()                  # from_pretrained(..., torch_dtype=torch.bfloat16).cuda()
    if args.gradient_checkpointing:
        model.gradient_checkpointing_enable()
    train(model, args)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
