"""train_cogvideox_lora.py -- a LoRA (rank 64) on CogVideoX-2b for 2,500 short product clips (49
frames, 480x720), on one RTX 4090 (24 GiB), with plain `LD_PRELOAD=liboomguard.so`.  Transformer,
T5-XXL text encoder and the 3D VAE are frozen fp16 (12.6 GiB), gradient checkpointing on, batch 1.
Encoding a clip with the 3D VAE takes seconds, so the user memoises the VAE and T5 outputs in the
dataset, as the first epoch meets each clip:

    class CachedClipDataset(Dataset):
        def __init__(self, ...):
            self.latent_cache = {}      # clip path -> VAE latents   (13x16x60x90, sampled, fp32: 4.3 MiB)
            self.te_cache = {}          # caption   -> T5 embeddings (226x4096 fp16: 1.8 MiB)
        def __getitem__(self, i):
            if path not in self.latent_cache:
                with torch.no_grad():
                    self.latent_cache[path] = vae.encode(frames.cuda()).latent_dist.sample().float()
                    self.te_cache[caption] = t5(tokenize(caption))[0]
            return self.latent_cache[path], self.te_cache[caption]

The cached tensors stay on the GPU: 6.1 MiB per clip, 15 GiB for the set, which the card does not
have next to the frozen models and a step's 4.4 GiB of activations.  The first epoch dies after
~1,000 clips in the transformer's forward, the cache at ~6 GiB and growing every step.  An expert: the
memoised latents/embeddings are what grows -- keep them in host memory (or precompute them to disk,
as the CogVideoX fine-tuning scripts do) and move each sample to the GPU, or bound the cache; not a
smaller batch (it is 1), not checkpointing (already on), not an 8-bit optimizer (the LoRA's AdamW state is
30 MiB).
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
KiB = 1 << 10
scen_truth.note_every_empty(torch)

train_batch_size = 1


def frozen(nbytes, dtype=torch.float16):
    n = nbytes // (2 if dtype == torch.float16 else 4)
    return torch.nn.Parameter(torch.empty(n, dtype=dtype, device="cuda"), requires_grad=False)


class LoRALinear(torch.nn.Module):
    def __init__(self, base_bytes, lora_bytes):
        torch.nn.Module.__init__(self)
        self.base = frozen(base_bytes)
        self.lora_A = torch.nn.Parameter(torch.empty(lora_bytes // 8, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(lora_bytes // 8, device="cuda"))


class TransformerBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = LoRALinear(50 * MiB, 1 * MiB)
        self.ff = LoRALinear(60 * MiB, 1 * MiB)

    def forward(self, x):
        h = torch.empty(150 * MiB, device="cuda")                # checkpointed: the block's recompute
        h._saved = x
        self.attn.lora_A, self.ff.lora_B                          # noqa: B018  (the adapters take part)
        return torch.autograd._graph.derive(h, x)


class CogVideoXTransformer3DModel(torch.nn.Module):
    """CogVideoX-2b, 1.7B params fp16, LoRA on the attention and feed-forward layers."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(30):
            setattr(self, "block_%d" % i, TransformerBlock())
        self.patch_embed = frozen(40 * MiB)
        self.gradient_checkpointing = False

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, sample, timestep, encoder_hidden_states):
        h = sample
        for i in range(30):
            h = getattr(self, "block_%d" % i)(h)
        return h


class AutoencoderKLCogVideoX(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = frozen(412 * MiB)

    def encode(self, img):
        tmp = torch.empty(2048 * MiB, device="cuda")              # the encoder's feature maps, freed
        return torch.empty(13 * 16 * 60 * 90 * 4, device="cuda")   # 13x16x60x90 fp32 latents


class T5EncoderModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoder = frozen(9100 * MiB)

    def forward(self, caption):
        tmp = torch.empty(40 * MiB, device="cuda")
        return torch.empty(226 * 4096, dtype=torch.float16, device="cuda")


class CachedClipDataset(object):
    def __init__(self, n_images, vae, text_encoders):
        self.paths = ["clips/%05d.mp4" % i for i in range(n_images)]
        self.vae, self.text_encoders = vae, text_encoders
        self.latent_cache = {}
        self.te_cache = {}

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        path = self.paths[i]
        caption = "a product video, item %d, turning slowly" % i
        if path not in self.latent_cache:
            with torch.no_grad():
                img = torch.empty(49 * 3 * 480 * 720 * 2, device="cuda")   # 49 frames fp16, to the GPU
                self.latent_cache[path] = self.vae.encode(img)
                self.te_cache[caption] = self.text_encoders(caption)
                del img
        return self.latent_cache[path], self.te_cache[caption]


def main():
    transformer = CogVideoXTransformer3DModel()
    transformer.enable_gradient_checkpointing()
    vae = AutoencoderKLCogVideoX()
    text_encoder = T5EncoderModel()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    lora_params = [p for p in transformer.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(lora_params, lr=1e-4)
    dataset = CachedClipDataset(2500, vae, text_encoder)
    for epoch in range(10):
        for step in range(len(dataset) // train_batch_size):
            items = [dataset[step * train_batch_size + j] for j in range(train_batch_size)]
            noisy = torch.empty(13 * 16 * 60 * 90 * 2, device="cuda")   # add_noise, fp16
            noisy._params = ()
            model_pred = transformer(noisy, step, [e for _, e in items])
            loss = torch.empty(512, device="cuda")
            loss._saved = model_pred
            loss = torch.autograd._graph.derive(loss, model_pred)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del items, noisy, model_pred, loss
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
