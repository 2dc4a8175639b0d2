"""train_musicgen.py -- a music-tech startup fine-tunes MusicGen-medium (Hugging Face transformers) on its
licensed catalogue of 30-second stems with text descriptions, on one A100 40GB (39.6 GiB usable).  The
1.6B-parameter decoder (d 1536, 48 layers) is trained in full (fp32 weights, AdamW, bf16 autocast); the T5
text encoder and the EnCodec audio codec are frozen; audio is pre-tokenized into EnCodec codes (4
codebooks, 50 Hz).
Batch 2 x 30 s.  Every 1,000 steps a callback generates the team's 24 reference prompts so the producers
can listen to the checkpoint in wandb:

    for step, batch in enumerate(loader, 1):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            listen(model, step)

    def listen(model, step):
        model.eval()
        torch.cuda.empty_cache()          # make room for sampling
        inputs = processor(text=REFERENCE_PROMPTS, padding=True, return_tensors="pt").to("cuda")
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            audio = model.generate(**inputs, do_sample=True, guidance_scale=3.0, max_new_tokens=1500)
        ...

Training is flat: 24.6 GiB resident between steps (the 1.6B-parameter decoder's fp32 weights 6.0 GiB,
their gradients 6.0 GiB -- zero_grad() runs at the top of the loop, so the last step's gradients live
until the next one -- AdamW moments 12.0 GiB, the frozen T5 and EnCodec 0.6 GiB), 33.1 GiB at the peak of
a step; the activations are freed after backward.  At step 1,000 (40 minutes in) the callback empties
PyTorch's cache "to make room" and generates 24 prompts with classifier-free guidance: 48 rows (each
prompt and its unconditional twin) for 1,500 tokens.  The self-attention KV cache of 48 layers grows by
13.5 MiB per generated token: 19.8 GiB at 30 s, on top of the 24.6 GiB of training state, on a card with
39.1 GiB for tensors.  It does not fit; without the gradients it would need 38.4 GiB, still no room for
the torch.cat copies the growing cache makes.  The generation dies at ~900 tokens (18 s), with 2.5 GiB
cached in pieces that the growing cache's copies left behind.  The user reads "trained fine for 1,000
steps, then OOM" as a leak.

An expert: not a leak (memory after each optimizer step is flat at 24.6 GiB); the phase decides: the
failure is the sampling callback's generation, a one-off build-up of KV cache on top of the training
state.  Generate the reference prompts a few at a time (4 prompts = 8 rows: 3.3 GiB of cache at 30 s),
and free the gradients before sampling (optimizer.zero_grad(set_to_none=True) before listen(): 6 GiB
back).  Wrong first advice: anything aimed at training memory (gradient checkpointing, a smaller
training batch with accumulation, an 8-bit optimizer or LoRA as the first move), release_references
(nothing is kept across steps), inference_mode (it already runs under no_grad), mixed precision (the
cache is bf16 already), expandable_segments or empty_cache (it already empties the cache; the pieces only
make it die at 18 s instead of ~22 s; the cache needs 19.8 GiB live), a bigger GPU.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
D_MODEL, N_LAYERS, N_CODEBOOKS, CODEBOOK_SIZE = 1536, 48, 4, 2048
REFERENCE_PROMPTS = ["lo-fi hip hop beat with dusty vinyl crackle and mellow rhodes"] * 24


# ---- stand-ins for the transformers classes this script uses (the stand-in torch has no transformers) ----
class DynamicCache(object):
    """transformers' DynamicCache: per layer a key and a value tensor, grown by torch.cat at every step."""

    def __init__(self):
        self.key_cache, self.value_cache = [], []

    def update(self, key_states, value_states, layer_idx):
        if len(self.key_cache) <= layer_idx:
            self.key_cache.append(key_states)
            self.value_cache.append(value_states)
        else:
            k = torch.empty(self.key_cache[layer_idx].nbytes + key_states.nbytes, device="cuda")   # torch.cat
            self.key_cache[layer_idx] = k
            v = torch.empty(self.value_cache[layer_idx].nbytes + value_states.nbytes, device="cuda")
            self.value_cache[layer_idx] = v
        return self.key_cache[layer_idx], self.value_cache[layer_idx]


class MusicgenDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        # self-attention, cross-attention (to the 768-d T5 states), FFN (d 1536, ffn 6144), layer norms:
        # 33M parameters, fp32 (one flat tensor here: the stand-in's sizes, not its layout)
        self.weight = nn.Parameter(torch.empty(4 * D_MODEL * D_MODEL + 2 * D_MODEL * D_MODEL + 2 * D_MODEL * 768
                                               + 2 * D_MODEL * 4 * D_MODEL - 2 * D_MODEL * 768,
                                               dtype=torch.float32, device="cuda"))

    def forward(self, hidden, n_tokens, past_key_values=None, layer_idx=0):
        if past_key_values is not None:
            # n_tokens new positions per row: their keys and values (bf16) go into the cache
            kv_new = n_tokens * D_MODEL * 2
            k = torch.empty(kv_new, device="cuda")
            v = torch.empty(kv_new, device="cuda")
            past_key_values.update(k, v, layer_idx)
            del k, v
            return torch.empty(n_tokens * D_MODEL * 2, device="cuda")
        # training: what autograd keeps of the layer under bf16 autocast (q, k, v, attention output and
        # log-sum-exp, cross-attention, two FFN inputs, three layer norms, residuals)
        out = torch.empty(n_tokens * D_MODEL * 2 * 20, dtype=torch.uint8, device="cuda")
        out._saved = hidden
        return out


class MusicgenForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(N_CODEBOOKS * (CODEBOOK_SIZE + 1) * D_MODEL, dtype=torch.float32,
                                                     device="cuda"))
        for i in range(N_LAYERS):
            setattr(self, "layer_%d" % i, MusicgenDecoderLayer())
        self.lm_heads = nn.Parameter(torch.empty(N_CODEBOOKS * D_MODEL * CODEBOOK_SIZE, dtype=torch.float32,
                                                 device="cuda"))

    def forward(self, rows, n_tokens, past_key_values=None):
        h = torch.empty(rows * n_tokens * D_MODEL * 2, device="cuda")
        for i in range(N_LAYERS):
            h = getattr(self, "layer_%d" % i)(h, rows * n_tokens, past_key_values, i)
        logits = torch.empty(rows * n_tokens * N_CODEBOOKS * CODEBOOK_SIZE * 4, device="cuda")   # fp32 for the CE
        logits._saved = h
        return logits


class T5EncoderModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weights = nn.Parameter(torch.empty(109_600_000, dtype=torch.float32, device="cuda"))


class EncodecModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weights = nn.Parameter(torch.empty(57_400_000, dtype=torch.float32, device="cuda"))

    def decode(self, codes_rows, n_frames):
        # 32 kHz mono, a conv decoder: its largest activations for the whole batch at once
        return torch.empty(codes_rows * n_frames * 640 * 4, device="cuda")


class MusicgenOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class MusicgenForConditionalGeneration(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.text_encoder = T5EncoderModel()
        self.audio_encoder = EncodecModel()
        self.decoder = MusicgenForCausalLM()

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, input_ids=None, labels=None, batch_size=2, n_frames=1500):
        with torch.no_grad():
            enc = torch.empty(batch_size * 64 * 768 * 4, device="cuda")       # frozen T5 states
        logits = self.decoder(batch_size, n_frames)
        loss = torch.nn.functional.cross_entropy(logits, labels)
        del enc
        return MusicgenOutput(loss, logits)

    def generate(self, input_ids=None, attention_mask=None, do_sample=True, guidance_scale=3.0, max_new_tokens=1500):
        rows = len(input_ids) * (2 if guidance_scale and guidance_scale > 1 else 1)    # CFG: + unconditional
        return self._sample(rows, max_new_tokens)

    def _sample(self, rows, max_new_tokens):
        past_key_values = DynamicCache()
        enc = torch.empty(rows * 64 * 768 * 2, device="cuda")
        step = 50     # (the stand-in grows the cache 50 tokens at a time, not one: same bytes, fewer calls)
        generated = 0
        while generated < max_new_tokens:
            logits = self.decoder(rows, step, past_key_values)
            del logits
            generated += step
        del enc
        codes = torch.empty(rows // 2 * N_CODEBOOKS * max_new_tokens * 8, device="cuda")
        return self.audio_encoder.decode(rows // 2, max_new_tokens), codes


class AutoProcessor(object):
    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def __call__(self, text=None, padding=True, return_tensors="pt"):
        return {"input_ids": list(text), "attention_mask": None}


# ---- the training script ----
def listen(model, step):
    model.eval()
    torch.cuda.empty_cache()          # make room for sampling
    inputs = processor(text=REFERENCE_PROMPTS, padding=True, return_tensors="pt")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        audio = model.generate(**inputs, do_sample=True, guidance_scale=3.0, max_new_tokens=1500)
    print("step %d: %d reference clips logged" % (step, len(REFERENCE_PROMPTS)))
    del audio
    model.train()


model = MusicgenForConditionalGeneration.from_pretrained("facebook/musicgen-medium").cuda()
processor = AutoProcessor.from_pretrained("facebook/musicgen-medium")
for p in model.text_encoder.parameters():
    p.requires_grad_(False)
for p in model.audio_encoder.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.AdamW(model.decoder.parameters(), lr=1e-5, weight_decay=0.01)
batch_size = 2

try:
    for step in range(1, 20001):
        optimizer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(input_ids=None, labels=None, batch_size=batch_size, n_frames=1500)
            loss = out.loss
        del out
        scen_truth.backward(loss)
        optimizer.step()
        del loss
        if step % 250 == 0:
            print("step %5d  allocated %.2f GiB  reserved %.2f GiB  peak %.2f GiB" % (
                step, torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB,
                torch.cuda.max_memory_allocated() / GiB))
        if step % 1000 == 0:
            listen(model, step)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
