"""train_dreambooth.py (diffusers example), run from a Colab notebook on the free T4 (15 GB):

    !accelerate launch train_dreambooth.py --pretrained_model_name_or_path=runwayml/stable-diffusion-v1-5 \\
        --instance_data_dir=./dog --instance_prompt="a photo of sks dog" \\
        --with_prior_preservation --class_prompt="a photo of dog" \\
        --resolution=512 --train_batch_size=1 --gradient_checkpointing --mixed_precision=fp16 \\
        --train_text_encoder --learning_rate=2e-6 --max_train_steps=800

(no --use_8bit_adam: bitsandbytes would not import in the notebook, so the user dropped the flag)

The user: "the model loads, the first forward and backward go through, then it crashes on step 1.  I
already use batch 1, gradient checkpointing and fp16 -- what else is there?"

What fills the memory: with --train_text_encoder the script trains the UNet (859.5M params) and the CLIP
text encoder (123M) in fp32 -- with --mixed_precision=fp16 Accelerate keeps the trained weights in fp32
and autocasts the compute.  Weights 3.66 GiB, their gradients another 3.66 GiB after the first backward,
and then torch.optim.AdamW makes exp_avg and exp_avg_sq for every parameter at the first
optimizer.step(): 7.32 GiB more.  With the fp16 VAE and the CUDA context that is ~15.3 GiB on a
15 GiB card; the activations (gradient checkpointing, batch 1 + 1 prior image) are already freed when it
fails, part way through making the optimizer state.

An expert says first: an 8-bit optimizer (--use_8bit_adam, bitsandbytes AdamW8bit: the state drops from
7.32 to ~1.8 GiB, which is exactly what the diffusers README prescribes for 16 GB cards), or train LoRA
adapters instead (train_dreambooth_lora.py) -- or drop --train_text_encoder.  Wrong advice: smaller batch
(already 1), gradient checkpointing and mixed precision (already on; the failure is optimizer state, not
activations), empty_cache / expandable_segments (no cache to speak of), inference_mode, released references
(there is no leak: it is the very first step).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

train_batch_size = 1
gradient_checkpointing = True


def _weights(module, n_params, n_tensors, dtype, trainable):
    itemsize = torch._ITEMSIZE[dtype]
    for i in range(n_tensors):
        setattr(module, "w%03d" % i, nn.Parameter(torch.empty(n_params // n_tensors, dtype=dtype, device="cuda"),
                                                 requires_grad=trainable))


def act(nbytes, src):
    t = torch.empty(nbytes // 2, dtype=torch.float16, device="cuda")
    if torch.is_grad_enabled():
        t._saved = src
    return torch.autograd._graph.derive(t, src)


class UNet2DConditionModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 859_520_000, 64, torch.float32, True)

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, noisy_latents, timesteps, encoder_hidden_states):
        # with checkpointing only the block inputs are kept: 23 blocks x batch 2 at 64x64 latents
        h = act(16 * MiB, noisy_latents)
        h = torch.autograd._graph.derive(h, encoder_hidden_states)
        for i in range(23):
            h = act(48 * MiB, h)
        for p in self._parameters.values():
            h = torch.autograd._graph.derive(h, p)
        return act(1 * MiB, h)


class CLIPTextModel(nn.Module):
    def __init__(self, dtype, trainable):
        nn.Module.__init__(self)
        _weights(self, 123_060_000, 12, dtype, trainable)

    def forward(self, input_ids):
        h = act(2 * 77 * 768 * 2 * 12, input_ids)
        for p in self._parameters.values():
            h = torch.autograd._graph.derive(h, p)
        return h


class AutoencoderKL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        _weights(self, 83_650_000, 8, torch.float16, False)

    def encode(self, pixel_values):
        with torch.no_grad():
            tmp = torch.empty(2 * 128 * 512 * 512 * 2, dtype=torch.uint8, device="cuda")
            del tmp
            return torch.empty(2 * 4 * 64 * 64 * 2, dtype=torch.uint8, device="cuda")


def main():
    unet = UNet2DConditionModel()
    text_encoder = CLIPTextModel(torch.float32, trainable=True)        # --train_text_encoder
    vae = AutoencoderKL()                                              # weight_dtype = fp16, frozen
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    if gradient_checkpointing:
        unet.enable_gradient_checkpointing()
    params_to_optimize = list(unet.parameters()) + list(text_encoder.parameters())
    optimizer_class = torch.optim.AdamW                                # args.use_8bit_adam is False
    optimizer = optimizer_class(params_to_optimize, lr=2e-6, betas=(0.9, 0.999), weight_decay=1e-2, eps=1e-8)
    for global_step in range(800):
        # instance image + class (prior preservation) image
        pixel_values = torch.empty(2 * 3 * 512 * 512 * 2, dtype=torch.uint8, device="cuda")
        input_ids = torch.empty(2 * 77 * 8, dtype=torch.uint8, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            latents = vae.encode(pixel_values)
            noisy_latents = torch.empty(2 * 4 * 64 * 64 * 2, dtype=torch.uint8, device="cuda")
            encoder_hidden_states = text_encoder(input_ids)
            model_pred = unet(noisy_latents, global_step, encoder_hidden_states)
            loss = act(512, model_pred)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del pixel_values, input_ids, latents, noisy_latents, encoder_hidden_states, model_pred, loss
    return 0


if __name__ == "__main__":
    sys.exit(main())
