"""sft_vl.py -- LoRA fine-tuning of Qwen2-VL-7B-Instruct (bf16, 15.5 GiB, frozen) on an internal
document-QA set, DDP on one node of 4x L40S (48 GB, 45 GiB usable), `torchrun --nproc_per_node 4`,
per_device_train_batch_size=1, gradient accumulation 8, gradient checkpointing on, the vision tower's
attention left at the default eager implementation.  The processor was built with
`AutoProcessor.from_pretrained(name)`, without min_pixels/max_pixels, so an image's number of visual
tokens follows its resolution.  Most images are phone photos and screenshots (about 1280x960: 6k
patches of 14x14, 1.1 GiB of attention scores per vision layer) and the job ran 400 steps.  Then rank
0's sampler hands it one scanned poster, 3000x2000 pixels: 30.4k patches, and the vision tower's
first attention layer asks for its score matrix, 16 heads x 30.4k x 30.4k bf16 = 27.5 GiB, with about
26 GiB free.  One image is the peak: the batch is already 1, and the same step with a phone photo needs
a twentieth of that.

An expert: bound the image's size -- set max_pixels on the processor (e.g. 1280*28*28) or resize
images beyond a limit in the collator, so that no single input can make tens of thousands of visual
tokens; flash/SDPA attention in the vision tower would also stop the quadratic matrix.  Not a smaller
batch (it is 1), not gradient checkpointing (the score matrix is made anyway), not the cache, not a
leak (memory was flat for 400 steps), not a bigger GPU.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

VISION_HEADS = 16
VISION_LAYERS = 32


def eager_attention_forward(module, query, key, value, num_patches):
    """The vision tower's eager attention: softmax(q k^T / sqrt(d)) v with the full score matrix."""
    attn_weights = torch.empty(VISION_HEADS * num_patches * num_patches * 2, device="cuda")   # bf16 scores
    attn_weights._saved = query
    out = torch.empty(query.nbytes, device="cuda")
    out._saved = attn_weights if torch.is_grad_enabled() else None
    del attn_weights          # with checkpointing the block's scores are not kept once it is done
    return out


class VisionBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(40 * MiB, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)

    def forward(self, hidden, num_patches):
        qkv = torch.empty(3 * num_patches * 1280 * 2, device="cuda")
        out = eager_attention_forward(self, qkv, qkv, qkv, num_patches)
        out._saved = None
        return out


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(233 * MiB, dtype=torch.bfloat16, device="cuda"),
                                         requires_grad=False)
        self.lora_A = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(2 * MiB, device="cuda"))


class Qwen2VLForConditionalGeneration(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.visual = [VisionBlock() for _ in range(VISION_LAYERS)]
        for i, b in enumerate(self.visual):
            setattr(self, "visual_block%d" % i, b)
        self.layers = [DecoderLayer() for _ in range(28)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.embed_and_head = torch.nn.Parameter(torch.empty(1040 * MiB, dtype=torch.bfloat16, device="cuda"),
                                                 requires_grad=False)

    def forward(self, input_ids, pixel_values, num_patches):
        h = pixel_values
        for block in self.visual:
            nxt = block(h, num_patches)                  # checkpointed: one hidden state per block kept
            nxt._saved = h
            h = nxt
        tokens = num_patches // 4 + 300                  # merged 2x2 patches and the question's text
        x = torch.empty(tokens * 3584 * 2, device="cuda")
        x._saved = h
        for layer in self.layers:
            nxt = torch.empty(tokens * 3584 * 2, device="cuda")
            nxt._saved = x
            nxt._params = (layer.lora_A, layer.lora_B)
            x = nxt
        logits = torch.empty(tokens * 152064 * 2, device="cuda")
        logits._saved = x
        logits._params = x._params
        return logits


def collate(width, height):
    """The processor's output for one image: pixel patches (14x14, 2 frames of 3 channels, fp32)."""
    num_patches = (width // 14) * (height // 14)
    pixel_values = torch.empty(num_patches * 1176 * 4, device="cuda")
    return pixel_values, num_patches


def main():
    model = Qwen2VLForConditionalGeneration()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    per_device_train_batch_size = 1
    images = [(1280, 960), (1024, 768), (1280, 960), (1170, 2532), (1280, 960), (3000, 2000), (1280, 960)]
    for step, (w, h) in enumerate(images):
        pixel_values, num_patches = collate(w, h)
        input_ids = torch.empty(per_device_train_batch_size * 2048 * 8, device="cuda")
        logits = model(input_ids, pixel_values, num_patches)
        loss = torch.empty(512, device="cuda")
        loss._saved = logits
        loss._params = logits._params
        scen_truth.backward(loss)
        with torch.no_grad():
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, pixel_values, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
