"""CorrDiff-style km-scale downscaling with a hand-written EDM sampler that forgot torch.no_grad() (L40S 48GB).

The real program (downscale_typhoon_cases.py) generates 2 km fields (4 output channels: 2 m temperature, 10 m
winds, radar reflectivity) over a 448 x 448 Taiwan domain from 12 ERA5 channels, CorrDiff's two stages:
a regression UNet predicts the conditional mean, a diffusion UNet (EDM preconditioning) samples the residual.
The author did not want Modulus' Hydra generate.py for 40 typhoon cases, and wrote:

    reg_net = SongUNet(...); reg_net.load_state_dict(torch.load("regression.pt", map_location="cpu"))
    res_net = EDMPrecondSR(SongUNet(...)); res_net.load_state_dict(...)
    reg_net.eval().to("cuda"); res_net.eval().to("cuda")
    for case in cases:                                  # 40 typhoon cases
        img_lr = load_era5_case(case)                   # 1 x 12 x 448 x 448, on the GPU
        for seeds in chunked(range(32), seed_batch_size=1):
            mean_hr = regression_step(reg_net, img_lr)
            res = edm_sampler(res_net, latents, torch.cat([mean_hr, img_lr], 1), num_steps=18)
            ensemble.append((mean_hr + res).cpu())

Modulus wraps all of generation in torch.no_grad() / inference_mode; this script does not, and eval() does
not turn autograd off.  The parameters require grad, so every UNet call records its graph, and the sampler
chains the calls: d_cur = (x_hat - denoised) / t_hat, x_next = x_hat + (t_next - t_hat) * d_cur, the Heun
correction calls the net again on x_next, and x_cur of the next step is that x_next.  Each x_next therefore
keeps every earlier denoiser call's activations (and the regression call's, through mean_hr in the
conditioning) alive.

Sizes (seed_batch_size 1, fp32): a 448 x 448 map of 128 channels is 103 MB; one UNet
call keeps ~5.5 GiB for backward (the 448 and 224 levels dominate); the two nets' weights are ~0.4 GiB.
  regression call                                  +5.5 GiB
  each sampler step: denoiser + Heun correction   +11.0 GiB
  L40S 46,068 MiB: after the regression and three steps ~39 GiB; the fourth step's first denoiser call
  (step index 3 of 18, first ensemble member of the first case) runs out near the end of its forward,
  asking for another ~100 MB with ~44 GiB allocated.
Under torch.no_grad() the whole sample peaks at ~1.3 GiB (weights plus one call's transient maps).

What an expert says: an inference-only job with autograd on; memory climbs by two UNet calls per sampler step
because the graphs are chained through x_next; wrap generation in torch.inference_mode() (or no_grad),
which is what Modulus' generate.py does.  Wrong advice: a smaller seed batch (it is 1 already; 18 steps always
chain), gradient checkpointing (there is no backward), mixed precision / quantisation / a bigger card (still
grows without bound), expandable segments / empty_cache (nothing is cached, everything is live).
"""
import math

import torch
import scen_truth

scen_truth.note_every_empty(torch)

from torch import nn

device = "cuda"

DOMAIN = 448
IN_CHANNELS = 12            # ERA5 predictors
OUT_CHANNELS = 4            # t2m, u10m, v10m, radar
SEED_BATCH_SIZE = 1
NUM_ENSEMBLE = 32
NUM_STEPS = 18
SIGMA_MIN, SIGMA_MAX, RHO = 0.002, 800.0, 7.0

CASES = ["haikui_2023", "koinu_2023", "gaemi_2024", "krathon_2024", "kong-rey_2024"]


# --- what torch's tensor arithmetic gives the real program (the stand-in torch has none) ----------------
def field(batch, channels, res=DOMAIN):
    return torch.empty(batch * channels * res * res, dtype=torch.float32, device=device)


def combine(first, *others):
    """first op others (x + a * y, (x - y) / t, torch.cat): a new tensor of first's size; under autograd it
    keeps the operands it needs for backward"""
    out = first.clone()
    if torch.is_grad_enabled():
        out._saved = (first,) + others
    return out


def join(out, *inputs):
    """out made from inputs (torch.cat, a resampling, a conv): under autograd the graph keeps the inputs"""
    if torch.is_grad_enabled():
        out._saved = tuple(t for t in inputs if t is not None)
    return out


# --- the networks -----------------------------------------------------------------------------------------
class Conv3x3(nn.Module):
    def __init__(self, cin, cout):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(cin * cout * 9, dtype=torch.float32, device=device))
        self.bias = nn.Parameter(torch.empty(cout, dtype=torch.float32, device=device))


class UNetBlock(nn.Module):
    """GroupNorm -> SiLU -> conv3x3 -> (+emb) -> GroupNorm -> SiLU -> dropout -> conv3x3 -> +skip"""

    def __init__(self, cin, cout, res, attention=False):
        nn.Module.__init__(self)
        self.cin, self.cout, self.res, self.attention = cin, cout, res, attention
        self.conv0 = Conv3x3(cin, cout)
        self.conv1 = Conv3x3(cout, cout)
        self.affine = nn.Parameter(torch.empty(512 * cout * 2, dtype=torch.float32, device=device))
        if attention:
            self.qkv = nn.Parameter(torch.empty(cout * cout * 3, dtype=torch.float32, device=device))
            self.proj = nn.Parameter(torch.empty(cout * cout, dtype=torch.float32, device=device))

    def forward(self, x, emb):
        batch = x.nbytes // 4 // (self.cin * self.res * self.res)
        kept = []
        h = field(batch, self.cin, self.res)            # norm0 + silu
        kept.append(h)
        h = field(batch, self.cout, self.res)           # conv0 (+ emb)
        kept.append(h)
        h = field(batch, self.cout, self.res)           # norm1 + silu + dropout
        kept.append(h)
        if self.attention:
            tokens = self.res * self.res
            scores = torch.empty(batch * tokens * tokens, dtype=torch.float32, device=device)
            kept.append(scores)
        out = field(batch, self.cout, self.res)         # conv1 + skip
        if torch.is_grad_enabled():
            out._saved = tuple(kept) + (x,)
        return out


class SongUNet(nn.Module):
    """model_channels 128, channel_mult [1, 2, 2, 2, 2], num_blocks 2, attention at 28 x 28"""

    def __init__(self, in_channels, out_channels, model_channels=128, channel_mult=(1, 2, 2, 2, 2),
                 num_blocks=2):
        nn.Module.__init__(self)
        self.in_channels, self.out_channels = in_channels, out_channels
        self.map_noise = nn.Parameter(torch.empty(model_channels * 512, dtype=torch.float32, device=device))
        self.inp = Conv3x3(in_channels, model_channels)
        enc, dec = [], []
        cin = model_channels
        skips = []
        for level, mult in enumerate(channel_mult):
            res = DOMAIN >> level
            cout = model_channels * mult
            if level > 0:
                enc.append(UNetBlock(cin, cin, res * 2))          # downsample
                skips.append(cin)
            for _ in range(num_blocks):
                enc.append(UNetBlock(cin, cout, res, attention=(res == 28)))
                cin = cout
                skips.append(cin)
        for level, mult in reversed(list(enumerate(channel_mult))):
            res = DOMAIN >> level
            cout = model_channels * mult
            for _ in range(num_blocks + 1):
                enc_ch = skips.pop() if skips else 0
                dec.append(UNetBlock(cin + enc_ch, cout, res, attention=(res == 28)))
                cin = cout
            if level > 0:
                dec.append(UNetBlock(cin, cin, res // 2))         # upsample
        self.enc = nn.Module()
        for i, b in enumerate(enc):
            setattr(self.enc, str(i), b)
        self.dec = nn.Module()
        for i, b in enumerate(dec):
            setattr(self.dec, str(i), b)
        self.out = Conv3x3(model_channels, out_channels)

    def forward(self, x, noise_labels=None):
        batch = x.nbytes // 4 // (self.in_channels * DOMAIN * DOMAIN)
        emb = torch.empty(batch * 512, dtype=torch.float32, device=device)
        h = join(field(batch, 128), x)                            # self.inp(x)
        skips = []
        for block in self.enc._modules.values():
            if block.cin * block.res * block.res * 4 * batch != h.nbytes:
                h = join(field(batch, block.cin, block.res), h)   # resampling
            h = block(h, emb)
            skips.append(h)
        for block in self.dec._modules.values():
            skip = skips.pop() if block.cin * block.res * block.res * 4 * batch != h.nbytes and skips else None
            h = join(field(batch, block.cin, block.res), h, skip)   # torch.cat([h, skips.pop()], 1)
            h = block(h, emb)
        del skips
        return join(field(batch, self.out_channels), h)


class EDMPrecondSR(nn.Module):
    def __init__(self, model):
        nn.Module.__init__(self)
        self.model = model

    def forward(self, x, img_lr, sigma):
        # c_in * x concatenated with the conditioning, the net, then c_skip * x + c_out * F_x
        net_in = combine(field(x.nbytes // 4 // (OUT_CHANNELS * DOMAIN * DOMAIN),
                               self.model.in_channels), x, img_lr)
        f_x = self.model(net_in, sigma)
        return combine(f_x, x)


# --- generation, as the script does it --------------------------------------------------------------------
def load_era5_case(case):
    return field(1, IN_CHANNELS)


def regression_step(reg_net, img_lr, batch):
    x = field(batch, OUT_CHANNELS + IN_CHANNELS)                  # torch.cat([zeros, img_lr.expand(batch)])
    return reg_net(x)


def edm_sampler(net, latents, img_lr, num_steps=NUM_STEPS, sigma_min=SIGMA_MIN, sigma_max=SIGMA_MAX, rho=RHO,
                S_churn=0.0, S_noise=1.0):
    t_steps = [(sigma_max ** (1 / rho) + i / (num_steps - 1) * (sigma_min ** (1 / rho) - sigma_max ** (1 / rho)))
               ** rho for i in range(num_steps)] + [0.0]
    x_next = combine(latents)                                     # latents * t_steps[0]
    for i, (t_cur, t_next) in enumerate(zip(t_steps[:-1], t_steps[1:])):
        x_cur = x_next
        gamma = min(S_churn / num_steps, math.sqrt(2) - 1)
        t_hat = t_cur + gamma * t_cur
        x_hat = combine(x_cur, torch.empty_like(x_cur))           # x_cur + sqrt(t_hat^2 - t_cur^2) * S_noise * randn
        denoised = net(x_hat, img_lr, t_hat)
        d_cur = combine(denoised, x_hat)                          # (x_hat - denoised) / t_hat
        x_next = combine(d_cur, x_hat)                            # x_hat + (t_next - t_hat) * d_cur
        if i < num_steps - 1:
            denoised = net(x_next, img_lr, t_next)
            d_prime = combine(denoised, x_next)                   # (x_next - denoised) / t_next
            x_next = combine(d_prime, x_hat, d_cur)               # x_hat + (t_next - t_hat) * (d_cur + d_prime) / 2
    return x_next


def main():
    reg_net = SongUNet(OUT_CHANNELS + IN_CHANNELS, OUT_CHANNELS)
    res_net = EDMPrecondSR(SongUNet(OUT_CHANNELS + OUT_CHANNELS + IN_CHANNELS, OUT_CHANNELS))
    reg_net.eval()
    res_net.eval()
    outputs = {}
    for case in CASES:
        img_lr = load_era5_case(case)
        members = []
        for first_seed in range(0, NUM_ENSEMBLE, SEED_BATCH_SIZE):
            mean_hr = regression_step(reg_net, img_lr, SEED_BATCH_SIZE)
            latents = field(SEED_BATCH_SIZE, OUT_CHANNELS)        # torch.randn with the seeds' generators
            cond = combine(field(SEED_BATCH_SIZE, OUT_CHANNELS + IN_CHANNELS), mean_hr, img_lr)
            res = edm_sampler(res_net, latents, cond)
            members.append(combine(res, mean_hr))                 # (mean_hr + res), .cpu() in the real script
            print("%s: members %d-%d done" % (case, first_seed, first_seed + SEED_BATCH_SIZE - 1))
        outputs[case] = members


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
