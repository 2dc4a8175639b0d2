"""voice_server.py -- a multi-tenant "custom voice" TTS server: each of 16 customers has a fine-tuned
XTTS-v2 (474M parameters, fp32: 1.77 GiB), all kept resident, plus one Whisper-small (244M, fp32)
that transcribes every output for an intelligibility check.  It was moved from a one-L4 node to a
GCP g2-standard-24 (two NVIDIA L4, 22.5 GiB each) and the Helm values for the new node pool set
`nvidia.com/gpu: 2` -- but not the NUM_GPUS variable the server reads, so the placement code still
sees one GPU:

    NUM_GPUS = int(os.environ.get("NUM_GPUS", "1"))                  # unset on the new node pool
    qa = WhisperForConditionalGeneration.from_pretrained("openai/whisper-small").to(
        f"cuda:{torch.cuda.device_count() - 1}")                      # QA model: the last GPU -> cuda:1
    for i, tenant in enumerate(registry.tenants()):                  # 16 tenants
        model = Xtts.init_from_config(cfg); model.load_checkpoint(cfg, tenant.checkpoint_dir)
        voices[tenant.id] = model.to(f"cuda:{i % NUM_GPUS}")          # -> cuda:0, every time

Whisper-small lands on cuda:1 (0.9 GiB there, plus its context); every tenant voice lands on cuda:0.
Twelve voices fill GPU 0 (21.2 GiB); the thirteenth fails while its weights are copied to the GPU.
GPU 1 has 21.0 GiB free.  Eight voices per GPU (14.1 GiB each) would fit with room for generation.
(On GPU 0 the caching allocator holds ~0.1 GiB unallocated in the tails of its segments -- embedding
tables of odd sizes -- against a 16 MiB request: noise, not fragmentation that matters.)

An expert says first: the placement is wrong, not the card -- GPU 1 is nearly idle: spread the
tenants over both GPUs (set NUM_GPUS=2, or better derive it from torch.cuda.device_count(), or
place each voice on the emptier device).  Further options after that: bf16 weights (XTTS runs fine
in fp16/bf16: halves every voice), or an LRU of resident voices.  Wrong advice: empty_cache /
expandable_segments (0.1 GiB is cached; the rest is weights in use), a smaller batch, gradient
checkpointing, stopping other processes (none), a bigger GPU (the second GPU is already there),
FSDP/ZeRO (inference of independent small models).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)
F32 = torch.float32


def _p(module, name, n, device):
    setattr(module, name, torch.nn.Parameter(torch.empty(n, dtype=F32, device=device)))


def _ps(module, prefix, sizes, device):
    for i, n in enumerate(sizes):
        _p(module, "%s_%d" % (prefix, i), n, device)


class WhisperSmall(torch.nn.Module):                  # 244M: 12 + 12 layers, d_model 768
    def __init__(self, device):
        torch.nn.Module.__init__(self)
        _p(self, "embed_tokens", 51_865 * 768, device)
        for side in ("encoder", "decoder"):
            sub = torch.nn.Module()
            for i in range(12):
                layer = torch.nn.Module()
                # q, k, v, out (768 x 768), fc1 (768 x 3072), fc2 (3072 x 768); the decoder's cross-attention
                _ps(layer, "w", [589_824] * 4 + [2_359_296] * 2 + ([589_824] * 4 if side == "decoder" else []),
                    device)
                setattr(sub, "layer_%d" % i, layer)
            setattr(self, side, sub)


class Xtts(torch.nn.Module):                          # XTTS-v2: GPT-2 style 30 x 1024 + perceiver + HiFi-GAN
    def __init__(self, device):
        torch.nn.Module.__init__(self)
        self.gpt = torch.nn.Module()
        _p(self.gpt, "text_embedding", 6_681 * 1024, device)
        _p(self.gpt, "mel_embedding", 1_026 * 1024, device)
        self.gpt.layers = torch.nn.Module()
        for i in range(30):
            layer = torch.nn.Module()
            # c_attn (1024 x 3072), attn c_proj (1024 x 1024), mlp c_fc (1024 x 4096), mlp c_proj (4096 x 1024)
            _ps(layer, "w", [3_145_728, 1_048_576, 4_194_304, 4_194_304], device)
            setattr(self.gpt.layers, str(i), layer)
        _p(self.gpt, "text_head", 6_681 * 1024, device)
        _p(self.gpt, "mel_head", 1_026 * 1024, device)
        self.conditioning = torch.nn.Module()                       # conditioning encoder + perceiver
        _ps(self.conditioning, "encoder", [1_048_576] * 16 + [4_194_304] * 5, device)
        _ps(self.conditioning, "perceiver", [1_048_576] * 4 + [4_194_304] * 2, device)
        self.hifigan_decoder = torch.nn.Module()
        _ps(self.hifigan_decoder, "waveform_decoder", [4_194_304, 2_097_152, 1_048_576] + [524_288] * 34, device)
        _ps(self.hifigan_decoder, "speaker_encoder", [524_288] * 11, device)


def main():
    num_gpus = int(os.environ.get("NUM_GPUS", "1"))
    tenants = ["tenant-%02d" % i for i in range(16)]
    voices = {}
    try:
        qa = WhisperSmall("cuda:%d" % (torch.cuda.device_count() - 1)).eval()
        for i, tenant in enumerate(tenants):
            device = "cuda:%d" % (i % num_gpus)
            voices[tenant] = Xtts(device).eval()
            latents = torch.empty(32 * 1024 + 512, dtype=F32, device=device)   # the tenant's speaker latents
            voices[tenant].speaker_latents = latents
            sys.stderr.write("loaded %s on %s\n" % (tenant, device))
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark(0)
        raise
    del qa
    return 0


if __name__ == "__main__":
    sys.exit(main())
