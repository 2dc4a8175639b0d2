"""video_qa.py -- offline question answering over an e-learning catalogue's videos with Qwen2-VL-7B-Instruct
(8.3B parameters in bf16, 15.5 GiB, flash_attention_2) on one 80 GB H100, one video at a time:

    model = Qwen2VLForConditionalGeneration.from_pretrained(name, torch_dtype=torch.bfloat16,
                                                            attn_implementation="flash_attention_2").cuda()
    for item in DataLoader(catalogue, batch_size=1):
        messages = [{"role": "user", "content": [
            {"type": "video", "video": item["path"], "fps": 2.0, "max_pixels": 360 * 420},
            {"type": "text", "text": QUESTION}]}]
        inputs = processor(text=..., videos=video_inputs, return_tensors="pt").to("cuda")
        out = model.generate(**inputs, max_new_tokens=128)

The catalogue is mostly 20-90 s trailer clips (a few thousand visual tokens each); it ran for hours.  Then
came a 48-minute lecture recording: at fps 2 that is 5,760 frames, 2,880 temporal patches of 750 patches, 2.16M
patches for the vision tower and 540k visual tokens for the language model.  pixel_values alone are 9.5 GiB
(fp32, kept by `inputs` for the whole call), their bf16 cast 4.7 GiB, the text model's inputs_embeds for 540k
tokens 3.6 GiB (made before the vision tower runs), the tower's hidden states 5.3 GiB each.  In the first
vision block the MLP's fc1 output (2.16M x 5120, 21 GiB) fits; QuickGELU's first temporary, another 21 GiB,
does not (had it fitted, the language model's prefill over 540k tokens would have needed 19 GiB per MLP
projection next).

An expert: one input is the whole story -- cap what one video may become: sample fewer frames for long videos
(fps 0.5 or a max frame count, `nframes`), lower max_pixels, or cut the lecture into segments and ask per
segment (chunked processing).  Not a smaller batch (it is 1), not quantization (weights are 15.5 GiB of 80),
not inference_mode (generate runs under no_grad), not the allocator's cache, not flash attention (on already).
"""
import sys

import torch

import scen_truth

GiB = 1 << 30
scen_truth.note_every_empty(torch)

V_HIDDEN, V_MLP, V_DEPTH = 1280, 5120, 32
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 3584, 18944, 28, 152064, 512


def bf16(n_elems):
    return torch.empty(n_elems, dtype=torch.bfloat16, device="cuda")


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.n_out = n_out
        self.weight = torch.nn.Parameter(bf16(n_in * n_out))

    def forward(self, x, tokens):
        return bf16(tokens * self.n_out)


class VisionBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = Linear(V_HIDDEN, 3 * V_HIDDEN)
        self.proj = Linear(V_HIDDEN, V_HIDDEN)
        self.fc1 = Linear(V_HIDDEN, V_MLP)
        self.fc2 = Linear(V_MLP, V_HIDDEN)

    def forward(self, hidden, patches):
        normed = bf16(patches * V_HIDDEN)
        qkv = self.qkv(normed, patches)
        attn = bf16(patches * V_HIDDEN)           # flash-attn varlen, one sequence per temporal patch
        del qkv, normed
        hidden = self.proj(attn, patches)        # + residual
        del attn
        normed = bf16(patches * V_HIDDEN)
        x = self.fc1(normed, patches)
        del normed
        x = bf16(patches * V_MLP) if x is not None else None      # QuickGELU: x * sigmoid(1.702 * x)
        out = self.fc2(x, patches)
        del x
        return out


class Qwen2VisionTransformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.patch_embed = Linear(1176, V_HIDDEN)
        self.blocks = []
        for i in range(V_DEPTH):
            b = VisionBlock()
            setattr(self, "block_%d" % i, b)
            self.blocks.append(b)
        self.merger = Linear(4 * V_HIDDEN, HIDDEN)

    def forward(self, pixel_values, patches):
        hidden = self.patch_embed(pixel_values, patches)
        for blk in self.blocks:
            hidden = blk(hidden, patches)
        return self.merger(hidden, patches // 4)


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = Linear(HIDDEN, HIDDEN)
        self.k_proj = Linear(HIDDEN, KV_DIM)
        self.v_proj = Linear(HIDDEN, KV_DIM)
        self.o_proj = Linear(HIDDEN, HIDDEN)
        self.gate_proj = Linear(HIDDEN, INTER)
        self.up_proj = Linear(HIDDEN, INTER)
        self.down_proj = Linear(INTER, HIDDEN)

    def forward(self, hidden, tokens, past_key_values):
        normed = bf16(tokens * HIDDEN)
        q = self.q_proj(normed, tokens)
        past_key_values.append((self.k_proj(normed, tokens), self.v_proj(normed, tokens)))
        attn = bf16(tokens * HIDDEN)
        del q
        h = self.o_proj(attn, tokens)            # + residual
        del attn, normed
        normed = bf16(tokens * HIDDEN)
        gate = self.gate_proj(normed, tokens)
        up = self.up_proj(normed, tokens)
        act = bf16(tokens * INTER)               # SiLU(gate), then * up
        down = self.down_proj(act, tokens)
        del gate, up, act
        return down


class Qwen2VLForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.visual = Qwen2VisionTransformer()
        self.embed_tokens = torch.nn.Parameter(bf16(VOCAB * HIDDEN))
        self.layers = []
        for i in range(LAYERS):
            layer = Qwen2DecoderLayer()
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.lm_head = Linear(HIDDEN, VOCAB)

    def forward(self, input_ids, pixel_values_videos, patches, text_tokens, past_key_values):
        tokens = text_tokens + patches // 4
        inputs_embeds = bf16(tokens * HIDDEN)
        pixel_values_videos = bf16(patches * 1176)                # .type(self.visual.dtype)
        video_embeds = self.visual(pixel_values_videos, patches)
        del video_embeds                         # scattered into inputs_embeds
        hidden = inputs_embeds
        for layer in self.layers:
            hidden = layer(hidden, tokens, past_key_values)
        return self.lm_head(hidden, 1)

    def generate(self, input_ids, pixel_values_videos, patches, text_tokens, max_new_tokens=128):
        with torch.no_grad():
            past_key_values = []
            return self(input_ids, pixel_values_videos, patches, text_tokens, past_key_values)


def processor(frames, patches_per_frame, text_tokens):
    """The processor's output moved to the GPU: pixel values as float32 (temporal patch 2 x 14 x 14 x 3)."""
    patches = frames // 2 * patches_per_frame
    return {"input_ids": torch.empty(text_tokens * 8, dtype=torch.uint8, device="cuda"),
            "pixel_values_videos": torch.empty(patches * 1176, dtype=torch.float32, device="cuda"),
            "patches": patches, "text_tokens": text_tokens}


def main():
    model = Qwen2VLForConditionalGeneration()
    model.eval()
    torch._C._cuda_attach_out_of_memory_observer(
        lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))   # truth mark (test scaffolding)
    batch_size = 1
    catalogue = [("trailer_0412.mp4", 48), ("trailer_0413.mp4", 176), ("course_intro_88.mp4", 62),
                 ("lecture_linear_algebra_week3.mp4", 48 * 60)]
    for path, seconds in catalogue:
        frames = int(seconds * 2.0)                          # fps 2.0
        inputs = processor(frames, 750, 96)                  # max_pixels 360*420: 30 x 25 patches per frame
        out = model.generate(inputs["input_ids"], inputs["pixel_values_videos"], inputs["patches"],
                             inputs["text_tokens"], max_new_tokens=128)
        print(path, batch_size, out is not None)
        del inputs, out


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer, at the failure
sys.exit(0)
