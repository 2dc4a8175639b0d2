"""train_unet.py -- training a latent-diffusion UNet (860M parameters, fp32, no autocast) at batch 64
on a 24 GiB card, the first step:

    unet = UNet2DConditionModel(...).cuda()                      # 3.4 GiB
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    for latents, text_emb in loader:                             # batch 64
        noise_pred = unet(noisy_latents, t, text_emb)            # 19 GiB of saved activations
        loss = F.mse_loss(noise_pred, noise)
        loss.backward()                                          # fails here
        optimizer.step(); optimizer.zero_grad()

The forward pass fits with 0.9 GiB to spare; backward has to allocate the parameters' gradients
(3.4 GiB) while nearly all activations are still held, and fails after 7 of 27 of them.  The
first step, nothing grows, nothing cached, nothing else on the card: the batch is too big for an
fp32 step.  An expert: a smaller batch with gradient accumulation, autocast bf16/fp16, or gradient
checkpointing in the UNet blocks; the optimizer state has not even been created yet.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20


class ResBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))

    def forward(self, h, n_saved):
        for _ in range(n_saved):
            a = torch.empty(480 * MiB, device="cuda")              # saved for backward
            a._saved = h
            h = a
        return h


class UNet(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(27):
            setattr(self, "block%d" % i, ResBlock())

    def forward(self, latents, t, text_emb):
        h = latents
        for i in range(27):
            h = getattr(self, "block%d" % i)(h, 2 if i % 2 == 0 else 1)
        return h


def main():
    unet = UNet().cuda()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-4)
    for step in range(1000):
        latents = torch.empty(4 * MiB, device="cuda")
        text_emb = torch.empty(4 * MiB, device="cuda")
        noise_pred = unet(latents, step, text_emb)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = unet.parameters(), noise_pred
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    # the failing request was a gradient (a 128 MiB segment) on autograd's engine thread; in the
    # first step no segment of the cache is free, so nothing was released between the attempts
    st = torch.cuda.memory_stats()
    scen_truth.mark("fail", 0, scen_truth.torch_segment_size(128 * MiB), allocated=st["allocated_bytes.all.current"],
                    reserved=st["reserved_bytes.all.current"], released=0, fw=1)
    raise
sys.exit(0)
