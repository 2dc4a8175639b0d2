"""train.py (graphdeco-inria/gaussian-splatting) -- a 3D Gaussian Splatting reconstruction of a
courtyard from 310 drone photos (COLMAP, images at 1600 px), 30,000 iterations, on a desktop with one
RTX 4090 (24 GB) that also drives the monitors.  The artist keeps Blender 4.1 open on the same card,
with the viewport in Rendered mode (Cycles on OptiX) on the photogrammetry mesh, to compare:

    gaussians = GaussianModel(sh_degree=3)
    gaussians.create_from_pcd(scene.point_cloud)             # 400k points
    gaussians.training_setup(opt)                            # Adam over the six attributes
    for iteration in range(1, 30001):
        render_pkg = render(viewpoint_cam, gaussians, pipe, bg)
        loss = (1.0 - opt.lambda_dssim) * l1_loss(image, gt) + opt.lambda_dssim * (1.0 - ssim(image, gt))
        loss.backward()
        gaussians.optimizer.step(); gaussians.optimizer.zero_grad(set_to_none=True)
        if iteration < opt.densify_until_iter:               # 15,000 (the user moved it after the step)
            if iteration >= opt.densify_from_iter and iteration % opt.densification_interval == 0:
                gaussians.densify_and_prune(...)             # torch.cuda.empty_cache() around the cat

The user: "memory climbs all the way -- it must be leaking.  It dies around iteration 13,500, though my
own math says the run needs ~19 GB of the 24.  Should I lower densify_grad_threshold?"

What fills the memory: the Gaussians grow by design until iteration 15,000 (densification clones and
splits them: 400k -> ~12M), each costing 236 B of parameters, 236 B of gradients, 472 B of Adam state
and 12 B of densification statistics, plus ~700 B per Gaussian of per-iteration rasterizer buffers
(projected 2D Gaussians, tile intersections, the radix sort's double buffers).  Alone, the run peaks at
~19 GB and fits the 4090.  But nvidia-smi shows the card shared: Blender's Cycles viewport holds
7.5 GiB, Xorg, gnome-shell and Firefox another 0.9 GiB.  With 8.4 GiB gone to other processes, the
backward pass after the densification at iteration 13,500 (10.7M Gaussians) cannot make its gradients.

An expert says first: other processes hold 8.4 GiB of the card -- close Blender (or switch its viewport to
Solid / its Cycles device to CPU) while training; the run alone fits.  Wrong advice: hunting a leak or
releasing references (the growth is the densification schedule), empty_cache or expandable_segments
(little is cached), a smaller batch or gradient checkpointing (one image per iteration, no such knob),
restarting the process (the memory is held by a live application, not a leftover context).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

ATTRS = (("_xyz", 12), ("_features_dc", 12), ("_features_rest", 180), ("_scaling", 12), ("_rotation", 16),
         ("_opacity", 4))
RASTER_BYTES_PER_GAUSSIAN = 700
densify_from_iter, densify_until_iter, densification_interval = 500, 15000, 500


class GaussianModel(object):
    """as in the original code: a plain class holding nn.Parameters, their Adam optimizer and the
    densification statistics."""

    def __init__(self, sh_degree=3):
        self.max_sh_degree = sh_degree
        self.n = 0

    def create_from_pcd(self, n_points):
        self.n = n_points
        for name, nbytes in ATTRS:
            setattr(self, name, nn.Parameter(torch.empty(n_points * nbytes // 4, dtype=torch.float32, device="cuda")))
        self.xyz_gradient_accum = torch.empty(n_points, dtype=torch.float32, device="cuda")
        self.denom = torch.empty(n_points, dtype=torch.float32, device="cuda")
        self.max_radii2D = torch.empty(n_points, dtype=torch.float32, device="cuda")

    def parameters(self):
        return [getattr(self, name) for name, _ in ATTRS]

    def training_setup(self):
        self.optimizer = torch.optim.AdamW(self.parameters(), lr=0.0, eps=1e-15, weight_decay=0.0)

    def cat_tensors_to_optimizer(self, n_new):
        """torch.cat of each attribute and of its exp_avg / exp_avg_sq, one attribute at a time."""
        group = self.optimizer.param_groups[0]
        for i, (name, nbytes) in enumerate(ATTRS):
            old = getattr(self, name)
            stored = self.optimizer.state.get(old)
            if stored is not None:
                stored["exp_avg"] = torch.empty(n_new * nbytes // 4, dtype=torch.float32, device="cuda")
                stored["exp_avg_sq"] = torch.empty(n_new * nbytes // 4, dtype=torch.float32, device="cuda")
                del self.optimizer.state[old]
            new = nn.Parameter(torch.empty(n_new * nbytes // 4, dtype=torch.float32, device="cuda"))
            group["params"][i] = new
            if stored is not None:
                self.optimizer.state[new] = stored
            setattr(self, name, new)
            del old, new, stored

    def densify_and_prune(self, growth):
        n_new = int(self.n * growth)
        torch.cuda.empty_cache()
        self.cat_tensors_to_optimizer(n_new)
        self.n = n_new
        self.xyz_gradient_accum = torch.empty(n_new, dtype=torch.float32, device="cuda")
        self.denom = torch.empty(n_new, dtype=torch.float32, device="cuda")
        self.max_radii2D = torch.empty(n_new, dtype=torch.float32, device="cuda")
        torch.cuda.empty_cache()


def render(viewpoint_cam, pc, width=1600, height=1066):
    """diff_gaussian_rasterization: preprocess (2D means, conics, colors), tile intersections, sort,
    blend; the buffers are kept for the backward pass."""
    geom = torch.empty(pc.n * 160, dtype=torch.uint8, device="cuda")
    binning = torch.empty(pc.n * (RASTER_BYTES_PER_GAUSSIAN - 160), dtype=torch.uint8, device="cuda")
    binning._saved = geom
    img = torch.empty(width * height * 64, dtype=torch.uint8, device="cuda")
    img._saved = binning
    image = torch.autograd._graph.derive(img, *pc.parameters())
    return {"render": image}


def main():
    gaussians = GaussianModel(sh_degree=3)
    gaussians.create_from_pcd(400_000)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    gaussians.training_setup()
    gt_images = [torch.empty(1600 * 1066 * 3 * 4, dtype=torch.uint8, device="cuda") for _ in range(8)]
    growth = 30 ** (1.0 / 29)
    for iteration in range(1, 30001):
        render_pkg = render(iteration % 310, gaussians)
        image = render_pkg["render"]
        loss = torch.autograd._graph.derive(torch.empty(512, dtype=torch.uint8, device="cuda"), image)
        loss._saved = image
        scen_truth.backward(loss)
        del render_pkg, image, loss
        gaussians.optimizer.step()
        gaussians.optimizer.zero_grad(set_to_none=True)
        if iteration < densify_until_iter:           # refinement after the step, as splatfacto's callback
            if iteration > densify_from_iter - 1 and iteration % densification_interval == 0:
                gaussians.densify_and_prune(growth)
        if iteration % 1000 == 0:
            print("iter %d gaussians %d allocated %.1f GiB" % (iteration, gaussians.n,
                                                            torch.cuda.memory_allocated() / 2.0 ** 30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
