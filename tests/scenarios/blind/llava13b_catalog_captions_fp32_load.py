"""caption_catalog.py -- an e-commerce team captions its product photos with a LLaVA-1.5-13B-style
vision-language model (CLIP ViT-L/336 vision tower, a two-layer projector, a 13B Llama decoder) on
one 48 GiB workstation card (RTX 6000 Ada class).  The checkpoint on the hub is bf16 (26 GB); the
script was adapted from a 7B example that ran on an 80 GiB card and never passed a dtype:

    processor = AutoProcessor.from_pretrained(path)
    model = LlavaForConditionalGeneration.from_pretrained(path, device_map="cuda:0")   # no torch_dtype
    model.eval()
    for batch in loader:                                   # 8 images + prompt
        with torch.inference_mode():
            out = model.generate(**processor(images=batch, text=prompts, return_tensors="pt").to("cuda"),
                                 max_new_tokens=96)

Without torch_dtype, transformers materialises every weight in float32: 13.4B parameters x 4 bytes
= 49.6 GiB, more than the card; the load fails in decoder layer 39 of 40.  In bf16 the model is
24.8 GiB and captioning needs ~2 GiB more: it fits with ~20 GiB to spare.  Inference only, nothing
else on the card, nothing cached, no leak.  An expert: from_pretrained(..., torch_dtype=torch.bfloat16)
(or torch_dtype="auto"); 8/4-bit quantization or CPU offload are not needed, a bigger card neither.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
HIDDEN, FFN, LAYERS, VOCAB = 5120, 13824, 40, 32000


def weight(numel):
    """One float32 parameter (no torch_dtype: the default dtype), materialised on the GPU."""
    return torch.nn.Parameter(torch.empty(numel * 4, device="cuda"))


class CLIPVisionTower(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(24):                                   # ViT-L/14 at 336 px: 12.6M params a layer
            setattr(self, "layer%d_attn" % i, weight(1024 * 1024 * 4))
            setattr(self, "layer%d_mlp" % i, weight(1024 * 4096 * 2))
        self.patch_embed = weight(3 * 14 * 14 * 1024 + 577 * 1024)


class Projector(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.linear_1 = weight(1024 * HIDDEN)
        self.linear_2 = weight(HIDDEN * HIDDEN)


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for n in ("q_proj", "k_proj", "v_proj", "o_proj"):
            setattr(self, n, weight(HIDDEN * HIDDEN))
        for n in ("gate_proj", "up_proj", "down_proj"):
            setattr(self, n, weight(HIDDEN * FFN))
        self.input_layernorm = weight(HIDDEN)
        self.post_attention_layernorm = weight(HIDDEN)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB * HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layers_%d" % i, LlamaDecoderLayer())
        self.norm = weight(HIDDEN)
        self.lm_head = weight(VOCAB * HIDDEN)


class LlavaForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.vision_tower = CLIPVisionTower()
        self.multi_modal_projector = Projector()
        self.language_model = LlamaForCausalLM()

    @classmethod
    def from_pretrained(cls, path, device_map=None, torch_dtype=None):
        """Builds the architecture with the weights on device_map's device, in torch_dtype or,
        without one, in the default dtype (float32), then copies the checkpoint's tensors in."""
        if torch_dtype is not None:
            prev = torch.get_default_dtype()
            torch.set_default_dtype(torch_dtype)
        try:
            return cls()
        finally:
            if torch_dtype is not None:
                torch.set_default_dtype(prev)


def main():
    model = LlavaForConditionalGeneration.from_pretrained("llava-hf/llava-1.5-13b-hf", device_map="cuda:0")
    model.eval()
    for batch in range(2000):
        with torch.inference_mode():
            pixel_values = torch.empty(8 * 3 * 336 * 336 * 4, device="cuda")
            kv = torch.empty(8 * 700 * LAYERS * 2 * HIDDEN * 4, device="cuda")
            del pixel_values, kv


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
