"""train.py of graphdeco-inria/gaussian-splatting, run as the README says by a surveying firm's
photogrammetry engineer on a workstation with one RTX 4090 (24 GB):

    python train.py -s sites/quarry_north -m output/quarry_north --eval

The site is a quarry flown with a DJI Mavic 3 Enterprise: 720 training photos (5280x3956; 3DGS scales
anything wider than 1.6K down to 1600x1199), COLMAP gives 580k sparse points.  Scene() reads every
camera and keeps its photo as a float32 tensor on --data_device, whose default is "cuda":

    self.original_image = image.clamp(0.0, 1.0).to(self.data_device)      # scene/cameras.py

720 x 23 MB = 15.4 GiB of photos on the GPU before the first iteration.  Training then grows the model
by design: densification every 100 iterations (500 to 15,000) clones and splits Gaussians -- ~1.4 KB
each with their Adam moments, gradients and the rasterizer's per-Gaussian buffers; on this gravel-rich
scene the count would level off near 7.7M (9.8 GiB).  Around iteration 4,600, at ~4.1M Gaussians,
densification's torch.cat of the SH coefficients (757 MiB) fails.  By then ~3.4 GiB of the cache is in
pieces (the Gaussians' tensors change size every 100 iterations), so the message shows a lot "reserved
but unallocated".

An expert: the photos do not need to live on the GPU -- one is used per iteration.  --data_device cpu
(the README recommends it for large or high-resolution datasets) gives back 15.4 GiB for a 23 MB copy
per iteration, and the whole run fits.  Second: limit the growth (a higher --densify_grad_threshold, an
earlier --densify_until_iter) or train at -r 2.  expandable_segments would recover the fragmented ~3.4
GiB, worth 2,000-3,000 more iterations, and the run would still die before densification ends: a fair
later step, not the fix.  Wrong first advice: a smaller batch (one image per iteration),
mixed precision (the rasterizer is float32-only), gradient checkpointing, flash attention or shorter
sequences (no transformer), empty_cache (the photos and the Gaussians are live), an 8-bit optimizer.
"""
import math
import random
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

nn = torch.nn
f32 = torch.float32


# ---- torch.optim.Adam (the stand-in has AdamW only): exp_avg and exp_avg_sq per parameter, made at the
# ---- first step, kept in optimizer.state keyed by the parameter, as 3DGS's cat/prune code rewrites them ----
import torch.optim.optimizer as _optim_mod  # noqa: E402


class Adam(_optim_mod.Optimizer):
    def __init__(self, params, lr=0.0, eps=1e-15):
        groups = list(params)
        _optim_mod.Optimizer.__init__(self, [], dict(lr=lr, eps=eps))
        self.param_groups = [dict(g, lr=g.get("lr", lr), eps=eps) for g in groups]

    def _update(self):
        for g in self.param_groups:
            for p in g["params"]:
                if p not in self.state:
                    self.state[p] = {"step": 0, "exp_avg": torch.empty(p.nbytes // 4, dtype=f32, device="cuda"),
                                     "exp_avg_sq": torch.empty(p.nbytes // 4, dtype=f32, device="cuda")}
                self.state[p]["step"] += 1


torch.optim.Adam = Adam


# ---- scene/cameras.py, scene/__init__.py ----
class Camera(object):
    def __init__(self, uid, width, height, data_device="cuda"):
        self.uid, self.image_width, self.image_height = uid, width, height
        self.data_device = data_device
        self.original_image = torch.empty(3 * height * width, dtype=f32, device=data_device)   # .to(data_device)


class Scene(object):
    def __init__(self, args, gaussians):
        self.gaussians = gaussians
        self.train_cameras = [Camera(i, 1600, 1199, args.data_device) for i in range(720)]
        self.cameras_extent = 212.0
        gaussians.create_from_pcd(580000)

    def getTrainCameras(self):
        return self.train_cameras


# ---- scene/gaussian_model.py ----
PARAMS = (("xyz", 3), ("f_dc", 3), ("f_rest", 45), ("opacity", 1), ("scaling", 3), ("rotation", 4))


class GaussianModel(object):
    def __init__(self, sh_degree=3):
        self.max_sh_degree = sh_degree
        self.optimizer = None
        self.n = 0

    def _param(self, n, width):
        return nn.Parameter(torch.empty(n * width, dtype=f32, device="cuda"))

    def create_from_pcd(self, n):
        self.n = n
        self.params = dict((name, self._param(n, w)) for name, w in PARAMS)
        self.max_radii2D = torch.empty(n, dtype=f32, device="cuda")
        self.xyz_gradient_accum = torch.empty(n, dtype=f32, device="cuda")
        self.denom = torch.empty(n, dtype=f32, device="cuda")

    def training_setup(self):
        self.optimizer = torch.optim.Adam([{"params": [self.params[name]], "name": name} for name, _ in PARAMS],
                                          lr=0.0, eps=1e-15)

    def _replace(self, new_n):
        """cat_tensors_to_optimizer / _prune_optimizer: for each group, the two Adam moments and then the
        parameter made anew at the new size (torch.cat with zeros / boolean mask), each replacing the old one
        as it is stored."""
        for g in self.optimizer.param_groups:
            old = g["params"][0]
            width = dict(PARAMS)[g["name"]]
            st = self.optimizer.state.pop(old, None)
            if st is not None:
                st["exp_avg"] = torch.empty(new_n * width, dtype=f32, device="cuda")
                st["exp_avg_sq"] = torch.empty(new_n * width, dtype=f32, device="cuda")
            del old
            self.params[g["name"]] = g["params"][0] = None
            g["params"][0] = self._param(new_n, width)
            self.params[g["name"]] = g["params"][0]
            if st is not None:
                self.optimizer.state[g["params"][0]] = st
        self.n = new_n
        self.xyz_gradient_accum = torch.empty(new_n, dtype=f32, device="cuda")
        self.denom = torch.empty(new_n, dtype=f32, device="cuda")
        self.max_radii2D = torch.empty(new_n, dtype=f32, device="cuda")

    def densify_and_prune(self, max_grad, min_opacity, extent, max_screen_size, iteration):
        n = self.n
        grown = int(n * 0.09 * math.exp(-(iteration - 500) / 3500.0))        # net new after clone + split
        self._replace(n + grown + grown // 2)                                  # densification_postfix (cat)
        self._replace(n + grown - int(n * 0.003))                              # prune: split originals, low opacity

    def add_densification_stats(self, viewspace_point_tensor, update_filter):
        pass


# ---- diff_gaussian_rasterization (its CUDA code allocates through PyTorch: torch::empty + resize) ----
class GaussianRasterizer(nn.Module):
    def forward(self, means3D, means2D, opacities, shs, scales, rotations, n, pixels):
        geom_buffer = torch.empty(n * 88, dtype=torch.uint8, device="cuda")
        num_rendered = n * 9                                    # tile-overlap instances (16x16 tiles)
        binning_buffer = torch.empty(num_rendered * 32, dtype=torch.uint8, device="cuda")
        img_buffer = torch.empty(pixels * 16, dtype=torch.uint8, device="cuda")
        color = torch.empty(3 * pixels, dtype=f32, device="cuda")
        radii = torch.empty(n, dtype=torch.float32, device="cuda")
        color._saved = (geom_buffer, binning_buffer, img_buffer)   # ctx.save_for_backward(...)
        return color, radii


def render(viewpoint_camera, pc, bg_color):
    screenspace_points = torch.empty(pc.n * 3, dtype=f32, device="cuda")
    screenspace_points.requires_grad_(True)
    rasterizer = GaussianRasterizer()
    p = pc.params
    image, radii = rasterizer(p["xyz"], screenspace_points, p["opacity"], (p["f_dc"], p["f_rest"]),
                              p["scaling"], p["rotation"], pc.n,
                              viewpoint_camera.image_width * viewpoint_camera.image_height)
    return {"render": image, "viewspace_points": screenspace_points, "visibility_filter": radii, "radii": radii}


def l1_loss(a, b):
    out = torch.empty(a.nbytes // 4, dtype=f32, device="cuda")
    out._saved = a
    return torch._derive(out, a)


def ssim(a, b):
    maps = [torch.empty(a.nbytes // 4, dtype=f32, device="cuda") for _ in range(5)]   # mu1, mu2, sigma1/2/12
    out = torch.empty(a.nbytes // 4, dtype=f32, device="cuda")
    out._saved = a
    del maps
    return torch._derive(out, a)


def backward(loss):
    """(simulation) loss.backward(), then what PyTorch does with the graph after it: the tensors saved for
    backward (the rasterizer's buffers, the losses' inputs) are freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(saved if isinstance(saved, (tuple, list)) else [saved])


# ---- arguments/__init__.py (defaults) and train.py ----
class ModelParams(object):
    data_device = "cuda"
    resolution = -1
    sh_degree = 3


class OptimizationParams(object):
    iterations = 30000
    densify_from_iter = 500
    densify_until_iter = 15000
    densification_interval = 100
    opacity_reset_interval = 3000
    densify_grad_threshold = 0.0002
    lambda_dssim = 0.2


def training(dataset, opt):
    gaussians = GaussianModel(dataset.sh_degree)
    scene = Scene(dataset, gaussians)
    gaussians.training_setup()
    print("%d cameras loaded, %.1f GiB allocated" % (len(scene.getTrainCameras()),
                                                   torch.cuda.memory_allocated() / 2.0 ** 30))
    viewpoint_stack = None
    for iteration in range(1, opt.iterations + 1):
        if not viewpoint_stack:
            viewpoint_stack = scene.getTrainCameras().copy()
        viewpoint_cam = viewpoint_stack.pop(random.randint(0, len(viewpoint_stack) - 1))
        render_pkg = render(viewpoint_cam, gaussians, None)
        image, viewspace_point_tensor, visibility_filter, radii = (
            render_pkg["render"], render_pkg["viewspace_points"], render_pkg["visibility_filter"], render_pkg["radii"])
        gt_image = viewpoint_cam.original_image
        Ll1 = l1_loss(image, gt_image)
        loss = ssim(Ll1, gt_image)
        backward(loss)
        del render_pkg, image, loss, Ll1
        with torch.no_grad():
            if iteration < opt.densify_until_iter:
                gaussians.add_densification_stats(viewspace_point_tensor, visibility_filter)
                if iteration > opt.densify_from_iter and iteration % opt.densification_interval == 0:
                    size_threshold = 20 if iteration > opt.opacity_reset_interval else None
                    gaussians.densify_and_prune(opt.densify_grad_threshold, 0.005, scene.cameras_extent,
                                                size_threshold, iteration)
            if iteration < opt.iterations:
                gaussians.optimizer.step()
                gaussians.optimizer.zero_grad(set_to_none=True)
        if iteration % 1000 == 0:
            print("[ITER %d] %d Gaussians, allocated %.1f GiB" % (iteration, gaussians.n,
                                                                 torch.cuda.memory_allocated() / 2.0 ** 30))


random.seed(0)
try:
    training(ModelParams(), OptimizationParams())
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
