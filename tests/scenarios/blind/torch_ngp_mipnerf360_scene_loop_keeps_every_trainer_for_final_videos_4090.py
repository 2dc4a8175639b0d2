"""A benchmark script that trains torch-ngp (Instant-NGP in PyTorch, cuda_ray) on the nine Mip-NeRF 360 scenes one
after another in one process, and keeps every scene's Trainer in a dict so that it can render all the
fly-through videos at the end.  Each kept Trainer keeps its model, its AdamW state, the last step's gradients and
its preloaded training images on the GPU; the eighth scene no longer fits beside the seven before it.

The real program is the user's bench_360.py on an RTX 4090 (24 GB), built on torch-ngp's nerf/ package:

    results = {}
    for scene in SCENES:
        model = NeRFNetwork(encoding="hashgrid", bound=opt.bound, cuda_ray=True, bg_radius=opt.bg_radius,
                            log2_hashmap_size=21)
        train_loader = NeRFDataset(opt, device=device, type="train", downscale=4).dataloader()   # preload=True
        optimizer = lambda model: torch.optim.Adam(model.get_params(opt.lr), betas=(0.9, 0.99), eps=1e-15)
        trainer = Trainer("ngp", opt, model, device=device, workspace=f"runs/{scene}", optimizer=optimizer, ...)
        trainer.train(train_loader, valid_loader, max_epoch)
        results[scene] = {"trainer": trainer, "loader": train_loader, "psnr": trainer.stats["results"][-1]}
        gc.collect()
    for scene, r in results.items():
        r["trainer"].test(circle_poses_loader(r["loader"]), write_video=True)   # the videos, at the end

(--iters 300 here: the user's smoke run of the script over all nine scenes before the real 30k-step runs.)

Sizes, per scene.  The hash grid: 16 levels x 2^21 entries x 2 features, fp32 parameters = 256 MiB, the
background's 2-D grid 32 MiB, the MLPs ~0.1 MiB; AdamW's two moments twice that (576 MiB), and the gradients of
the last step (torch-ngp calls optimizer.zero_grad() at the start of a step, so the last step's .grad stays,
288 MiB).  With preload=True the training images sit on the GPU as float32 RGB: Mip-NeRF 360 at downscale 4 is
1237x822 (bicycle, 194 images: 2.2 GiB), 1297x840 (garden, 185: 2.3 GiB), 1245x825 (stump, 125: 1.4 GiB),
779x519 indoors (room 311: 1.4 GiB, counter 240: 1.1 GiB, kitchen 279: 1.3 GiB, bonsai 292: 1.3 GiB), 1256x828
(flowers, 173: 2.0 GiB).  So a finished scene keeps 2.4-3.6 GiB.  A training step adds ~0.6 GiB of transient
ray-marching samples (4096 rays, ~1 M compacted samples: positions, directions, deltas, hash features and MLP
activations kept for backward).  One scene alone peaks under 5 GiB.

memory_allocated() at the start of each scene: 0, 3.5, 7.1, 9.8, 12.5, 14.9, 17.5, 20.1 GiB: it climbs by the
size of each finished scene (bicycle 3.5, garden 3.6, stump 2.7, room 2.7, counter 2.4, kitchen 2.6, bonsai
2.6 GiB).  The eighth scene (flowers) loads its images and model (2.3 GiB: 22.4 GiB allocated, the CUDA context
beside it), and the first training step's forward cannot get a 256 MiB MLP activation (1 M samples x 64
fp32): the job dies in the sigma MLP of flowers' first step, with seven finished trainers holding 20 GiB of the
card.  Nothing of the current scene is unusually large.

What an expert says first: the script holds every finished scene on the GPU; keep only what the end needs
(the PSNR and a checkpoint path; render each scene's video right after its training, or reload the
checkpoint later) and drop the trainer: `del trainer, model, train_loader; gc.collect();
torch.cuda.empty_cache()` between scenes.  Wrong advice: smaller batch (num_rays) or a smaller hash table /
fp16 (shrinks each scene a little, a later scene still dies), gradient checkpointing, expandable_segments
(the memory is live, not fragmented), a bigger card (it hides the leak for these nine scenes, not for the
next, larger benchmark).
"""
import gc
import types

import torch
from torch import nn
# what autograd records for torch-ngp's custom autograd.Functions (raymarching, the loss): the stand-in's
from torch.autograd._graph import derive as recorded_by_autograd

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1024 * 1024

# (name, images, width, height) of the Mip-NeRF 360 scenes at downscale 4
SCENES = [("bicycle", 194, 1237, 822), ("garden", 185, 1297, 840), ("stump", 125, 1245, 825),
          ("room", 311, 779, 519), ("counter", 240, 779, 519), ("kitchen", 279, 779, 519),
          ("bonsai", 292, 779, 519), ("flowers", 173, 1256, 828), ("treehill", 141, 1267, 832)]

opt = types.SimpleNamespace(path="data/360_v2", bound=16.0, scale=0.33, bg_radius=32.0, downscale=4, preload=True,
                            num_rays=4096, max_steps=1024, iters=300, lr=1e-2, fp16=True, cuda_ray=True,
                            log2_hashmap_size=21, num_levels=16, level_dim=2, update_extra_interval=16,
                            eval_interval=100)


# -------------------------------------------------------------------------------------------------------------
# nerf/network.py (torch-ngp)

class GridEncoder(nn.Module):
    """gridencoder.GridEncoder: one embedding table for all levels, fp32 parameters."""

    def __init__(self, input_dim, num_levels, level_dim, log2_hashmap_size):
        nn.Module.__init__(self)
        self.level_dim, self.num_levels = level_dim, num_levels
        self.output_dim = num_levels * level_dim
        entries = num_levels * (2 ** log2_hashmap_size) if input_dim == 3 else num_levels * (2 ** 19)
        self.embeddings = nn.Parameter(torch.empty(entries * level_dim * 4))

    def forward(self, inputs, n):
        # grid_encode: (n, num_levels * level_dim) fp32 features; dy_dx not kept (inputs need no grad)
        return grid_encode(inputs, self.embeddings, n * self.output_dim * 4)


def grid_encode(inputs, embeddings, nbytes):
    out = torch.empty(nbytes)
    out._saved = inputs
    return out


class FFMLP(nn.Module):
    """A tcnn-style fully fused MLP: hidden activations kept for backward."""

    def __init__(self, dim_in, dim_out, dim_hidden, num_layers):
        nn.Module.__init__(self)
        self.dims = [dim_in] + [dim_hidden] * (num_layers - 1) + [dim_out]
        self.weights = nn.Parameter(torch.empty(sum(a * b for a, b in zip(self.dims, self.dims[1:])) * 4))

    def forward(self, x, n):
        return ffmlp(x, self.weights, n, self.dims)


def ffmlp(x, weights, n, dims):
    h = x
    for d in dims[1:]:
        y = torch.empty(n * d * 4)
        y._saved = h
        h = y
    return h


class NeRFNetwork(nn.Module):
    def __init__(self, bound, bg_radius, log2_hashmap_size, num_levels=16, level_dim=2, cuda_ray=True):
        nn.Module.__init__(self)
        self.bound, self.cuda_ray = bound, cuda_ray
        self.encoder = GridEncoder(3, num_levels, level_dim, log2_hashmap_size)
        self.sigma_net = FFMLP(num_levels * level_dim, 16, 64, 2)
        self.color_net = FFMLP(15 + 16, 3, 64, 3)
        self.encoder_bg = GridEncoder(2, num_levels, level_dim, 19)
        self.bg_net = FFMLP(num_levels * level_dim + 16, 3, 64, 2)
        # occupancy grid (cascade x 128^3) and its bitfield
        cascade = 5
        self.register_buffer("density_grid", torch.empty(cascade * 128 ** 3 * 4))
        self.register_buffer("density_bitfield", torch.empty(cascade * 128 ** 3 // 8))

    def forward(self, xyzs, dirs, m):
        h = self.encoder(xyzs, m)
        h = self.sigma_net(h, m)
        sh = torch.empty(m * 16 * 4)                    # SH encoding of the directions
        sh._saved = h
        rgbs = self.color_net(sh, m)
        return rgbs

    def run_cuda(self, rays_o, rays_d, num_rays, max_steps):
        # raymarching.march_rays_train: ~1 M compacted samples for 4096 rays in a 360 scene
        m = num_rays * 256
        xyzs = torch.empty(m * 3 * 4)
        dirs = torch.empty(m * 3 * 4)
        deltas = torch.empty(m * 2 * 4)
        dirs._saved = xyzs
        deltas._saved = dirs
        rgbs = self(deltas, dirs, m)
        bg = self.encoder_bg(rays_d, num_rays)
        image = composite_rays_train(rgbs, deltas, bg, m, num_rays)
        return {"image": image}

    def get_params(self, lr):
        return [{"params": self.encoder.parameters(), "lr": lr}]


def composite_rays_train(rgbs, deltas, bg, m, num_rays):
    """raymarching.composite_rays_train: per-sample weights, then the rays' colours over the background."""
    weights = torch.empty(m * 4)
    weights._saved = rgbs
    image = torch.empty(num_rays * 3 * 4)
    image._saved = weights
    return recorded_by_autograd(image, rgbs, bg)


# -------------------------------------------------------------------------------------------------------------
# nerf/provider.py

class NeRFDataset(object):
    def __init__(self, opt, scene, n_images, width, height, device="cuda", type="train"):
        self.scene, self.type = scene, type
        self.H, self.W, self.num_rays = height, width, opt.num_rays
        self.poses = torch.empty(n_images * 16 * 4)
        if opt.preload:
            # self.images = torch.from_numpy(np.stack(images, axis=0)).to(device): float32 [N, H, W, 3]
            self.images = torch.empty(n_images * height * width * 3 * 4)
        self.error_map = torch.empty(n_images * 128 * 128 * 4)
        self.n_images = n_images

    def collate(self, index):
        rays_o = torch.empty(self.num_rays * 3 * 4)
        rays_d = torch.empty(self.num_rays * 3 * 4)
        images = torch.empty(self.num_rays * 3 * 4)    # torch.gather(self.images, ...)
        return {"rays_o": rays_o, "rays_d": rays_d, "images": images, "index": index}

    def dataloader(self):
        return self


# -------------------------------------------------------------------------------------------------------------
# nerf/utils.py Trainer

class Trainer(object):
    def __init__(self, name, opt, model, workspace, optimizer):
        self.name, self.opt, self.workspace = name, opt, workspace
        self.model = model
        self.optimizer = optimizer(model)
        self.global_step = 0
        self.stats = {"results": []}

    def train_step(self, data):
        outputs = self.model.run_cuda(data["rays_o"], data["rays_d"], self.opt.num_rays, self.opt.max_steps)
        pred = outputs["image"]
        loss = torch.empty(4)                           # criterion(pred_rgb, gt_rgb).mean(): huber
        loss._saved = pred
        return recorded_by_autograd(loss, pred)

    def update_extra_state(self):
        with torch.no_grad():
            tmp = torch.empty(5 * 128 ** 3 * 4)       # density of a batch of grid cells
            del tmp

    def train_one_epoch(self, loader, iters):
        self.model.train()
        for i in range(iters):
            if self.global_step % self.opt.update_extra_interval == 0:
                self.update_extra_state()
            self.global_step += 1
            data = loader.collate(i % loader.n_images)
            self.optimizer.zero_grad()
            loss = self.train_step(data)
            scen_truth.backward(loss)
            self.optimizer.step()

    def evaluate_one_epoch(self, loader):
        self.model.eval()
        with torch.no_grad():
            pred = torch.empty(loader.H * loader.W * 3 * 4)
            self.stats["results"].append(25.0)
            del pred

    def train(self, train_loader, valid_loader, iters):
        done = 0
        while done < iters:
            n = min(self.opt.eval_interval, iters - done)
            self.train_one_epoch(train_loader, n)
            done += n
            self.evaluate_one_epoch(valid_loader)


def run_scene(scene, n_images, width, height):
    model = NeRFNetwork(opt.bound, opt.bg_radius, opt.log2_hashmap_size, opt.num_levels, opt.level_dim)
    train_loader = NeRFDataset(opt, scene, n_images, width, height, type="train").dataloader()
    optimizer = lambda model: torch.optim.AdamW(model.parameters(), lr=opt.lr, betas=(0.9, 0.99), weight_decay=0.0)
    trainer = Trainer("ngp", opt, model, workspace="runs/%s" % scene, optimizer=optimizer)
    trainer.train(train_loader, train_loader, opt.iters)
    return trainer, train_loader


def main():
    results = {}
    for scene, n_images, width, height in SCENES:
        print("==> %s: %d images %dx%d, allocated %.2f GiB" % (scene, n_images, width, height,
                                                             torch.cuda.memory_allocated() / 2.0 ** 30))
        trainer, train_loader = run_scene(scene, n_images, width, height)
        # kept for the fly-through videos rendered at the end (poses and intrinsics come from the loader)
        results[scene] = {"trainer": trainer, "loader": train_loader, "psnr": trainer.stats["results"][-1]}
        gc.collect()
    for scene, r in results.items():
        print("%s PSNR %.2f" % (scene, r["psnr"]))
        r["trainer"].evaluate_one_epoch(r["loader"])


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
