"""train_motion_module.py -- training AnimateDiff's motion modules (453M params, fp32) on WebVid clips
over a frozen SD 1.5 UNet (fp16), 16 frames at 512x512, batch 1, on one L4 (24 GB, 22.5 GiB usable),
PyTorch 2.1, with plain `LD_PRELOAD=liboomguard.so`.  The user's copy of AnimateDiff's train.py has
mixed precision on (torch.autocast fp16 + GradScaler) but left the config's
`gradient_checkpointing: False`:

    unet = UNet3DConditionModel.from_pretrained_2d(..., unet_additional_kwargs=motion_module_kwargs)
    unet.requires_grad_(False)
    for name, p in unet.named_parameters():
        if "motion_modules." in name: p.requires_grad = True
    optimizer = torch.optim.AdamW(trainable_params, lr=1e-4)
    for batch in loader:                                  # pixel_values: 1 x 16 x 3 x 512 x 512
        with torch.cuda.amp.autocast():
            model_pred = unet(noisy_latents, timesteps, encoder_hidden_states).sample
            loss = F.mse_loss(model_pred.float(), target.float())
        scaler.scale(loss).backward()

The 16 frames run through every spatial layer as a batch of 16 and through every temporal layer,
and without checkpointing each block keeps its resnet, spatial-attention and temporal-attention
activations for backward: ~1.3 GiB per block, 27 GiB for the UNet.  The very first forward pass
dies in the 15th block; weights are 3.6 GiB, no gradients or optimizer state exist yet.  An
expert: turn gradient checkpointing on (unet.enable_gradient_checkpointing(); the config flag);
fewer frames would also do but changes the model's task.  Not a smaller batch (it is 1), not
mixed precision (on), not an 8-bit optimizer or LoRA (the state is not what fills the card), not
inference mode.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 1
video_length = 16


def saved(n_bytes, src):
    t = torch.empty(n_bytes // 2, dtype=torch.float16, device="cuda")
    t._saved = src
    return torch.autograd._graph.derive(t, src)


class Frozen(torch.nn.Module):
    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes // 2, dtype=torch.float16, device="cuda"),
                                         requires_grad=False)


class ResnetBlock3D(Frozen):
    def forward(self, x):
        h = saved(160 * MiB, x)
        return saved(160 * MiB, h)


class Transformer3DModel(Frozen):
    def forward(self, x, encoder_hidden_states):
        h = x
        for _ in range(4):                      # norm, q/k/v, attention output, feed-forward
            h = saved(160 * MiB, h)
        return h


class TemporalTransformer3DModel(torch.nn.Module):
    """the motion module: attention over the 16 frames at every pixel, fp32 weights, trainable"""

    def __init__(self, nbytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(nbytes, device="cuda"))

    def forward(self, x):
        h = saved(160 * MiB, x)
        h = saved(160 * MiB, h)
        return torch.autograd._graph.derive(h, self.weight)


class UNetBlock3D(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.resnet = ResnetBlock3D(30 * MiB)
        self.attention = Transformer3DModel(46 * MiB)
        self.motion_module = TemporalTransformer3DModel(80 * MiB)

    def forward(self, x, encoder_hidden_states):
        h = self.resnet(x)
        h = self.attention(h, encoder_hidden_states)
        return self.motion_module(h)


class UNet3DConditionModel(torch.nn.Module):
    gradient_checkpointing = False

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(21):
            setattr(self, "block_%d" % i, UNetBlock3D())
        self.conv_in_out = Frozen(40 * MiB)

    def enable_gradient_checkpointing(self):
        self.gradient_checkpointing = True

    def forward(self, sample, timestep, encoder_hidden_states):
        h = sample
        for i in range(21):
            h = getattr(self, "block_%d" % i)(h, encoder_hidden_states)
        return h


def main():
    unet = UNet3DConditionModel()
    vae = Frozen(160 * MiB)
    text_encoder = Frozen(235 * MiB)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    trainable_params = [p for p in unet.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable_params, lr=1e-4)
    unet.train()
    for step in range(100000):
        with torch.no_grad():
            pixel_values = torch.empty(batch_size * video_length * 3 * 512 * 512, dtype=torch.float16, device="cuda")
            latents = torch.empty(batch_size * video_length * 4 * 64 * 64, dtype=torch.float16, device="cuda")
            encoder_hidden_states = torch.empty(batch_size * 77 * 768, dtype=torch.float16, device="cuda")
        noisy_latents = latents
        with torch.autocast("cuda", dtype=torch.float16):
            model_pred = unet(noisy_latents, step, encoder_hidden_states)
            loss = saved(1024, model_pred)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except torch.OutOfMemoryError:
        raise
