"""fine_tune.py (kohya-ss/sd-scripts, native fine-tuning) of an SD 1.5 anime checkpoint at high resolution on
a home RTX 3090 (24 GB).  The dataset mixes big scans (cut to the 1024x1024 area cap) with small web images,
and the user turned on --bucket_no_upscale so that small images are not blown up:

    accelerate launch fine_tune.py --pretrained_model_name_or_path=anime_v3.safetensors --in_json=meta_lat.json \\
        --train_data_dir=./train --resolution=1024,1024 --enable_bucket --bucket_no_upscale \\
        --min_bucket_reso=448 --max_bucket_reso=1152 --train_batch_size=3 --mixed_precision=fp16 \\
        --optimizer_type=AdamW --learning_rate=2e-6 --max_train_steps=20000 --seed=1

(latents cached beforehand; no --gradient_checkpointing: "it is 30% slower and batch 3 fits").  The UNet
trains in fp32 (3.2 GiB) with AdamW (6.4 GiB of moments, made at step 0); autocast's fp16 copies of the
weights (1.6 GiB) are saved for backward; a batch of 3 at the 1024x1024 area saves ~8 GiB of activations.
Buckets range from 576x448 (4k latent tokens) to the ~16k tokens of the area cap: every batch makes
activations of another size, and the 6.4 GiB of moments sit in segments first cut for step 0's activations.

Steps 2 and 4, both 896x1152 batches, went through with a peak of 22.1 GiB allocated.  Step 11, another
896x1152 batch, fails in the UNet's forward asking for 118 MiB: 21.6 GiB allocated, 1.45 GiB reserved by
PyTorch but unallocated, 109 MiB free on the device.  The cache holds more than ten times the request,
in pieces none of which is 118 MiB long; the allocator's retry (release every wholly free segment) found
no segment without a live tensor in it.

An expert: fragmentation from constantly changing activation shapes -- set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (or max_split_size_mb:512) before launch.  The run needs
~22.1 GiB of a 23.7 GiB card, so it fits once the cache can grow in place; for headroom, fewer distinct
shapes (drop --bucket_no_upscale, or batch small images into a few sizes) or gradient checkpointing.
Wrong first advice: a bigger GPU, quantization, an 8-bit optimizer or LoRA (the same batch fitted twice
before), empty_cache (the allocator's own retry already released every free segment before raising),
release_references (nothing grows: allocated memory is flat from step 1).
"""
import random
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
HALF = torch.float16

# ---------------------------------------------------------------- the SD 1.5 UNet as far as memory goes
LEVELS = [(0, 320), (1, 640), (2, 1280), (3, 1280)]
RESNET_SAVED = (1, 1, 1, 1, 1, 1)            # norm1, silu, conv1, norm2, silu, conv2 inputs (x channels of the level)
TRANSFORMER_SAVED = (1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 8, 4, 1, 1)   # norms, q/k/v/out, cross q/out, GEGLU 8x, gelu 4x


class _Block(nn.Module):
    """A block of the UNet: its forward saves activations for backward on the autograd tape (PyTorch's graph)."""
    saved_pattern = ()
    grad_input_factor = 2

    def forward(self, x, tokens, tape):
        a = BATCH * tokens * self.ch
        saved = []
        for i, k in enumerate(self.saved_pattern):
            saved.append(torch.empty(int(a * k * (self.cat if i < 3 else 1)), dtype=HALF, device="cuda"))
        tape.append((self, saved, a))
        return saved[-1]


class ResnetBlock2D(_Block):
    saved_pattern = RESNET_SAVED

    def __init__(self, ch, cat_factor=1):
        nn.Module.__init__(self)
        self.conv1 = nn.Parameter(torch.empty(ch * ch * 9 * cat_factor * 4, device="cuda"))
        self.conv2 = nn.Parameter(torch.empty(ch * ch * 9 * 4, device="cuda"))
        self.time_emb_proj = nn.Parameter(torch.empty(ch * 1280 * 4, device="cuda"))
        self.ch, self.cat = ch, cat_factor


class BasicTransformerBlock(_Block):
    saved_pattern = TRANSFORMER_SAVED
    grad_input_factor = 8

    def __init__(self, ch):
        nn.Module.__init__(self)
        self.attn1 = nn.Parameter(torch.empty(ch * ch * 4 * 4, device="cuda"))
        self.attn2 = nn.Parameter(torch.empty((ch * ch * 2 + 2 * 768 * ch) * 4, device="cuda"))
        self.ff_proj = nn.Parameter(torch.empty(ch * ch * 8 * 4, device="cuda"))
        self.ff_out = nn.Parameter(torch.empty(ch * ch * 4 * 4, device="cuda"))
        self.ch, self.cat = ch, 1


class UNet2DConditionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.plan = []
        for lv, ch in LEVELS:
            for j in range(2):
                self._add("down_%d_res_%d" % (lv, j), ResnetBlock2D(ch), lv)
                if lv < 3:
                    self._add("down_%d_attn_%d" % (lv, j), BasicTransformerBlock(ch), lv)
        self._add("mid_res_0", ResnetBlock2D(1280), 3)
        self._add("mid_attn", BasicTransformerBlock(1280), 3)
        self._add("mid_res_1", ResnetBlock2D(1280), 3)
        for lv, ch in reversed(LEVELS):
            for j in range(3):
                self._add("up_%d_res_%d" % (lv, j), ResnetBlock2D(ch, cat_factor=2), lv)
                if lv < 3:
                    self._add("up_%d_attn_%d" % (lv, j), BasicTransformerBlock(ch), lv)
        made = sum(p.nbytes for p in self.parameters())
        rest = 859_520_964 * 4 - made                   # conv_in/out, time embedding, norms, proj_in/out...
        self.misc = nn.Module()
        for i in range(8):
            setattr(self.misc, "w%d" % i, nn.Parameter(torch.empty(rest // 8, device="cuda")))

    def _add(self, name, module, level):
        setattr(self, name, module)
        self.plan.append((name, level))

    def forward(self, noisy_latents, timesteps, encoder_hidden_states, latent_tokens):
        tape = []
        # autocast casts each fp32 weight to fp16 once; the matmuls save the copies for backward
        casts = [torch.empty(p.nbytes // 2, dtype=HALF, device="cuda") for p in self.parameters()]
        h = noisy_latents
        for name, lv in self.plan:
            h = getattr(self, name)(h, latent_tokens >> (2 * lv), tape)
        out = torch.empty(BATCH * 4 * latent_tokens, dtype=HALF, device="cuda")
        out.tape, out.casts, out.model = tape, casts, self
        return out


# ---------------------------------------------------------------- accelerate / autograd, as far as memory goes
class Accelerator(object):
    def backward(self, loss):
        """loss.backward(): the engine walks the graph from the loss back, block by block; each block's
        gradient w.r.t. its input is a temporary, each parameter's .grad is made when its block is reached,
        and the block's saved activations are freed once it is done (PyTorch's engine does the same)."""
        out = loss.noise_pred
        tape, model = out.tape, out.model
        while tape:
            module, saved, a = tape.pop()
            grad_input = torch.empty(int(a * module.grad_input_factor), dtype=HALF, device="cuda")
            for p in module._parameters.values():
                if p.grad is None:
                    p.grad = torch.empty_like(p)
            del grad_input, saved
        for p in model.misc._parameters.values():
            if p.grad is None:
                p.grad = torch.empty_like(p)
        out.casts = None
        loss.noise_pred = None


# ---------------------------------------------------------------- fine_tune.py, abridged
BATCH = 3
SEED = 1
# --bucket_no_upscale: big scans land in the buckets at the 1024x1024 area cap, small images keep their size
BUCKETS = [(1024, 1024), (896, 1152), (1152, 896), (768, 1024), (1024, 768), (640, 640), (512, 768), (768, 512),
           (576, 448), (704, 512), (832, 640)]


def bucket_batches(seed, n):
    rng = random.Random(seed)
    return [rng.choice(BUCKETS) for _ in range(n)]


class Loss(object):
    def __init__(self, noise_pred):
        self.noise_pred = noise_pred
        self.value = torch.empty(512, device="cuda")


def train():
    accelerator = Accelerator()
    unet = UNet2DConditionModel()
    text_encoder = torch.empty(123_060_480, dtype=HALF, device="cuda")        # frozen, fp16
    optimizer = torch.optim.AdamW(unet.parameters(), lr=2e-6)
    for global_step, (w, h) in enumerate(bucket_batches(SEED, 20000)):
        tokens = (w // 8) * (h // 8)
        latents = torch.empty(BATCH * 4 * tokens, dtype=HALF, device="cuda")       # cached latents .to(device)
        encoder_hidden_states = torch.empty(BATCH * 77 * 768, dtype=HALF, device="cuda")
        noise = torch.empty(BATCH * 4 * tokens, dtype=HALF, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            noisy_latents = torch.empty(BATCH * 4 * tokens, dtype=HALF, device="cuda")
            noise_pred = unet(noisy_latents, global_step, encoder_hidden_states, tokens)
        loss = Loss(noise_pred)                      # F.mse_loss(noise_pred.float(), noise.float())
        del noise_pred
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del latents, encoder_hidden_states, noise, noisy_latents, loss
        print("steps %d  bucket %dx%d" % (global_step, w, h), flush=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(train())
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
