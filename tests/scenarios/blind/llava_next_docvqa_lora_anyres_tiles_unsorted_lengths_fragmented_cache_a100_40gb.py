"""LoRA fine-tuning of LLaVA-NeXT (llava-v1.6-mistral-7b-hf) on a document-QA mix on one A100-SXM4-40GB.
Every page becomes 4-5 anyres tiles and a sample has one to three pages, so the padded batch length jumps
between ~2,500 and ~7,300 tokens from one step to the next. After 41 steps the caching allocator's cache is cut
into pieces: step 41 (padded length 7,081) dies asking for 2.05 GiB while 9.1 GiB sits reserved but unused.
Step 21 had the same padded length (7,082) and step 14 peaked higher, and both passed.

The real program (finetune_llava_docs.py; transformers 4.45, peft 0.13, torch 2.4):

    processor = LlavaNextProcessor.from_pretrained("llava-hf/llava-v1.6-mistral-7b-hf")
    model = LlavaNextForConditionalGeneration.from_pretrained(
        "llava-hf/llava-v1.6-mistral-7b-hf", torch_dtype=torch.bfloat16).to("cuda")
    model.vision_tower.requires_grad_(False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model, LoraConfig(r=64, lora_alpha=16, target_modules=[
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
        modules_to_save=["multi_modal_projector"]))
    ds = load_dataset("json", data_files="docmix_train.jsonl")  # DocVQA, ChartQA, InfographicVQA pages, plus
                                                                 # MP-DocVQA / SlideVQA samples of 2-3 pages
    loader = DataLoader(ds, batch_size=4, shuffle=True, collate_fn=collate)    # padding="longest"
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-4)
    for step, batch in enumerate(loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch.to("cuda")).loss
        (loss / 4).backward()
        if (step + 1) % 4 == 0:
            optimizer.step(); optimizer.zero_grad(set_to_none=True)

It is a hand-written loop modelled on the HF Trainer. It does not group by length (no group_by_length or
group_by_modality_length) and does not set PYTORCH_CUDA_ALLOC_CONF. transformers 4.45's Mistral still
upcasts the logits (`logits = logits.float()`), and LlavaNext builds the shifted, padding-free
shift_logits from them in float32.

Sizes. The card is an A100-SXM4-40GB: 40,536 MiB, of which about 512 MiB is the CUDA context (39.1 GiB usable).
  * Frozen bf16 weights: Mistral-7B has 32 layers, hidden 4096, MLP 14336, GQA k/v 1024 and vocab 32064, so
    its linears come to 14.0 GB and embed + lm_head to 263 MB each. CLIP ViT-L/14-336 is 0.61 GB. In total
    14.06 GiB.
  * Trainable: LoRA r=64 on all seven projections is 5.24 M params a layer x 32 = 168 M, in fp32 (peft
    casts adapters to fp32), plus the projector (21 M, bf16). That is 0.66 GiB, the gradients another
    0.66 GiB, and AdamW's two states 1.33 GiB. So about 16.7 GiB stays resident, 17.2 GiB with the context.
  * anyres: a page becomes a 336 px base tile plus a 2x2 (or 1x3) grid of 336 px tiles, at 576 patches a
    tile. After unpadding, a page is 1,650-2,450 image tokens: a US-letter scan is 2,448, a chart 2,340, a
    tall infographic 1,656. With the prompt and answer (60-700 tokens), a one-page sample is 2,000-3,000
    tokens and a three-page one up to ~7,900. Batch 4 with padding="longest" gives padded lengths over the
    first 42 steps of 2547, 4243, 3920, 6744, 2616, 4752, 6563, 6410, 6047, 4410, 4516, 4619, 2889, 5096,
    6944, ... 7082, ... 7328, ... 7041, ... 6892, 7081. Every step asks for different block sizes.
  * The step that fails is step 41: one 3-page sample of 7,081 tokens, a 2-page one and two single pages.
    That is 4 x 7,081 = 28,324 padded positions, 17,133 real tokens and 33 tiles.
      - 33 checkpointed hidden states, 28,324 x 4096 x 2 B = 232 MB each: 7.1 GiB.
      - The projector's saved activations: 3 x 33 x 576 x 4096 x 2 B = 0.44 GiB.
      - Transient: the CLIP hidden states (output_hidden_states=True: 25 x 33 x 577 x 1024 x 2 B = 0.9 GiB).
      - Transient, inside each layer: q and the attention output at 232 MB each, and gate/up/act at 812 MB
        each.
      - The lm_head logits: 1.69 GiB in bf16, then logits.float() at 3.38 GiB.
      - shift_logits: 17,129 x 32,064 x 4 B = 2,095 MiB. log_softmax then needs the same again.
    All this needs about 29.8 + 2.05 + 2.05 = 33.9 GiB, 5 GiB under the card.

What happens. Steps 0-40 run. Step 14 (padded length 6,944, 20,755 real tokens, 42 tiles) peaked at 34.7 GiB.
Steps 21 (7,082) and 26 (7,328) passed at about 33.3-33.7 GiB. Each step carves the cached segments into
blocks of its own sizes. The 33 checkpoints and the projector's saved tensors live until the backward, and each
lands best-fit in the smallest cached block big enough for it. So by the time the lm_head runs, most segments
hold a live block or two, with holes around them whose sizes fit some earlier step. At step 41 the
shift_logits copy needs 2,095 MiB in one piece. PyTorch's retry finds no wholly free segment to give back,
because every segment holds some live block, and the driver has only 158 MiB free.
torch.cuda.OutOfMemoryError: "Tried to allocate 2.05 GiB. GPU 0 has a total capacity of 39.59 GiB of which
158 MiB is free ... 29.79 GiB is allocated by PyTorch, and 9.14 GiB is reserved by PyTorch but unallocated."

What an expert says first: this is fragmentation, not a model that does not fit. Allocated plus the request
is 31.8 GiB on a 39.1 GiB card, a batch of the same padded length already ran, and the cache holds 4.5x the
request in free pieces. Set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, so segments grow in place
instead of being cut into fixed pieces. Then group samples of similar length (group_by_modality_length /
group_by_length, or bucket by page and tile count): consecutive steps then ask for similar sizes, and the
4 x 7,081 padding for 17,133 real tokens goes away. Capping the pages per sample or the tiles per page, or
batch 2 x accumulation 8, also shrinks the swings.

Wrong advice:
  * A bigger card, 4-bit quantization, ZeRO/FSDP or CPU offload: the step fits, so nothing has to shrink.
  * Gradient checkpointing or bf16: both are already on.
  * torch.cuda.empty_cache() in the loop: PyTorch's own retry already releases wholly free segments (here
    there were none), and the holes are inside segments that hold live tensors.
  * inference_mode: this is training.
  * Hunting other processes or leaks: there are none, and the resident state is the same every step.
"""
import random

import torch
from torch import nn
import torch.nn.functional as F

import scen_truth

MODEL_ID = "llava-hf/llava-v1.6-mistral-7b-hf"
HIDDEN, INTERMEDIATE, KV_DIM, VOCAB, NUM_LAYERS = 4096, 14336, 1024, 32064, 32
VISION_LAYERS, VISION_HIDDEN, VISION_PARAMS_PER_LAYER = 24, 1024, 12_596_224
TILE, PATCHES_PER_TILE = 336, 577                     # CLIP ViT-L/14 at 336 px: 24 x 24 patches + CLS
IMAGE_GRID_PINPOINTS = [(336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)]

LORA_R = 64
PER_DEVICE_BATCH = 4
GRAD_ACCUM = 4
LEARNING_RATE = 2e-4
SEED = 60


# ---------------------------------------------------------------- processor (LlavaNextProcessor's arithmetic)
def select_best_resolution(orig_h, orig_w):
    best, best_eff, best_waste = None, 0, float("inf")
    for h, w in IMAGE_GRID_PINPOINTS:
        s = min(w / orig_w, h / orig_h)
        eff = min(int(orig_w * s) * int(orig_h * s), orig_w * orig_h)
        waste = h * w - eff
        if eff > best_eff or (eff == best_eff and waste < best_waste):
            best, best_eff, best_waste = (h, w), eff, waste
    return best


def image_num_patches(orig_h, orig_w):
    h, w = select_best_resolution(orig_h, orig_w)
    return 1 + (h // TILE) * (w // TILE)


def num_image_tokens(orig_h, orig_w):
    """LlavaNextProcessor._get_number_of_features: base tile + unpadded grid + one newline per row."""
    bh, bw = select_best_resolution(orig_h, orig_w)
    cur_h, cur_w = 24 * (bh // TILE), 24 * (bw // TILE)
    if orig_w / orig_h > cur_w / cur_h:
        new_h = int(round(orig_h * (cur_w / orig_w), 7))
        cur_h -= 2 * ((cur_h - new_h) // 2)
    else:
        new_w = int(round(orig_w * (cur_h / orig_h), 7))
        cur_w -= 2 * ((cur_w - new_w) // 2)
    return cur_h * cur_w + cur_h + 576


# ---------------------------------------------------------------- data
PAGE_SIZES = {                      # (height, width) of the page images in docmix_train.jsonl
    "docvqa_letter": (2200, 1700), "docvqa_a4": (3508, 2480), "docvqa_small": (1650, 1275),
    "infographic_tall": (5000, 1000), "infographic": (4200, 1080), "chart": (768, 1024),
    "chart_small": (500, 800), "slide": (1080, 1920), "slide_small": (600, 1000), "screenshot": (900, 1600),
}


def load_docmix(n=24000, seed=7):
    """docmix_train.jsonl: per sample its page images and the token count of its prompt + answer.  70% are
    one page (DocVQA, ChartQA, InfographicVQA), 30% two or three pages (MP-DocVQA, SlideVQA)."""
    rng = random.Random(seed)
    kinds = sorted(PAGE_SIZES)
    samples = []
    for _ in range(n):
        pages = 1 if rng.random() < 0.7 else rng.choice((2, 2, 3))
        images = [PAGE_SIZES[rng.choice(kinds)] for _ in range(pages)]
        samples.append({"images": images, "text_tokens": rng.randint(60, 700)})
    return samples


def collate(samples):
    """processor(text=prompts, images=pages, padding="longest", return_tensors="pt")."""
    lengths = [sum(num_image_tokens(h, w) for h, w in s["images"]) + s["text_tokens"] for s in samples]
    images = [hw for s in samples for hw in s["images"]]
    return {"seq_len": max(lengths), "num_tokens": sum(lengths), "num_images": len(images),
            "num_tiles": sum(image_num_patches(h, w) for h, w in images),
            "num_image_tokens": sum(num_image_tokens(h, w) for h, w in images)}


class Batch(object):
    def __init__(self, meta):
        self.meta = meta
        n = PER_DEVICE_BATCH * meta["seq_len"]
        self.input_ids = torch.empty(n * 8)                 # int64
        self.attention_mask = torch.empty(n * 8)
        self.labels = torch.empty(n * 8)
        # pixel_values (num_images, 5, 3, 336, 336) float32, padded to 5 tiles an image by the processor
        self.pixel_values = torch.empty(meta["num_images"] * 5 * 3 * TILE * TILE, dtype=torch.float32)


# ---------------------------------------------------------------- model (transformers + peft, as loaded)
class LoraLinear(nn.Module):
    """peft.tuners.lora.Linear: frozen bf16 base weight, fp32 lora_A / lora_B."""

    def __init__(self, in_features, out_features, r=LORA_R):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.bfloat16),
                                   requires_grad=False)
        self.lora_A = nn.Parameter(torch.empty(r * in_features, dtype=torch.float32))
        self.lora_B = nn.Parameter(torch.empty(out_features * r, dtype=torch.float32))

    def forward(self, x, num_tokens):
        return torch.empty(num_tokens * self.out_features, dtype=torch.bfloat16)


class MistralSdpaAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = LoraLinear(HIDDEN, HIDDEN)
        self.k_proj = LoraLinear(HIDDEN, KV_DIM)
        self.v_proj = LoraLinear(HIDDEN, KV_DIM)
        self.o_proj = LoraLinear(HIDDEN, HIDDEN)

    def forward(self, hidden_states, num_tokens):
        query_states = self.q_proj(hidden_states, num_tokens)
        key_states = self.k_proj(hidden_states, num_tokens)
        value_states = self.v_proj(hidden_states, num_tokens)
        attn_output = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)    # scaled_dot_product_attention
        del query_states, key_states, value_states
        return self.o_proj(attn_output, num_tokens)


class MistralMLP(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.gate_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.up_proj = LoraLinear(HIDDEN, INTERMEDIATE)
        self.down_proj = LoraLinear(INTERMEDIATE, HIDDEN)

    def forward(self, x, num_tokens):
        gate = self.gate_proj(x, num_tokens)
        up = self.up_proj(x, num_tokens)
        act = torch.empty(num_tokens * INTERMEDIATE, dtype=torch.bfloat16)       # act_fn(gate) * up
        del gate, up
        return self.down_proj(act, num_tokens)


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.self_attn = MistralSdpaAttention()
        self.mlp = MistralMLP()

    def forward(self, hidden_states, num_tokens):
        # under gradient checkpointing only the layer's input is kept; what is made in here is dropped
        normed = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)         # input_layernorm
        attn_output = self.self_attn(normed, num_tokens)
        normed = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)         # residual add + post-attn norm
        del attn_output
        out = self.mlp(normed, num_tokens)
        del normed
        out._saved = hidden_states                                             # the checkpoint
        return out


class MistralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.layers = []
        for i in range(NUM_LAYERS):
            layer = MistralDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.lm_head = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16), requires_grad=False)
        self.gradient_checkpointing = False

    def forward(self, inputs_embeds, num_tokens):
        hidden_states = inputs_embeds
        for decoder_layer in self.layers:
            hidden_states = decoder_layer(hidden_states, num_tokens)
        normed = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)
        normed._saved = hidden_states
        logits = torch.empty(num_tokens * VOCAB, dtype=torch.bfloat16)            # self.lm_head(hidden_states)
        logits._saved = normed
        logits_fp32 = scen_truth.torch_empty(num_tokens * VOCAB * 4)             # logits = logits.float()
        logits_fp32._saved = logits
        return logits_fp32


class CLIPVisionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embedding = nn.Parameter(torch.empty(1_181_952, dtype=torch.bfloat16), requires_grad=False)
        for i in range(VISION_LAYERS):
            setattr(self, "encoder_layers_%d" % i,
                    nn.Parameter(torch.empty(VISION_PARAMS_PER_LAYER, dtype=torch.bfloat16), requires_grad=False))

    def forward(self, pixel_values, num_tiles, output_hidden_states=True):
        pixel_values = torch.empty(num_tiles * 3 * TILE * TILE, dtype=torch.bfloat16)   # .to(self.dtype)
        hidden_states = [torch.empty(num_tiles * PATCHES_PER_TILE * VISION_HIDDEN, dtype=torch.bfloat16)]
        for _ in range(VISION_LAYERS):
            hidden_states.append(torch.empty(num_tiles * PATCHES_PER_TILE * VISION_HIDDEN, dtype=torch.bfloat16))
        return hidden_states


class LlavaNextMultiModalProjector(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.linear_1 = nn.Parameter(torch.empty(VISION_HIDDEN * HIDDEN, dtype=torch.bfloat16))
        self.linear_2 = nn.Parameter(torch.empty(HIDDEN * HIDDEN, dtype=torch.bfloat16))

    def forward(self, image_features, num_tiles):
        w1, w2 = self.linear_1, self.linear_2
        n = num_tiles * (PATCHES_PER_TILE - 1) * HIDDEN
        hidden_states = torch.empty(n, dtype=torch.bfloat16)
        hidden_states._saved = image_features
        act = torch.empty(n, dtype=torch.bfloat16)                                  # GELU
        act._saved = hidden_states
        out = torch.empty(n, dtype=torch.bfloat16)
        out._saved = act
        return out


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class LlavaNextForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.vision_tower = CLIPVisionModel()
        self.multi_modal_projector = LlavaNextMultiModalProjector()
        self.image_newline = nn.Parameter(torch.empty(HIDDEN, dtype=torch.bfloat16))
        self.language_model = MistralForCausalLM()

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs=None):
        self.language_model.gradient_checkpointing = True

    def get_image_features(self, pixel_values, num_tiles):
        hidden_states = self.vision_tower(pixel_values, num_tiles, output_hidden_states=True)
        selected_image_feature = hidden_states[-2]                                   # vision_feature_layer=-2
        return self.multi_modal_projector(selected_image_feature, num_tiles)

    def forward(self, input_ids, attention_mask, pixel_values, labels, meta):
        num_tokens = PER_DEVICE_BATCH * meta["seq_len"]
        image_features = self.get_image_features(pixel_values, meta["num_tiles"])
        packed = torch.empty(meta["num_image_tokens"] * HIDDEN, dtype=torch.bfloat16)   # pack_image_features
        packed._saved = image_features
        del image_features
        inputs_embeds = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)          # embed_tokens(input_ids)
        inputs_embeds = torch.empty(num_tokens * HIDDEN, dtype=torch.bfloat16)          # .masked_scatter(...)
        inputs_embeds._saved = packed
        del packed
        logits = self.language_model(inputs_embeds, num_tokens)
        del inputs_embeds
        # shift_logits = logits[..., :-1, :][shift_attention_mask != 0].contiguous()   (float32, padding dropped)
        shift_logits = scen_truth.torch_empty((meta["num_tokens"] - PER_DEVICE_BATCH) * VOCAB * 4)
        shift_logits._saved = logits
        loss = F.cross_entropy(shift_logits, labels)
        return CausalLMOutput(loss, logits)


def get_peft_model(model):
    for p in model.multi_modal_projector.parameters():     # modules_to_save
        p.requires_grad_(True)
    return model


# ---------------------------------------------------------------- training
def training_step(model, batch):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        outputs = model(batch.input_ids, batch.attention_mask, batch.pixel_values, batch.labels, batch.meta)
    loss = outputs.loss
    del outputs
    scen_truth.backward(loss)                  # (loss / GRAD_ACCUM).backward()
    return loss.detach()


def train():
    model = LlavaNextForConditionalGeneration.from_pretrained(MODEL_ID, torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model = get_peft_model(model)
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=LEARNING_RATE, weight_decay=0.0)

    train_ds = load_docmix()
    order = list(range(len(train_ds)))
    random.Random(SEED).shuffle(order)                       # DataLoader(shuffle=True), no length grouping
    for step in range(len(order) // PER_DEVICE_BATCH):
        idx = order[step * PER_DEVICE_BATCH:(step + 1) * PER_DEVICE_BATCH]
        batch = Batch(collate([train_ds[i] for i in idx]))
        loss = training_step(model, batch)
        if (step + 1) % GRAD_ACCUM == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)


if __name__ == "__main__":
    try:
        train()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
