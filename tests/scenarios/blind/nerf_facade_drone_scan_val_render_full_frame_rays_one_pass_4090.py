"""train_facade.py -- a heritage-survey firm reconstructs a church facade from 240 drone photos (DJI Phantom 4
Pro, 5472 x 3648, used at half resolution: 2736 x 1824) with its own hash-grid NeRF, written in plain PyTorch
after instant-ngp / nerfacto (16-level hash encoding, 2^19 entries x 2 features per level, tiny MLPs; 0.07 GiB
of parameters), on one RTX 4090 (24 GB, 23.5 GiB usable).  Training samples 8,192 random rays per step, 96
points per ray, and fits easily (~3 GiB of activations).  Every 1,000 steps it renders a held-out photo to
log its PSNR:

    @torch.no_grad()
    def evaluate(model, view):
        rays_o, rays_d = view.rays()                   # one ray per pixel, on the GPU
        rgb = render_rays(model, rays_o, rays_d)       # the same function training uses
        return psnr(rgb, view.rgb)

    for step in range(1, max_steps + 1):
        rays_o, rays_d, target = train_rays.sample(batch_size)        # 8192 rays
        rgb = render_rays(model, rays_o, rays_d)
        loss = F.mse_loss(rgb, target)
        optimizer.zero_grad(); loss.backward(); optimizer.step()
        if step % 1000 == 0:
            log(step, evaluate(model, val_views[0]))

render_rays handles every ray it is given at once.  For the validation photo that is 2736 x 1824 = 5.0 M
rays, 479 M sample points: their positions alone are 5.4 GiB, and the hash encoding's first level asks for
28.6 GiB (the 8 corner indices of every point, int64).  Training ran for 1,000 steps; the first validation
render fails with CUDA out of memory.  Autograd is off there; the training state (weights, gradients, AdamW
moments) is 0.26 GiB.

An expert: the phase decides it -- training fits, the evaluation pass does not, because it renders a whole
frame in one batch.  Render the validation image in chunks of rays (e.g. 32-64 K rays per chunk, what
nerfstudio's eval_num_rays_per_chunk does) and concatenate the colours, or evaluate on a downscaled view.
Wrong first advice: a smaller training batch, gradient checkpointing or mixed precision (the training step is
not what failed, and halving 60+ GiB is not enough), inference_mode or no_grad (already off), freeing the
training state (0.26 GiB), an 8-bit optimizer, empty_cache or expandable_segments, a bigger GPU (no GPU holds
this render).
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

LEVELS, TABLE, FEATURES, WIDTH = 16, 2 ** 19, 2, 64

# --------------------------------------------------------------------------------------------------------------
# What the stand-in torch lacks, written as PyTorch does it: an operation's output is in its inputs' graph with
# autograd on (torch._derive) and keeps what its backward needs (`_saved`); backward() frees those (as with
# retain_graph=False); nn.Linear; F.mse_loss; torch.no_grad as a decorator.  Sizes: elements x dtype.


def _op(elements, inputs, saves=None, dtype=torch.float32):
    out = torch.empty(elements, dtype=dtype, device="cuda")
    if torch.is_grad_enabled():
        out._saved = saves
        torch._derive(out, *inputs)
    return out


_plain_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    _plain_backward(self, gradient, retain_graph, create_graph, inputs)
    if not retain_graph:
        todo, seen = [self], set()
        while todo:
            t = todo.pop()
            if id(t) in seen or not isinstance(t, torch.Tensor):
                continue
            seen.add(id(t))
            saved = t.__dict__.get("_saved")
            if saved is not None:
                todo.extend(saved if isinstance(saved, (tuple, list)) else (saved,))
                t._saved = None


torch.Tensor.backward = _backward


class no_grad(torch.no_grad):
    """torch.no_grad, also as a decorator (torch.utils._contextlib.decorate_context)."""

    def __call__(self, func):
        def decorate_context(*args, **kwargs):
            with no_grad():
                return func(*args, **kwargs)
        return decorate_context


torch.no_grad = no_grad


def mse_loss(input, target):
    return _op(1, (input,), saves=(input, target))


F.mse_loss = mse_loss


class Linear(torch.nn.Module):
    def __init__(self, n_in, n_out):
        torch.nn.Module.__init__(self)
        self.out_features = n_out
        self.weight = torch.nn.Parameter(torch.empty(n_in * n_out + n_out, dtype=torch.float32, device="cuda"))

    def forward(self, x, n):
        return _op(n * self.out_features, (x,), saves=x)


# --------------------------------------------------------------------------------------------------------------
# train_facade.py
class HashEncoding(torch.nn.Module):
    """Multiresolution hash encoding in plain PyTorch: per level, the 8 corners of each point's cell are hashed
    into the level's table, their features gathered and trilinearly interpolated."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(LEVELS * TABLE * FEATURES, dtype=torch.float32,
                                                         device="cuda"))

    def forward(self, x, n):
        levels = []
        for level in range(LEVELS):
            corners = torch.empty(n * 8 * 8, dtype=torch.uint8, device="cuda")       # int64 indices (n, 8)
            weights = _op(n * 8, (x,), saves=x)                                       # trilinear weights
            feats = _op(n * 8 * FEATURES, (self.embeddings,), saves=corners)          # embeddings[corners]
            levels.append(_op(n * FEATURES, (feats, weights), saves=(feats, weights)))
            del corners, weights, feats
        return _op(n * LEVELS * FEATURES, levels)                                      # torch.cat(levels, -1)


class FacadeField(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.encoding = HashEncoding()
        self.density_0 = Linear(LEVELS * FEATURES, WIDTH)
        self.density_1 = Linear(WIDTH, 16)
        self.color_0 = Linear(16 + 16, WIDTH)
        self.color_1 = Linear(WIDTH, WIDTH)
        self.color_2 = Linear(WIDTH, 3)

    def forward(self, positions, dirs_sh, n):
        h = self.encoding(positions, n)
        h = _op(n * WIDTH, (self.density_0(h, n),), saves=None)          # ReLU (in place in the real code)
        geo = self.density_1(h, n)
        h = _op(n * 32, (geo, dirs_sh))                                   # torch.cat([geo, sh(dirs)], -1)
        h = self.color_1(self.color_0(h, n), n)
        rgb = self.color_2(h, n)
        sigma = _op(n, (geo,), saves=geo)                                 # trunc_exp(geo[..., 0])
        return rgb, sigma


class Rays(object):
    def __init__(self, count):
        self.count = count
        self.o = torch.empty(count * 3, dtype=torch.float32, device="cuda")
        self.d = torch.empty(count * 3, dtype=torch.float32, device="cuda")


def render_rays(model, rays, samples_per_ray=96):
    n = rays.count * samples_per_ray
    t_vals = torch.empty(rays.count * (samples_per_ray + 1), dtype=torch.float32, device="cuda")   # stratified
    positions = _op(n * 3, (rays.o,))                                  # rays_o + rays_d * t
    dirs_sh = torch.empty(n * 16, dtype=torch.float32, device="cuda")  # spherical harmonics of the directions
    rgb, sigma = model(positions, dirs_sh, n)
    weights = _op(n, (sigma,), saves=(sigma, t_vals))                  # alpha compositing
    return _op(rays.count * 3, (rgb, weights), saves=(rgb, weights))


class View(object):
    def __init__(self, width, height):
        self.width, self.height = width, height
        self.rgb = torch.empty(width * height * 3, dtype=torch.uint8, device="cuda")

    def rays(self):
        return Rays(self.width * self.height)


class TrainRays(object):
    """The training photos stay in pinned host memory; each step moves its random rays' data to the GPU."""

    def sample(self, batch_size):
        rays = Rays(batch_size)
        target = torch.empty(batch_size * 3, dtype=torch.float32, device="cuda")
        return rays, target


@torch.no_grad()
def evaluate(model, view):
    rays = view.rays()
    rgb = render_rays(model, rays)
    return 10.0


def main():
    batch_size, max_steps = 8192, 30000
    train_rays = TrainRays()
    val_views = [View(2736, 1824)]
    model = FacadeField()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-15, weight_decay=0.0)
    for step in range(1, max_steps + 1):
        rays, target = train_rays.sample(batch_size)
        rgb = render_rays(model, rays)
        loss = F.mse_loss(rgb, target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step % 1000 == 0:
            psnr = evaluate(model, val_views[0])
            print("step %d  val PSNR %.2f dB" % (step, psnr))
        elif step % 250 == 0:
            print("step %d  allocated %.2f GiB, reserved %.2f GiB" % (step, torch.cuda.memory_allocated() / 2 ** 30,
                                                                     torch.cuda.memory_reserved() / 2 ** 30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
