"""Diffusion Policy (Chi et al., the CNN variant: ConditionalUnet1D, down_dims [256, 512, 1024], 256 M
parameters, with one ResNet-18 per camera as the observation encoder, GroupNorm in place of BatchNorm) trained
on teleoperated demonstrations of a Franka pick-and-place, on the lab's workstation: one RTX 4090 (24 GiB)
driving the monitors too.  The demonstrations were collected in Isaac Sim by teleoperation; when the session
was done the user left Isaac Sim open (the scene loaded, RTX rendering on, the ROS 2 bridge feeding rviz2)
and started training from another terminal with the config that trained fine last week:

    python train.py --config-name=train_diffusion_unet_real_image_workspace task=franka_pick_isaac \
        training.device=cuda:0 dataloader.batch_size=64

    for batch in train_dataloader:
        batch = dict_apply(batch, lambda x: x.to(device, non_blocking=True))
        raw_loss = self.model.compute_loss(batch)        # obs_encoder(nobs) -> unet(noisy_actions, t, cond)
        loss = raw_loss / cfg.training.gradient_accumulate_every
        loss.backward()
        ...

What happens: nvidia-smi shows the GPU already 13.5 GiB used before training starts: Isaac Sim's `kit`
process 12.3 GiB (the RTX renderer's buffers, the PhysX GPU pipeline, the USD stage's textures), Xorg
0.8 GiB, gnome-shell 0.25 GiB, rviz2 0.2 GiB.  The training process takes its context (0.5 GiB), the policy
(256 M UNet + 2 x 11.2 M ResNet-18 = 278 M parameters, float32: 1.04 GiB) and the EMA copy (1.04 GiB),
then runs the first forward: per camera 64 x 2 observation steps = 128 images of 3 x 240 x 320 through a
ResNet-18 with autograd on keep 5.8 GiB (conv1's output alone 128 x 64 x 120 x 160 x 4 B = 600 MiB, saved
with its GroupNorm and ReLU outputs; layer1 at 1/4 resolution 1.8 GiB), 11.5 GiB for the two cameras.  The
training alone peaks at 17.4 GiB (context, weights, EMA, activations, gradients 1 GiB, AdamW 2 GiB): it
fits the 24 GiB card, as it did last week.  Beside Isaac Sim only 7.6 GiB are free when the forward starts;
the first camera's encoder takes 5.8 GiB and the second one's fails right after its conv1 stage, the
max-pool asking for 150 MiB with 55 MiB free, this process holding 10.6 GiB in all.

What an expert says first: 13.5 GiB of this GPU belong to other processes, 12.3 GiB of it to Isaac Sim's
kit; this process's own use is 10.6 GiB.  Close Isaac Sim (and stop rviz2) before training, or train on
another machine's GPU: then the same config fits.  Wrong advice: halving the batch or turning on mixed precision
(they would squeeze the run in beside the simulator but change the training for a cause that is not the
job's), gradient checkpointing, expandable_segments / empty_cache (nothing is cached, nothing fragmented),
FSDP/ZeRO, flash attention (there is no attention), a bigger GPU.
"""
import copy

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

BATCH_SIZE = 64
N_OBS_STEPS = 2
HORIZON = 16
ACTION_DIM = 10
IMAGE_SHAPE = (3, 240, 320)
CAMERAS = ("agentview_image", "wrist_image")


# --- what the CUDA kernels of the real code allocate (the stand-in torch computes nothing) ---------------
def _like(x, scale=1.0, saves=None):
    """A new float32 tensor of x's bytes times scale, in x's graph; with autograd on it keeps `saves`."""
    out = torch.empty(int(x.nbytes * scale), device=x.device)
    if saves is not None and torch.is_grad_enabled():
        out._saved = saves
    return torch._derive(out, x)


def backward(loss):
    """loss.backward() and what PyTorch then does to the graph (retain_graph=False): the tensors its
    nodes saved are freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        if saved is None:
            continue
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if x is not None)


class GroupNorm(nn.Module):
    def __init__(self, num_groups, num_channels):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_channels * 4))
        self.bias = nn.Parameter(torch.empty(num_channels * 4))

    def forward(self, x):
        return _like(x, saves=x)


class ReLU(nn.Module):
    def forward(self, x):
        return _like(x, saves=x)


class MaxPool2d(nn.Module):
    def __init__(self, kernel_size, stride):
        super().__init__()
        self.stride = stride

    def forward(self, x):
        return _like(x, 1.0 / (self.stride * self.stride), saves=x)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, bias=False)
        self.bn1 = GroupNorm(planes // 16, planes)
        self.relu = ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, bias=False)
        self.bn2 = GroupNorm(planes // 16, planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False)
            self.downsample_norm = GroupNorm(planes // 16, planes)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample_norm(self.downsample(x))
        return self.relu(_like(out, saves=(out, identity)))      # out += identity


class ResNet18(nn.Module):
    """torchvision resnet18(weights=None) with BatchNorm replaced by GroupNorm and fc by Identity."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.bn1 = GroupNorm(4, 64)
        self.relu = ReLU()
        self.maxpool = MaxPool2d(3, 2)
        self.layer1 = nn.Module()
        self.layer1.b0, self.layer1.b1 = BasicBlock(64, 64), BasicBlock(64, 64)
        self.layer2 = nn.Module()
        self.layer2.b0, self.layer2.b1 = BasicBlock(64, 128, 2), BasicBlock(128, 128)
        self.layer3 = nn.Module()
        self.layer3.b0, self.layer3.b1 = BasicBlock(128, 256, 2), BasicBlock(256, 256)
        self.layer4 = nn.Module()
        self.layer4.b0, self.layer4.b1 = BasicBlock(256, 512, 2), BasicBlock(512, 512)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer.b1(layer.b0(x))
        n_img = BATCH_SIZE * N_OBS_STEPS
        return _like(x, (n_img * 512 * 4.0) / x.nbytes, saves=x)       # global average pool: 512 features


class MultiImageObsEncoder(nn.Module):
    def __init__(self, rgb_keys):
        super().__init__()
        self.rgb_keys = rgb_keys
        for key in rgb_keys:
            setattr(self, key, ResNet18())

    def forward(self, obs_dict):
        features = []
        for key in self.rgb_keys:
            img = obs_dict[key]
            features.append(getattr(self, key)(img))
        return _like(features[0], len(features), saves=tuple(features))       # torch.cat(features, dim=-1)


class ConditionalUnet1D(nn.Module):
    """diffusion_policy's ConditionalUnet1D(input_dim=10, global_cond_dim=2*1024, down_dims=[256,512,1024],
    kernel_size=5, n_groups=8): the conv and FiLM weights of its residual blocks, 256 M parameters."""

    def __init__(self):
        super().__init__()
        blocks = [("down0", 3.5e6), ("down1", 14.0e6), ("down2", 56.1e6), ("mid0", 44.1e6), ("mid1", 44.1e6),
                  ("up0", 63.0e6), ("up1", 17.8e6), ("final", 0.4e6), ("cond_encoder", 13.0e6)]
        for name, n in blocks:
            setattr(self, name, nn.Conv1d(1, 1, 1))
            getattr(self, name).weight = nn.Parameter(torch.empty(int(n) * 4))

    def forward(self, sample, timestep, global_cond):
        x = _like(sample, 256 / ACTION_DIM, saves=(sample, global_cond))
        for name in ("down0", "down1", "down2", "mid0", "mid1", "up0", "up1", "final"):
            getattr(self, name).weight          # the block's weights take part
            x = _like(x, 1.0, saves=x)
        return _like(sample, 1.0, saves=x)


class DiffusionUnetImagePolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.obs_encoder = MultiImageObsEncoder(CAMERAS)
        self.model = ConditionalUnet1D()

    def compute_loss(self, batch):
        this_nobs = {k: batch["obs"][k] for k in CAMERAS}        # normalizer: identity for images
        global_cond = self.obs_encoder(this_nobs)
        trajectory = batch["action"]
        noise = torch.empty_like(trajectory)
        noisy_trajectory = _like(trajectory, saves=None)        # noise_scheduler.add_noise(...)
        pred = self.model(noisy_trajectory, None, global_cond=global_cond)
        return _like(pred, 512.0 / pred.nbytes, saves=(pred, noise))     # F.mse_loss(pred, noise)


def make_batch(device):
    """One batch of the zarr replay buffer's dataset, images already float32 in [0, 1], moved to the GPU."""
    n_img = BATCH_SIZE * N_OBS_STEPS
    c, h, w = IMAGE_SHAPE
    obs = {k: torch.empty(n_img * c * h * w, dtype=torch.float32, device=device) for k in CAMERAS}
    return {"obs": obs, "action": torch.empty(BATCH_SIZE * HORIZON * ACTION_DIM, dtype=torch.float32,
                                              device=device)}


def train(num_epochs=3000):
    device = "cuda:0"
    torch.cuda.set_device(0)
    model = DiffusionUnetImagePolicy()
    ema_model = copy.deepcopy(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=1e-6)
    for epoch in range(num_epochs):
        for batch_idx in range(200):
            batch = make_batch(device)
            raw_loss = model.compute_loss(batch)
            loss = raw_loss
            backward(loss)
            optimizer.step()
            optimizer.zero_grad()
            # ema.step(model)


def main():
    train()


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
