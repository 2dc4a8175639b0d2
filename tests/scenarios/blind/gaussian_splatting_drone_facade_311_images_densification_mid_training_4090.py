"""train.py (graphdeco-inria/gaussian-splatting, unchanged defaults) -- a survey firm reconstructs a listed
building's facade from a drone flight: 311 photos (DJI, 5280x3956, downscaled by the loader to 1600x1200),
COLMAP gave 412k sparse points.  One RTX 4090 (24 GB):

    python train.py -s data/facade_2024_06 -m output/facade --eval

Two things hold the memory.  The loader puts every training image on the GPU as float32 (Camera's
data_device defaults to "cuda"): 311 x 3 x 1600 x 1200 x 4 B = 6.7 GiB, for the whole run.  And the
model itself grows: densification clones and splits Gaussians every 100 iterations from 500 to 15,000; on
this large, detailed outdoor scene the count climbs from 412k to 7M by iteration 5,800.  Each Gaussian costs
about 2 KB while an iteration runs (59 float parameters, their gradients, Adam's two moments, densification
statistics, the SH features concatenated for the rasterizer, and its per-Gaussian and per-tile buffers of
the forward and backward).  Memory rises with every densification; after the one at iteration 5,800 the
next render's rasterizer binning buffer (3.1 GiB) no longer fits: 2.6 GiB free, and 7.6 GiB cached by the
allocator in pieces between the ever-larger tensors densification rebuilds.  Nothing leaks: every byte is the
model, its optimizer, its images or the frame being rendered, and densification goes on to 15,000.

An expert: keep the images in host memory (--data_device cpu: each is copied to the GPU when its view is
rendered), and/or bound the model -- stop densification earlier or make it stricter (a higher
--densify_grad_threshold, a lower --densify_until_iter), cap the Gaussian count (the MCMC/"cap_max"
strategies of gsplat and later 3DGS versions), or train at a lower resolution (-r 2: 4x smaller images,
and fewer Gaussians are densified).  Wrong first advice: releasing references or empty_cache (nothing is
leaked, and densify_and_prune already calls torch.cuda.empty_cache()), a smaller batch (one view per
iteration), gradient checkpointing, mixed precision, no_grad, quantization; expandable_segments would let
this request through but buys only a few hundred iterations of growth.
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# -----------------------------------------------------------------------------------------------------------
# Stand-ins.  The simulator's torch has the caching allocator and autograd's bookkeeping, but not torch.optim.
# Adam, the CUDA rasterizer or the ops below.  The ops give a tensor a .shape and make its output's memory
# (nothing is computed); they are compiled into torch's own files, as PyTorch's ops are C++.  Comparisons give
# boolean masks that carry how many entries are set: the share of Gaussians over the densification
# thresholds follows the real run's densification curve for this scene.
# -----------------------------------------------------------------------------------------------------------
_OPS = r'''
_plain_view = Tensor.view
_BYTES = {"float32": 4, "int32": 4, "bool": 1}


def _result(shape, dtype="float32", device="cuda", inputs=(), saves=()):
    n = 1
    for d in shape:
        n *= int(d)
    if dtype == "float32":
        t = empty(n, dtype="float32", device=device)
    else:
        t = empty(n * _BYTES[dtype], dtype="uint8", device=device)
        t._dtype = dtype
    t.shape = tuple(int(d) for d in shape)
    if is_grad_enabled() and saves:
        t._saved = tuple(saves)
    return _derive(t, *inputs)


def zeros(*shape, device="cuda", dtype="float32", requires_grad=False):
    if len(shape) == 1 and isinstance(shape[0], tuple):
        shape = shape[0]
    t = _result(shape, dtype, device)
    t.requires_grad = requires_grad
    return t


def zeros_like(t, dtype=None, requires_grad=False, device=None):
    z = _result(t.shape, dtype or t.dtype, t.device)
    z.requires_grad = requires_grad
    return z


def empty_like(t, dtype=None, device=None):
    return _result(t.shape, dtype or t.dtype, t.device)


def cat(tensors, dim=0):
    shape = list(tensors[0].shape)
    shape[dim] = sum(t.shape[dim] for t in tensors)
    return _result(shape, tensors[0].dtype, tensors[0].device, tuple(tensors))


def _mask(n, share):
    m = _result((n,), "bool")
    m.count = int(round(n * share))
    return m


def norm(input, dim=-1, keepdim=False):
    out = _result((input.shape[0],), input.dtype, input.device, (input,))
    out._share = getattr(input, "_share", 0.0)
    return out


def where(condition, x, y):
    return condition


def logical_and(a, b):
    m = _mask(a.shape[0], 0.0)
    m.count = int(round(a.count * b.count / float(a.shape[0])))
    return m


def logical_or(a, b):
    m = _mask(a.shape[0], 0.0)
    m.count = min(a.shape[0], a.count + b.count)
    return m


def _cmp_ge(self, other):
    return _mask(self.shape[0], getattr(self, "_share", 0.0))


def _cmp_le(self, other):
    return _mask(self.shape[0], getattr(self, "_share", 0.5))


def _cmp_gt(self, other):
    return _mask(self.shape[0], 1.0 - getattr(self, "_share", 0.5))


def _cmp_lt(self, other):
    return _mask(self.shape[0], getattr(self, "_share", 0.0))


def _getitem(self, key):
    if isinstance(key, Tensor) and hasattr(key, "count"):            # boolean mask: a copy of the rows kept
        return _result((key.count,) + tuple(self.shape[1:]), self.dtype, self.device, (self,))
    v = _plain_view(self)                                            # [:, :2], [..., 0]: a view
    v.shape = self.shape
    return v


def _setitem(self, key, value):
    pass                                                             # in place


def _invert(self):
    m = _mask(self.shape[0], 0.0)
    m.count = self.shape[0] - self.count
    return m


def _repeat(self, *sizes):
    return _result(tuple(s * r for s, r in zip(self.shape, sizes)) + tuple(self.shape[len(sizes):]), self.dtype,
                   self.device, (self,))


def _add(self, other):
    return _result(self.shape, self.dtype, self.device, (self,) + ((other,) if isinstance(other, Tensor) else ()))


def _div(self, other):
    out = _result(self.shape, self.dtype, self.device, (self, other))
    out._share = getattr(self, "_share", 0.0)
    return out


def _requires_grad_(self, flag=True):
    self.requires_grad = bool(flag)
    return self


def _squeeze(self, dim=None):
    v = _plain_view(self)
    v.shape = tuple(d for d in self.shape if d != 1) or (1,)
    for k in ("count", "_share"):
        if hasattr(self, k):
            setattr(v, k, getattr(self, k))
    return v


Tensor.__getitem__ = _getitem
Tensor.__setitem__ = _setitem
Tensor.__ge__ = _cmp_ge
Tensor.__le__ = _cmp_le
Tensor.__gt__ = _cmp_gt
Tensor.__lt__ = _cmp_lt
Tensor.__invert__ = _invert
Tensor.__truediv__ = _div
Tensor.__add__ = _add
Tensor.repeat = _repeat
Tensor.requires_grad_ = _requires_grad_
Tensor.squeeze = _squeeze
Tensor.retain_grad = lambda self: None
Tensor.max = lambda self, dim=None: types.SimpleNamespace(values=_share_of(self, 0.5))
Tensor.clamp = lambda self, lo=None, hi=None: self
Tensor.cuda = lambda self: self
import types


def _share_of(t, share):
    out = _result((t.shape[0],), t.dtype, t.device, (t,))
    out._share = share
    return out


class _Backward(object):
    def backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
        from torch import autograd
        autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
        if not retain_graph:
            todo, seen = [self], set()
            while todo:
                t = todo.pop()
                if id(t) in seen:
                    continue
                seen.add(id(t))
                s = t.__dict__.pop("_saved", None)
                if s is not None:
                    todo.extend(x for x in (s if isinstance(s, (tuple, list)) else (s,)) if isinstance(x, Tensor))


Tensor.backward = _Backward.__dict__["backward"]
'''
exec(compile(_OPS, torch.__file__, "exec"), torch.__dict__)

_ADAM = r'''
import torch
from torch.optim.optimizer import Optimizer


class Adam(Optimizer):
    """torch.optim.Adam with param groups (dicts with their own "params", "lr", ...); exp_avg and exp_avg_sq,
    each the size of its parameter, made at the parameter's first step."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0):
        Optimizer.__init__(self, [], dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.param_groups = []
        for g in params:
            group = dict(self.defaults)
            group.update(g)
            group["params"] = list(g["params"])
            self.param_groups.append(group)

    def _update(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state.get(p)
                if state is None:
                    self.state[p] = {"step": 0, "exp_avg": torch.zeros_like(p), "exp_avg_sq": torch.zeros_like(p)}
                self.state[p]["step"] += 1

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
'''
_adam_ns = {}
exec(compile(_ADAM, sys.modules["torch.optim.adamw"].__file__, "exec"), _adam_ns)
torch.optim.Adam = _adam_ns["Adam"]

_RASTER = r'''
import torch

TILES_PER_GAUSSIAN = 10                      # mean tiles (16x16 px) a visible Gaussian touches on this scene


class GaussianRasterizationSettings(object):
    def __init__(self, image_height, image_width, **kw):
        self.image_height, self.image_width = image_height, image_width


def rasterize_gaussians(means3D, means2D, sh, colors_precomp, opacities, scales, rotations, cov3Ds_precomp,
                        raster_settings):
    return _RasterizeGaussians.apply(means3D, means2D, sh, colors_precomp, opacities, scales, rotations,
                                     cov3Ds_precomp, raster_settings)


class _RasterizeGaussians(object):
    @staticmethod
    def apply(*args):
        return _RasterizeGaussians.forward(None, *args)

    @staticmethod
    def forward(ctx, means3D, means2D, sh, colors_precomp, opacities, scales, rotations, cov3Ds_precomp,
                raster_settings):
        P = means3D.shape[0]
        H, W = raster_settings.image_height, raster_settings.image_width
        # _C.rasterize_gaussians: geometry, binning (per Gaussian-tile instance, with the radix sort's
        # scratch) and image buffers, kept for the backward pass, then the backward's own per-Gaussian
        # gradient buffers (dL_dmean2D, dL_dconic, dL_dcolors, dL_dcov3D, dL_dsh, ...)
        geomBuffer = torch._result((P, 20))
        binningBuffer = torch._result((P * TILES_PER_GAUSSIAN, 12))
        imgBuffer = torch._result((H * W, 4))
        bwd_workspace = torch._result((P, 80))
        color = torch._result((3, H, W), inputs=(means3D, means2D, sh, opacities, scales, rotations),
                              saves=(geomBuffer, binningBuffer, imgBuffer, bwd_workspace))
        radii = torch._result((P,), "int32")
        return color, radii


class GaussianRasterizer(torch.nn.Module):
    def __init__(self, raster_settings):
        torch.nn.Module.__init__(self)
        self.raster_settings = raster_settings

    def forward(self, means3D, means2D, opacities, shs=None, colors_precomp=None, scales=None, rotations=None,
                cov3D_precomp=None):
        return rasterize_gaussians(means3D, means2D, shs, colors_precomp, opacities, scales, rotations,
                                   cov3D_precomp, self.raster_settings)
'''
diff_gaussian_rasterization = types.ModuleType("diff_gaussian_rasterization")
diff_gaussian_rasterization.__file__ = "/opt/conda/envs/gaussian_splatting/lib/python3.10/site-packages/" \
                                      "diff_gaussian_rasterization/__init__.py"
exec(compile(_RASTER, diff_gaussian_rasterization.__file__, "exec"), diff_gaussian_rasterization.__dict__)
sys.modules["diff_gaussian_rasterization"] = diff_gaussian_rasterization
nn = torch.nn


# share of the Gaussians whose accumulated view-space gradient is over densify_grad_threshold at each
# densification of the real run (high early, as the coarse SfM cloud is refined)
def _share_over_threshold(iteration):
    return 0.075 if iteration < 2000 else 0.055


# --- the scene: COLMAP's sparse cloud and the cameras, as scene/dataset_readers.py + utils/camera_utils.py ---
class Camera(nn.Module):
    def __init__(self, uid, image_width, image_height, data_device="cuda"):
        nn.Module.__init__(self)
        self.uid = uid
        self.data_device = data_device
        self.original_image = torch._result((3, image_height, image_width), device=self.data_device).clamp(0.0, 1.0)
        self.image_width, self.image_height = image_width, image_height


class Scene(object):
    def __init__(self, args, gaussians):
        print("Reading camera %d/%d" % (args.n_images, args.n_images))
        print("Loading Training Cameras")
        self.train_cameras = [Camera(i, 1600, 1200, data_device=args.data_device) for i in range(args.n_images)]
        self.gaussians = gaussians
        self.cameras_extent = 38.0
        print("Number of points at initialisation : ", args.n_sfm_points)
        gaussians.create_from_pcd(args.n_sfm_points, self.cameras_extent)

    def getTrainCameras(self):
        return self.train_cameras


# ===========================================================================================================
# the repository's code as run: scene/gaussian_model.py, gaussian_renderer/__init__.py, train.py
# ===========================================================================================================
from diff_gaussian_rasterization import GaussianRasterizationSettings, GaussianRasterizer  # noqa: E402


class GaussianModel:
    def __init__(self, sh_degree):
        self.active_sh_degree = 0
        self.max_sh_degree = sh_degree
        self.optimizer = None
        self.percent_dense = 0
        self.spatial_lr_scale = 0

    @property
    def get_xyz(self):
        return self._xyz

    @property
    def get_scaling(self):
        return self._scaling

    @property
    def get_features(self):
        features_dc = self._features_dc
        features_rest = self._features_rest
        return torch.cat((features_dc, features_rest), dim=1)

    def create_from_pcd(self, n_points, spatial_lr_scale):
        self.spatial_lr_scale = spatial_lr_scale
        n_rest = (self.max_sh_degree + 1) ** 2 - 1
        self._xyz = nn.Parameter(torch.zeros((n_points, 3)).requires_grad_(True))
        self._features_dc = nn.Parameter(torch.zeros((n_points, 1, 3)).requires_grad_(True))
        self._features_rest = nn.Parameter(torch.zeros((n_points, n_rest, 3)).requires_grad_(True))
        self._scaling = nn.Parameter(torch.zeros((n_points, 3)).requires_grad_(True))
        self._rotation = nn.Parameter(torch.zeros((n_points, 4)).requires_grad_(True))
        self._opacity = nn.Parameter(torch.zeros((n_points, 1)).requires_grad_(True))
        for p in (self._xyz, self._features_dc, self._features_rest, self._scaling, self._rotation, self._opacity):
            p.shape = p._base.shape
        self.max_radii2D = torch.zeros((self.get_xyz.shape[0]), device="cuda")

    def training_setup(self, training_args):
        self.percent_dense = training_args.percent_dense
        self.xyz_gradient_accum = torch.zeros((self.get_xyz.shape[0], 1), device="cuda")
        self.denom = torch.zeros((self.get_xyz.shape[0], 1), device="cuda")
        l = [
            {'params': [self._xyz], 'lr': training_args.position_lr_init * self.spatial_lr_scale, "name": "xyz"},
            {'params': [self._features_dc], 'lr': training_args.feature_lr, "name": "f_dc"},
            {'params': [self._features_rest], 'lr': training_args.feature_lr / 20.0, "name": "f_rest"},
            {'params': [self._opacity], 'lr': training_args.opacity_lr, "name": "opacity"},
            {'params': [self._scaling], 'lr': training_args.scaling_lr, "name": "scaling"},
            {'params': [self._rotation], 'lr': training_args.rotation_lr, "name": "rotation"}
        ]
        self.optimizer = torch.optim.Adam(l, lr=0.0, eps=1e-15)

    def _prune_optimizer(self, mask):
        optimizable_tensors = {}
        for group in self.optimizer.param_groups:
            stored_state = self.optimizer.state.get(group['params'][0], None)
            if stored_state is not None:
                stored_state["exp_avg"] = stored_state["exp_avg"][mask]
                stored_state["exp_avg_sq"] = stored_state["exp_avg_sq"][mask]
                del self.optimizer.state[group['params'][0]]
                group["params"][0] = nn.Parameter((group["params"][0][mask].requires_grad_(True)))
                group["params"][0].shape = group["params"][0]._base.shape
                self.optimizer.state[group['params'][0]] = stored_state
                optimizable_tensors[group["name"]] = group["params"][0]
            else:
                group["params"][0] = nn.Parameter(group["params"][0][mask].requires_grad_(True))
                group["params"][0].shape = group["params"][0]._base.shape
                optimizable_tensors[group["name"]] = group["params"][0]
        return optimizable_tensors

    def prune_points(self, mask):
        valid_points_mask = ~mask
        optimizable_tensors = self._prune_optimizer(valid_points_mask)
        self._xyz = optimizable_tensors["xyz"]
        self._features_dc = optimizable_tensors["f_dc"]
        self._features_rest = optimizable_tensors["f_rest"]
        self._opacity = optimizable_tensors["opacity"]
        self._scaling = optimizable_tensors["scaling"]
        self._rotation = optimizable_tensors["rotation"]
        self.xyz_gradient_accum = self.xyz_gradient_accum[valid_points_mask]
        self.denom = self.denom[valid_points_mask]
        self.max_radii2D = self.max_radii2D[valid_points_mask]

    def cat_tensors_to_optimizer(self, tensors_dict):
        optimizable_tensors = {}
        for group in self.optimizer.param_groups:
            assert len(group["params"]) == 1
            extension_tensor = tensors_dict[group["name"]]
            stored_state = self.optimizer.state.get(group['params'][0], None)
            if stored_state is not None:
                stored_state["exp_avg"] = torch.cat((stored_state["exp_avg"], torch.zeros_like(extension_tensor)), dim=0)
                stored_state["exp_avg_sq"] = torch.cat((stored_state["exp_avg_sq"], torch.zeros_like(extension_tensor)),
                                                       dim=0)
                del self.optimizer.state[group['params'][0]]
                group["params"][0] = nn.Parameter(torch.cat((group["params"][0], extension_tensor), dim=0).requires_grad_(True))
                group["params"][0].shape = group["params"][0]._base.shape
                self.optimizer.state[group['params'][0]] = stored_state
                optimizable_tensors[group["name"]] = group["params"][0]
            else:
                group["params"][0] = nn.Parameter(torch.cat((group["params"][0], extension_tensor), dim=0).requires_grad_(True))
                group["params"][0].shape = group["params"][0]._base.shape
                optimizable_tensors[group["name"]] = group["params"][0]
        return optimizable_tensors

    def densification_postfix(self, new_xyz, new_features_dc, new_features_rest, new_opacities, new_scaling,
                              new_rotation):
        d = {"xyz": new_xyz, "f_dc": new_features_dc, "f_rest": new_features_rest, "opacity": new_opacities,
             "scaling": new_scaling, "rotation": new_rotation}
        optimizable_tensors = self.cat_tensors_to_optimizer(d)
        self._xyz = optimizable_tensors["xyz"]
        self._features_dc = optimizable_tensors["f_dc"]
        self._features_rest = optimizable_tensors["f_rest"]
        self._opacity = optimizable_tensors["opacity"]
        self._scaling = optimizable_tensors["scaling"]
        self._rotation = optimizable_tensors["rotation"]
        self.xyz_gradient_accum = torch.zeros((self.get_xyz.shape[0], 1), device="cuda")
        self.denom = torch.zeros((self.get_xyz.shape[0], 1), device="cuda")
        self.max_radii2D = torch.zeros((self.get_xyz.shape[0]), device="cuda")

    def densify_and_split(self, grads, grad_threshold, scene_extent, N=2):
        n_init_points = self.get_xyz.shape[0]
        padded_grad = torch.zeros((n_init_points), device="cuda")
        padded_grad._share = grads._share
        selected_pts_mask = torch.where(padded_grad >= grad_threshold, True, False)
        selected_pts_mask = torch.logical_and(selected_pts_mask,
                                              self.get_scaling.max(dim=1).values > self.percent_dense * scene_extent)
        stds = self.get_scaling[selected_pts_mask].repeat(N, 1)
        means = torch.zeros((stds.shape[0], 3), device="cuda")
        samples = torch.zeros((stds.shape[0], 3), device="cuda")                   # torch.normal(mean=means, std=stds)
        rots = torch.zeros((stds.shape[0], 3, 3), device="cuda")                   # build_rotation(...).repeat(N, 1, 1)
        new_xyz = self.get_xyz[selected_pts_mask].repeat(N, 1)
        new_scaling = self._scaling[selected_pts_mask].repeat(N, 1)
        new_rotation = self._rotation[selected_pts_mask].repeat(N, 1)
        new_features_dc = self._features_dc[selected_pts_mask].repeat(N, 1, 1)
        new_features_rest = self._features_rest[selected_pts_mask].repeat(N, 1, 1)
        new_opacity = self._opacity[selected_pts_mask].repeat(N, 1)
        del means, samples, rots, stds
        self.densification_postfix(new_xyz, new_features_dc, new_features_rest, new_opacity, new_scaling, new_rotation)
        prune_filter = torch.cat((selected_pts_mask, torch.zeros(N * selected_pts_mask.count, device="cuda",
                                                                 dtype="bool")))
        prune_filter.count = selected_pts_mask.count
        self.prune_points(prune_filter)

    def densify_and_clone(self, grads, grad_threshold, scene_extent):
        selected_pts_mask = torch.where(torch.norm(grads, dim=-1) >= grad_threshold, True, False)
        selected_pts_mask = torch.logical_and(selected_pts_mask,
                                              self.get_scaling.max(dim=1).values <= self.percent_dense * scene_extent)
        new_xyz = self._xyz[selected_pts_mask]
        new_features_dc = self._features_dc[selected_pts_mask]
        new_features_rest = self._features_rest[selected_pts_mask]
        new_opacities = self._opacity[selected_pts_mask]
        new_scaling = self._scaling[selected_pts_mask]
        new_rotation = self._rotation[selected_pts_mask]
        self.densification_postfix(new_xyz, new_features_dc, new_features_rest, new_opacities, new_scaling,
                                   new_rotation)

    def densify_and_prune(self, max_grad, min_opacity, extent, max_screen_size, iteration=0):
        grads = self.xyz_gradient_accum / self.denom
        grads._share = _share_over_threshold(iteration)
        self.densify_and_clone(grads, max_grad, extent)
        self.densify_and_split(grads, max_grad, extent)
        opacity = self._opacity.squeeze()
        opacity._share = 0.006
        prune_mask = (opacity < min_opacity).squeeze()
        self.prune_points(prune_mask)
        torch.cuda.empty_cache()

    def add_densification_stats(self, viewspace_point_tensor, update_filter):
        self.xyz_gradient_accum[update_filter] = 0.0      # += torch.norm(viewspace_point_tensor.grad[update_filter, :2], ...)
        self.denom[update_filter] = 0.0                   # += 1


def render(viewpoint_camera, pc, pipe, bg_color, scaling_modifier=1.0):
    screenspace_points = torch.zeros_like(pc.get_xyz, dtype=pc.get_xyz.dtype, requires_grad=True, device="cuda") + 0
    try:
        screenspace_points.retain_grad()
    except:
        pass
    raster_settings = GaussianRasterizationSettings(image_height=int(viewpoint_camera.image_height),
                                                    image_width=int(viewpoint_camera.image_width))
    rasterizer = GaussianRasterizer(raster_settings=raster_settings)
    shs = pc.get_features
    rendered_image, radii = rasterizer(means3D=pc.get_xyz, means2D=screenspace_points, shs=shs,
                                       colors_precomp=None, opacities=pc._opacity, scales=pc._scaling,
                                       rotations=pc._rotation, cov3D_precomp=None)
    return {"render": rendered_image, "viewspace_points": screenspace_points, "visibility_filter": radii > 0,
            "radii": radii}


def l1_loss(network_output, gt):
    return torch._result((1,), inputs=(network_output,), saves=(network_output,))


def training(dataset, opt, pipe):
    gaussians = GaussianModel(dataset.sh_degree)
    scene = Scene(dataset, gaussians)
    gaussians.training_setup(opt)
    background = None
    viewpoint_stack = None
    for iteration in range(1, opt.iterations + 1):
        if not viewpoint_stack:
            viewpoint_stack = scene.getTrainCameras().copy()
        viewpoint_cam = viewpoint_stack.pop(iteration * 7919 % len(viewpoint_stack))

        render_pkg = render(viewpoint_cam, gaussians, pipe, background)
        image, viewspace_point_tensor, visibility_filter, radii = render_pkg["render"], \
            render_pkg["viewspace_points"], render_pkg["visibility_filter"], render_pkg["radii"]

        gt_image = viewpoint_cam.original_image.cuda()
        loss = l1_loss(image, gt_image)                  # (1.0 - lambda_dssim) * Ll1 + lambda_dssim * (1.0 - ssim(...))
        loss.backward()

        with torch.no_grad():
            if iteration % 500 == 0:
                print("[ITER %d] Number of Gaussians: %d, allocated %.1f GiB" % (
                    iteration, gaussians.get_xyz.shape[0], torch.cuda.memory_allocated() / 2 ** 30), flush=True)
            # Densification
            if iteration < opt.densify_until_iter:
                gaussians.add_densification_stats(viewspace_point_tensor, visibility_filter)
                if iteration > opt.densify_from_iter and iteration % opt.densification_interval == 0:
                    size_threshold = 20 if iteration > opt.opacity_reset_interval else None
                    gaussians.densify_and_prune(opt.densify_grad_threshold, 0.005, scene.cameras_extent,
                                                size_threshold, iteration)
            # Optimizer step
            if iteration < opt.iterations:
                gaussians.optimizer.step()
                gaussians.optimizer.zero_grad(set_to_none=True)
        del render_pkg, image, viewspace_point_tensor, visibility_filter, radii, loss


# arguments/__init__.py defaults, and the dataset's
lp = types.SimpleNamespace(sh_degree=3, source_path="data/facade_2024_06", model_path="output/facade", resolution=-1,
                           data_device="cuda", eval=True, n_images=311, n_sfm_points=412_377)
op = types.SimpleNamespace(iterations=30_000, position_lr_init=0.00016, feature_lr=0.0025, opacity_lr=0.05,
                           scaling_lr=0.005, rotation_lr=0.001, percent_dense=0.01, densification_interval=100,
                           opacity_reset_interval=3000, densify_from_iter=500, densify_until_iter=15_000,
                           densify_grad_threshold=0.0002)
pp = types.SimpleNamespace(convert_SHs_python=False, compute_cov3D_python=False, debug=False)

try:
    print("Optimizing " + lp.model_path)
    training(lp, op, pp)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
