"""train_t2i_reward.py -- reward fine-tuning of a text-to-image UNet in PyTorch, where the reward is
an aesthetic scorer the team has in JAX/Flax (loaded once at start-up, called on the decoded images
of every step), on a 24 GiB card:

    import jax, jax.numpy as jnp
    from aesthetic_flax import load_scorer
    scorer = load_scorer("ckpt/aesthetic")              # first JAX use on the GPU
    unet = UNet.from_pretrained(base).cuda()            # PyTorch, 2.5 GiB fp32
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5)
    for prompts in loader:
        images = sample(unet, prompts); reward = scorer(jax_from_torch(images))
        ...

At its first GPU use XLA's client preallocates 75% of the card (18 GiB) for its own arena, whatever
the 300 MiB scorer needs; PyTorch, in the same process, is left ~5.5 GiB and the UNet's first
training forward fails.  An expert: stop JAX from preallocating (XLA_PYTHON_CLIENT_PREALLOCATE=false,
or XLA_PYTHON_CLIENT_MEM_FRACTION=.05, or run the scorer on the CPU); the PyTorch job alone fits
in ~17 GiB.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


def load_scorer(path):
    """aesthetic_flax.load_scorer: a CLIP-L image tower + MLP head as Flax params on the GPU."""
    import jax
    import jax.numpy as jnp
    params = [jnp.zeros((64, 1024, 1024), dtype=jnp.float32) for _ in range(1)]      # 256 MiB
    head = jnp.zeros((1024, 1024), dtype=jnp.float32)
    return {"params": params, "head": head, "device": jax.devices()[0]}


class UNet(torch.nn.Module):
    def __init__(self, n_blocks=20):
        torch.nn.Module.__init__(self)
        for i in range(n_blocks):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))
        self.n_blocks = n_blocks

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, latents):
        h = latents
        for _ in range(self.n_blocks):
            a = torch.empty(320 * MiB, device="cuda")     # saved for backward
            a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    scorer = load_scorer("ckpt/aesthetic")
    unet = UNet.from_pretrained("base/unet").cuda()
    optimizer = torch.optim.AdamW(unet.parameters(), lr=1e-5)
    for step in range(10000):
        latents = torch.empty(8 * 4 * 64 * 64 * 4, device="cuda")
        loss = unet(latents)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, latents


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
