"""Captioning a folder of product photos with llava-1.5-7b-hf on an AWS g5.xlarge (A10G, 24 GB), keeping the
whole output of every generate() call.

The real program (transformers 4.46, torch 2.4):

    processor = AutoProcessor.from_pretrained("llava-hf/llava-1.5-7b-hf")
    model = LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-7b-hf",
                                                          torch_dtype=torch.float16).to("cuda")
    outputs = []
    for paths in batched(sorted(glob("catalog/*.jpg")), 8):
        inputs = processor(images=[Image.open(p) for p in paths], text=[PROMPT] * 8,
                           return_tensors="pt", padding=True).to("cuda", torch.float16)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=128, do_sample=False,
                                 return_dict_in_generate=True, output_scores=True)
        outputs.append({"paths": paths, "out": out})          # decode + confidence filter at the end
    ...
    for o in outputs:
        scores = model.compute_transition_scores(o["out"].sequences, o["out"].scores, normalize_logits=True)

The user wants per-token confidences to flag doubtful captions, so they ask for the scores and keep each
batch's GenerateDecoderOnlyOutput to post-process at the end.  That object holds, besides the 8 x 728 token
ids, `scores` (128 float32 tensors of 8 x 32064) and `past_key_values`: the batch's whole DynamicCache.
Nothing is freed between batches; the job is inference only (inference_mode), so no autograd is involved.

Sizes: weights fp16 14.1 GB (Llama-2-7B body 32 layers x 405 MB = 12.95 GB, embeddings + lm_head 0.53 GB, CLIP
ViT-L/14-336 0.6 GB, projector 42 MB).  Per batch of 8: prompt 576 image tokens + 24 text tokens = 600, plus
128 new tokens = 728 positions; KV cache = 32 layers x 2 x 8 x 728 x 4096 x 2 B = 3.05 GB; scores = 128 x 8 x
32064 x 4 B = 131 MB; prefill transients ~0.3 GB.  A10G (23,028 MiB = 24.1 GB): 0.5 GB context + 14.1 GB
weights leave ~9.5 GB: one batch needs ~3.4 GB at its peak and keeps ~3.2 GB (17.3 GB allocated after batch
1, 20.5 GB after batch 2, ~1 GB more sitting in the allocator's cache from the DynamicCache's torch.cat churn),
so batch 3 (images 17-24 of 2,400) runs out of memory in its prefill, on a 101 MiB MLP activation.

What an expert says: memory climbs by a whole KV cache per batch because the results list keeps the
generate() outputs.  Keep only what the post-processing needs, on the CPU: out.sequences.cpu() (or the
decoded text) and the transition scores computed right away (model.compute_transition_scores(...).cpu()),
then drop `out`; do not keep past_key_values at all.  Wrong advice: a smaller batch, 4-bit quantization or a
bigger GPU only postpone the crash by a few batches; torch.inference_mode is already on; empty_cache /
expandable_segments cannot free tensors a list still references; fewer beams (there is one) or a smaller KV
cache for the running batch do not touch the earlier batches' caches.
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
HIDDEN, INTERMEDIATE, LAYERS, VOCAB = 4096, 11008, 32, 32064
VISION_HIDDEN, VISION_LAYERS, IMAGE_TOKENS = 1024, 24, 576
PROMPT = "USER: <image>\nWrite a one-sentence caption for this product photo for our web shop. ASSISTANT:"
PROMPT_TEXT_TOKENS = 24
BATCH_SIZE = 8
MAX_NEW_TOKENS = 128
N_IMAGES = 2400


def fp16_weight(numel):
    return nn.Parameter(torch.empty(numel, dtype=torch.float16, device=DEVICE), requires_grad=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, idx):
        super().__init__()
        self.layer_idx = idx
        self.q_proj, self.k_proj = fp16_weight(HIDDEN * HIDDEN), fp16_weight(HIDDEN * HIDDEN)
        self.v_proj, self.o_proj = fp16_weight(HIDDEN * HIDDEN), fp16_weight(HIDDEN * HIDDEN)
        self.gate_proj, self.up_proj = fp16_weight(HIDDEN * INTERMEDIATE), fp16_weight(HIDDEN * INTERMEDIATE)
        self.down_proj = fp16_weight(INTERMEDIATE * HIDDEN)
        self.input_layernorm, self.post_attention_layernorm = fp16_weight(HIDDEN), fp16_weight(HIDDEN)

    def forward(self, hidden_states, batch, new_tokens, past_key_values):
        n = batch * new_tokens
        past_key_values.update(self.layer_idx, batch, new_tokens)        # append this step's keys / values
        attn_out = torch.empty(n * HIDDEN, dtype=torch.float16, device=DEVICE)
        gate = torch.empty(n * INTERMEDIATE, dtype=torch.float16, device=DEVICE)
        up = torch.empty(n * INTERMEDIATE, dtype=torch.float16, device=DEVICE)
        del gate, up, attn_out
        return torch.empty(n * HIDDEN, dtype=torch.float16, device=DEVICE)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed_tokens = fp16_weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = LlamaDecoderLayer(i)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = fp16_weight(HIDDEN)
        self.lm_head = fp16_weight(HIDDEN * VOCAB)

    def forward(self, inputs_embeds, batch, new_tokens, past_key_values):
        hidden_states = inputs_embeds
        for layer in self.layers:
            hidden_states = layer(hidden_states, batch, new_tokens, past_key_values)
        # logits of the last position only (num_logits_to_keep=1 in generate)
        return torch.empty(batch * VOCAB, dtype=torch.float16, device=DEVICE)


class DynamicCache(object):
    """transformers.DynamicCache: per layer, keys and values of every position so far (torch.cat per step)."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []
        self.seen_tokens = 0

    def update(self, layer_idx, batch, new_tokens):
        if layer_idx == 0:
            self.seen_tokens += new_tokens
        n = batch * self.seen_tokens * HIDDEN
        k = torch.empty(n, dtype=torch.float16, device=DEVICE)        # torch.cat([self.key_cache[i], k], dim=-2)
        v = torch.empty(n, dtype=torch.float16, device=DEVICE)
        if layer_idx < len(self.key_cache):
            self.key_cache[layer_idx], self.value_cache[layer_idx] = k, v
        else:
            self.key_cache.append(k)
            self.value_cache.append(v)


class GenerateDecoderOnlyOutput(object):
    def __init__(self, sequences, scores, past_key_values):
        self.sequences = sequences
        self.scores = scores
        self.past_key_values = past_key_values


class LlavaForConditionalGeneration(nn.Module):
    def __init__(self):
        super().__init__()
        self.vision_tower = [fp16_weight(12 * VISION_HIDDEN * VISION_HIDDEN) for _ in range(VISION_LAYERS)]
        for i, w in enumerate(self.vision_tower):
            setattr(self, "vision_tower_layer_%d" % i, w)
        self.multi_modal_projector_1 = fp16_weight(VISION_HIDDEN * HIDDEN)
        self.multi_modal_projector_2 = fp16_weight(HIDDEN * HIDDEN)
        self.language_model = LlamaForCausalLM()

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None):
        return cls()

    def get_image_features(self, pixel_values, batch):
        x = torch.empty(batch * 577 * VISION_HIDDEN, dtype=torch.float16, device=DEVICE)
        for _ in self.vision_tower:
            mlp = torch.empty(batch * 577 * 4 * VISION_HIDDEN, dtype=torch.float16, device=DEVICE)
            x = torch.empty(batch * 577 * VISION_HIDDEN, dtype=torch.float16, device=DEVICE)
            del mlp
        return torch.empty(batch * IMAGE_TOKENS * HIDDEN, dtype=torch.float16, device=DEVICE)

    def forward(self, input_ids, pixel_values, batch, new_tokens, past_key_values):
        if pixel_values is not None:                                     # prefill: merge image features
            image_features = self.get_image_features(pixel_values, batch)
            inputs_embeds = torch.empty(batch * new_tokens * HIDDEN, dtype=torch.float16, device=DEVICE)
            del image_features
        else:
            inputs_embeds = torch.empty(batch * HIDDEN, dtype=torch.float16, device=DEVICE)
        return self.language_model(inputs_embeds, batch, new_tokens, past_key_values)

    def generate(self, input_ids, pixel_values, attention_mask, max_new_tokens=20, do_sample=False,
                 return_dict_in_generate=False, output_scores=False):
        """GenerationMixin._sample, greedy: prefill, then one token per step; the scores are the float32
        next-token logits; the cache is a DynamicCache handed back in the output."""
        batch, prompt_len = input_ids.shape
        past_key_values = DynamicCache()
        scores = ()
        logits = self(input_ids, pixel_values, batch, prompt_len, past_key_values)
        for step in range(max_new_tokens):
            next_token_logits = torch.empty(batch * VOCAB, dtype=torch.float32, device=DEVICE)   # .float()
            del logits
            if output_scores:
                scores += (next_token_logits,)
            if step + 1 < max_new_tokens:
                logits = self(None, None, batch, 1, past_key_values)
            else:
                logits = None
        sequences = torch.empty(batch * (prompt_len + max_new_tokens) * 8, dtype=torch.uint8, device=DEVICE)
        if return_dict_in_generate:
            return GenerateDecoderOnlyOutput(sequences, scores, past_key_values)
        return sequences


def batched(items, n):
    for i in range(0, len(items), n):
        yield items[i:i + n]


def process(paths):
    """processor(images=..., text=[PROMPT] * 8, return_tensors="pt", padding=True).to("cuda", torch.float16)"""
    n, seq = len(paths), IMAGE_TOKENS + PROMPT_TEXT_TOKENS
    input_ids = torch.empty(n * seq * 8, dtype=torch.uint8, device=DEVICE)          # int64 token ids
    input_ids.shape = (n, seq)
    return dict(input_ids=input_ids,
                pixel_values=torch.empty(n * 3 * 336 * 336, dtype=torch.float16, device=DEVICE),
                attention_mask=torch.empty(n * seq * 8, dtype=torch.uint8, device=DEVICE))


def main():
    model = LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-7b-hf", torch_dtype=torch.float16)
    model.eval()
    paths = ["catalog/sku_%05d.jpg" % i for i in range(N_IMAGES)]
    outputs = []
    for batch_paths in batched(paths, BATCH_SIZE):
        inputs = process(batch_paths)
        with torch.inference_mode():
            out = model.generate(**inputs, max_new_tokens=MAX_NEW_TOKENS, do_sample=False,
                                 return_dict_in_generate=True, output_scores=True)
        outputs.append({"paths": batch_paths, "out": out})
        del inputs
    return outputs


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
