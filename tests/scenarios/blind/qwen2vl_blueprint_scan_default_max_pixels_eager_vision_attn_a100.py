"""read_blueprints.py -- an engineering firm extracts room labels and dimensions from scanned
blueprints (8000 x 6000 px TIFFs) with Qwen2-VL-7B-Instruct in bf16 (15 GiB) on one A100 80 GB.
flash-attn does not build on their image, so the author loads the model with
attn_implementation="eager", and keeps the processor's default resolution limits:

    model = Qwen2VLForConditionalGeneration.from_pretrained(
        "Qwen/Qwen2-VL-7B-Instruct", torch_dtype=torch.bfloat16, attn_implementation="eager").cuda()
    processor = AutoProcessor.from_pretrained("Qwen/Qwen2-VL-7B-Instruct")   # max_pixels=12845056
    inputs = processor(text=[prompt], images=[scan], return_tensors="pt").to("cuda")
    out = model.generate(**inputs, max_new_tokens=512)        # one image, batch of 1

The processor resizes the scan to the 12.8-megapixel default cap: 294 x 220 patches of 14 px = 64,680
patches in one sequence for the vision encoder, whose eager attention makes each block's score
matrix whole (16 heads x 64,680^2 in bf16, 125 GiB).  The first vision block asks for it and fails;
the language model has not run.  A single input -- one image -- is the peak; nothing accumulated.

An expert: bound the image's resolution (processor max_pixels, e.g. 1280*28*28, or resize the
scan), i.e. far fewer visual tokens, and/or use an attention that never makes the score matrix
whole (sdpa / flash attention) in the vision tower.  Not a smaller batch (it is one image), not
quantizing or offloading the weights (15 GiB of 80), not inference_mode (generate already runs
without autograd), not gradient checkpointing, fewer beams or a smaller KV cache, not
expandable_segments or empty_cache.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

PATCH = 14
MAX_PIXELS = 12845056


def eager_attention_forward(module, query, key, value, seq):
    """as transformers' eager attention: the whole score matrix, softmax, then the weighted sum."""
    attn_weights = torch.empty(module.num_heads * seq * seq, dtype=torch.bfloat16, device="cuda")
    attn_weights._saved = query
    return torch.empty(value.nbytes, device="cuda")


class VisionAttention(nn.Module):
    num_heads = 16

    def __init__(self):
        nn.Module.__init__(self)
        self.qkv = nn.Parameter(torch.empty(4915200, dtype=torch.bfloat16, device="cuda"), requires_grad=False)
        self.proj = nn.Parameter(torch.empty(1638400, dtype=torch.bfloat16, device="cuda"), requires_grad=False)

    def forward(self, hidden_states, seq):
        q = torch.empty(hidden_states.nbytes, device="cuda")
        k = torch.empty(hidden_states.nbytes, device="cuda")
        v = torch.empty(hidden_states.nbytes, device="cuda")
        return eager_attention_forward(self, q, k, v, seq)


class VisionBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn = VisionAttention()
        self.mlp = nn.Parameter(torch.empty(26214400, dtype=torch.bfloat16, device="cuda"), requires_grad=False)

    def forward(self, x, seq):
        return self.attn(x, seq)


class Qwen2VisionTransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(32):
            setattr(self, "blocks_%d" % i, VisionBlock())

    def forward(self, pixel_values, seq):
        x = torch.empty(seq * 1280 * 2, device="cuda")             # patch embeddings, bf16
        for i in range(32):
            x = getattr(self, "blocks_%d" % i)(x, seq)
        return x


class DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(233046016, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class Qwen2VLForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.visual = Qwen2VisionTransformer()
        self.model = nn.Module()
        for i in range(28):
            setattr(self.model, "layers_%d" % i, DecoderLayer())
        self.lm_head = nn.Parameter(torch.empty(544997376, dtype=torch.bfloat16, device="cuda"), requires_grad=False)

    @classmethod
    def from_pretrained(cls, name, torch_dtype=None, attn_implementation=None):
        m = cls()
        m.eval()
        return m

    def generate(self, pixel_values=None, grid=None, input_ids=None, max_new_tokens=512, num_beams=1):
        with torch.no_grad():
            seq = grid[0] * grid[1]
            image_embeds = self.visual(pixel_values, seq)
            return image_embeds


def smart_resize(width, height, max_pixels=MAX_PIXELS):
    scale = min(1.0, (max_pixels / float(width * height)) ** 0.5)
    return int(width * scale) // 28 * 28, int(height * scale) // 28 * 28


def main():
    model = Qwen2VLForConditionalGeneration.from_pretrained(
        "Qwen/Qwen2-VL-7B-Instruct", torch_dtype=torch.bfloat16, attn_implementation="eager")
    batch_size = 1
    for scan in ["blueprint_0001.tif"]:
        w, h = smart_resize(8000, 6000)
        grid = (w // PATCH, h // PATCH)
        pixel_values = torch.empty(batch_size * grid[0] * grid[1] * 1176 * 4, device="cuda")   # float32 patches
        input_ids = torch.empty(batch_size * (grid[0] * grid[1] // 4 + 64) * 8, device="cuda")
        out = model.generate(pixel_values=pixel_values, grid=grid, input_ids=input_ids, max_new_tokens=512)
    return out


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
