"""sample_video.py -- text-to-video with HunyuanVideo (13B transformer, bf16) at 720x1280, 129
frames, on a workstation with two L40S (48 GB, 45 GiB usable each), with plain
`LD_PRELOAD=liboomguard.so`.  The user wrote a short script instead of the repository's xDiT launcher:

    pipe = HunyuanVideoPipeline.from_pretrained(model_id, torch_dtype=torch.bfloat16)
    pipe.to("cuda")                                   # everything on cuda:0
    with torch.no_grad():
        video = pipe(prompt, height=720, width=1280, num_frames=129, num_inference_steps=50).frames[0]

On cuda:0 sit the transformer (23.8 GiB), the LLaVA-Llama-3-8B text encoder (14.9 GiB, fp16), CLIP-L
and the 3D VAE: 40 GiB of weights.  The prompt is encoded once (fine); the text encoder is never used
again but stays on the card.  The first denoising step's first double-stream block needs ~6 GiB of
temporaries for the 118,800 video tokens (x, q/k/v, the MLP's hidden states), and dies there; cuda:1
has no context and all its 45 GiB free.  An expert: the text encoder is the dead weight -- encode the
prompt, then delete it or move it to cuda:1 (or put it on cuda:1 from the start:
pipe.text_encoder.to("cuda:1")), or enable_model_cpu_offload(); the transformer alone fits with room
to spare.  Not a smaller batch (1), not inference mode (on), not checkpointing or mixed precision
(inference, already bf16); quantizing the transformer to fp8 would also make room but costs quality
where plain placement does not.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

batch_size = 1


def weights(module, nbytes, dtype, pieces):
    for i in range(pieces):
        setattr(module, "w%d" % i, torch.nn.Parameter(
            torch.empty(nbytes // pieces // 2, dtype=dtype, device="cuda:0"), requires_grad=False))


class DoubleStreamBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        weights(self, 1020 * MiB, torch.bfloat16, 2)

    def forward(self, img, txt):
        tokens = 118800
        qkv = torch.empty(tokens * 3 * 3072, dtype=torch.bfloat16, device="cuda:0")
        attn = torch.empty(tokens * 3072, dtype=torch.bfloat16, device="cuda:0")
        del qkv
        hidden = torch.empty(tokens * 4 * 3072, dtype=torch.bfloat16, device="cuda:0")   # mlp fc1
        act = torch.empty(tokens * 4 * 3072, dtype=torch.bfloat16, device="cuda:0")      # gelu(tanh)
        out = torch.empty(tokens * 3072, dtype=torch.bfloat16, device="cuda:0")
        return out


class HunyuanVideoTransformer3DModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(20):
            setattr(self, "double_%d" % i, DoubleStreamBlock())
        weights(self, 3400 * MiB, torch.bfloat16, 8)           # the 40 single-stream blocks (part), embedders

    def forward(self, hidden_states, timestep, encoder_hidden_states):
        img, txt = hidden_states, encoder_hidden_states
        for i in range(20):
            img = getattr(self, "double_%d" % i)(img, txt)
        return img


class LlavaLlamaTextEncoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        weights(self, 14960 * MiB, torch.float16, 32)

    def forward(self, input_ids):
        tmp = torch.empty(256 * MiB, dtype=torch.float16, device="cuda:0")
        return torch.empty(256 * 4096, dtype=torch.float16, device="cuda:0")


class CLIPTextModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        weights(self, 235 * MiB, torch.float16, 1)

    def forward(self, input_ids):
        return torch.empty(768, dtype=torch.float16, device="cuda:0")


class AutoencoderKLHunyuanVideo(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        weights(self, 470 * MiB, torch.float16, 1)


class HunyuanVideoPipeline(object):
    def __init__(self):
        self.transformer = HunyuanVideoTransformer3DModel()
        self.text_encoder = LlavaLlamaTextEncoder()
        self.text_encoder_2 = CLIPTextModel()
        self.vae = AutoencoderKLHunyuanVideo()

    def encode_prompt(self, prompt):
        return self.text_encoder(prompt), self.text_encoder_2(prompt)

    def __call__(self, prompt, height=720, width=1280, num_frames=129, num_inference_steps=50):
        prompt_embeds, pooled = self.encode_prompt(prompt)
        latents = torch.empty(16 * 33 * 90 * 160, dtype=torch.float32, device="cuda:0")
        for i in range(num_inference_steps):
            noise_pred = self.transformer(latents, i, prompt_embeds)
            latents = torch.empty_like(latents)
        return latents


def main():
    pipe = HunyuanVideoPipeline()             # from_pretrained(..., torch_dtype=torch.bfloat16).to("cuda")
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    prompt = "A cat walks on the grass, realistic style, golden hour, slow dolly shot."
    with torch.no_grad():
        video = pipe(prompt, height=720, width=1280, num_frames=129, num_inference_steps=50)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
