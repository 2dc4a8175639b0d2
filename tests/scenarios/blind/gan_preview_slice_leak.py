"""train_gan.py -- training a 512 px image GAN (generator and discriminator ~70M parameters each,
fp32, Adam) on a 24 GiB card, with a preview grid of generated images collected for the end of the
epoch:

    previews = []
    for step, real in enumerate(loader):
        fake = G(torch.randn(64, 512, device="cuda"))           # 64 x 3 x 512 x 512 fp32: 192 MiB
        d_loss = D(real).softplus() + D(fake.detach()).softplus(); d_loss.backward(); opt_d.step()
        g_loss = D(fake).neg().softplus();                     g_loss.backward(); opt_g.step()
        if step % 1 == 0:
            previews.append(fake[:8])                           # a view: keeps all 64 images alive

fake[:8] is a view of the whole batch: every step keeps the full 192 MiB generator output (and its
graph) alive.  Weights, grads and Adam states are 2 GiB, a step's activations ~4.5 GiB (from the
cache); memory climbs 192 MiB a step and step ~96 fails.  An expert: a leak across iterations --
keep fake[:8].detach().cpu() (or .clone() of the 8 images) instead; a smaller batch, mixed
precision or a bigger card only postpone it.
"""
import sys
import time
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Net(torch.nn.Module):
    def __init__(self, n_layers):
        torch.nn.Module.__init__(self)
        for i in range(n_layers):
            setattr(self, "conv%d" % i, torch.nn.Parameter(torch.empty(32 * MiB, device="cuda")))
        self.n_layers = n_layers

    def forward(self, x, act_mib):
        h = x
        for _ in range(self.n_layers):
            a = torch.empty(act_mib * MiB, device="cuda")
            a._saved = h
            h = a
        return h


def first_rows(t, n):
    """t[:n]: a view that shares (and keeps alive) t's whole storage."""
    return t.view()


def main():
    G, D = Net(8), Net(8)
    opt_g = torch.optim.AdamW(G.parameters(), lr=2e-4, betas=(0.0, 0.99))
    opt_d = torch.optim.AdamW(D.parameters(), lr=2e-4, betas=(0.0, 0.99))
    previews = []
    for step in range(10000):
        real = torch.empty(192 * MiB, device="cuda")
        z = torch.empty(64 * 512 * 4, device="cuda")
        h = G(z, 256)                                          # generator activations, 2 GiB
        fake = torch.empty(192 * MiB, device="cuda")
        fake._saved, fake._params = h, tuple(G.parameters())
        d_out = D(real, 128)
        d_out._params = tuple(D.parameters())
        scen_truth.backward(d_out)                             # d_loss.backward()
        opt_d.step()
        g_out = D(fake, 128)
        g_out._params = tuple(G.parameters()) + tuple(D.parameters())
        scen_truth.backward(g_out)                             # g_loss.backward(): frees G's saved activations
        opt_g.step()
        opt_d.zero_grad(set_to_none=True)
        opt_g.zero_grad(set_to_none=True)
        previews.append(first_rows(fake, 8))
        del real, z, h, fake, d_out, g_out
        time.sleep(0.003)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
