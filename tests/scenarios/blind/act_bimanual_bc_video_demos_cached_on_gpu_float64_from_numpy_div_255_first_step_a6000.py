"""Behaviour cloning of an ACT policy (Action Chunking with Transformers: a ResNet-18 backbone shared by the
cameras, a 4-layer encoder / 7-layer decoder transformer, chunks of 100 actions, a CVAE over the action
chunk; 77 M parameters) from 150 teleoperated demonstrations of a bimanual robot recorded as video (two
cameras, resized to 128 x 128, 300 to 500 frames each, 60,176 frames in all), on one RTX A6000 (48 GiB).
Decoding the videos on every epoch starved the GPU, so the user's dataset decodes them all once at
start-up and keeps every frame on the GPU:

    class GPUEpisodicDataset(torch.utils.data.Dataset):
        def __init__(self, demo_dirs, camera_names, device):
            for d in demo_dirs:
                frames = np.stack([read_video(d / f"{cam}.mp4", size=(128, 128)) for cam in camera_names], 1)
                frames = frames.transpose(0, 1, 4, 2, 3) / 255.0        # (T, 2, 3, 128, 128) -- float64!
                self.images.append(torch.from_numpy(frames).to(device))
                self.qpos.append(torch.from_numpy(np.load(d / "qpos.npy")).to(device))
                self.actions.append(torch.from_numpy(np.load(d / "action.npy")).to(device))

and, when the model complained about a Double input, added `image_data = image_data.float()` to the
training step.

What happens: `uint8 / 255.0` in numpy is float64, and torch.from_numpy keeps the dtype: 60,176 frames x 2
cameras x 49,152 values x 8 B = 44.1 GiB of frames on the GPU (uint8 would be 5.5 GiB, float32 22.1 GiB).
The loading takes 20 minutes and succeeds; then the context (0.5 GiB) and the policy (0.29 GiB) leave
2.96 GiB free.  The first training step gathers a batch of 256 samples (192 MiB of float64 images, 96 MiB
once .float()), runs the CVAE encoder over [CLS, qpos, 100 actions] (4 layers, feed-forward 3200: 2.3 GiB
kept for backward), then the backbone on the first camera: conv1's output (256 x 64 x 64 x 64 x 4 B =
256 MiB) still fits, its batch norm's output of the same size does not: 28 MiB free, 47.3 GiB allocated,
nothing cached to speak of.  The step itself
needs ~13 GiB (CVAE encoder 2.3, backbone 2 x 2.5, decoder over 100 queries 3.9, weights, gradients and
AdamW state 1.2): with the frames stored as float32 the job peaks at 35.7 GiB of the 48, with uint8 at
~19 GiB.

What an expert says first: 44 of the 48 GiB are the dataset's frames, and they are float64 -- numpy's
division made them so.  Keep them as uint8 on the GPU (divide by 255 per batch, on the batch) or at least
float32, or keep them in host memory and move each batch.  Wrong advice: a smaller batch, mixed
precision, gradient checkpointing (they shave the 13 GiB the step needs, not the 44 GiB the frames take:
the batch would have to shrink to a sixth to fit beside them), expandable_segments / empty_cache (nothing
is fragmented or cached), FSDP or more GPUs, quantization, a bigger GPU.
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

CAMERA_NAMES = ("cam_high", "cam_left_wrist")
IMAGE_HW = 128
NUM_DEMOS = 150
STATE_DIM = 14
CHUNK_SIZE = 100
HIDDEN_DIM = 512
DIM_FEEDFORWARD = 3200
BATCH_SIZE = 256


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


class HostVideo(object):
    """What read_video(...) returns after np.stack / transpose / 255.0: a numpy array's shape and dtype."""

    def __init__(self, shape, dtype):
        self.shape, self.dtype = shape, dtype

    def numel(self):
        n = 1
        for s in self.shape:
            n *= s
        return n


def from_numpy_to(array, device):
    """torch.from_numpy(array).to(device): the array's dtype, kept."""
    return torch.empty(array.numel(), dtype=array.dtype, device=device)


class GPUEpisodicDataset(object):
    def __init__(self, demo_lengths, camera_names, device):
        self.images, self.qpos, self.actions = [], [], []
        self.episode_len = list(demo_lengths)
        for i, n in enumerate(demo_lengths):
            frames = HostVideo((n, len(camera_names), 3, IMAGE_HW, IMAGE_HW), torch.float64)   # uint8 / 255.0
            self.images.append(from_numpy_to(frames, device))
            self.qpos.append(from_numpy_to(HostVideo((n, STATE_DIM), torch.float64), device))
            self.actions.append(from_numpy_to(HostVideo((n, STATE_DIM), torch.float64), device))

    def __len__(self):
        return len(self.images)

    def sample_batch(self, batch_size, rng):
        """For each sample: a random episode and start step; its images, qpos and the next 100 actions."""
        n_img = batch_size * len(CAMERA_NAMES) * 3 * IMAGE_HW * IMAGE_HW
        image_data = torch.empty(n_img, dtype=torch.float64)            # torch.stack of the frames
        qpos_data = torch.empty(batch_size * STATE_DIM, dtype=torch.float64)
        action_data = torch.empty(batch_size * CHUNK_SIZE * STATE_DIM, dtype=torch.float64)
        is_pad = torch.empty(batch_size * CHUNK_SIZE, dtype=torch.uint8)
        return image_data, qpos_data, action_data, is_pad


class FrozenBatchNorm2d(nn.Module):
    def __init__(self, n):
        super().__init__()
        self.register_buffer("weight", torch.empty(n * 4))
        self.register_buffer("bias", torch.empty(n * 4))

    def forward(self, x):
        return _like(x, saves=x)


class ReLU(nn.Module):
    def forward(self, x):
        return _like(x, saves=x)


class MaxPool2d(nn.Module):
    def forward(self, x):
        return _like(x, 0.25, saves=x)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, bias=False)
        self.bn1 = FrozenBatchNorm2d(planes)
        self.relu = ReLU()
        self.conv2 = nn.Conv2d(planes, planes, 3, bias=False)
        self.bn2 = FrozenBatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Conv2d(inplanes, planes, 1, stride=stride, bias=False)
            self.downsample_bn = FrozenBatchNorm2d(planes)

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample_bn(self.downsample(x))
        return self.relu(_like(out, saves=(out, identity)))


class Backbone(nn.Module):
    """torchvision resnet18 with FrozenBatchNorm2d, up to layer4 (DETR's Backbone as ACT uses it)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.bn1 = FrozenBatchNorm2d(64)
        self.relu = ReLU()
        self.maxpool = MaxPool2d()
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
        return x


class TransformerLayer(nn.Module):
    def __init__(self):
        super().__init__()
        d, f = HIDDEN_DIM, DIM_FEEDFORWARD
        self.in_proj_weight = nn.Parameter(torch.empty(3 * d * d * 4))
        self.out_proj = nn.Parameter(torch.empty(d * d * 4))
        self.linear1 = nn.Parameter(torch.empty(d * f * 4))
        self.linear2 = nn.Parameter(torch.empty(f * d * 4))

    def forward(self, x, tokens, batch):
        unit = batch * tokens * HIDDEN_DIM * 4.0 / x.nbytes
        qkv = _like(x, 3 * unit, saves=x)
        attn = _like(x, unit, saves=qkv)
        h = _like(x, unit * DIM_FEEDFORWARD / HIDDEN_DIM, saves=attn)
        return _like(x, unit, saves=(h, attn))


class DETRVAE(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = Backbone()
        self.input_proj = nn.Conv2d(512, HIDDEN_DIM, 1)
        self.encoder = nn.Module()
        for i in range(4):
            setattr(self.encoder, "layer%d" % i, TransformerLayer())
        self.decoder = nn.Module()
        for i in range(7):
            setattr(self.decoder, "layer%d" % i, TransformerLayer())
        self.cvae_encoder = nn.Module()
        for i in range(4):
            setattr(self.cvae_encoder, "layer%d" % i, TransformerLayer())
        self.action_head = nn.Parameter(torch.empty(HIDDEN_DIM * STATE_DIM * 4))
        self.query_embed = nn.Parameter(torch.empty(CHUNK_SIZE * HIDDEN_DIM * 4))

    def forward(self, qpos, image, actions, is_pad, batch):
        latent = actions
        for i in range(4):                       # CVAE encoder over [CLS, qpos, 100 actions]
            latent = getattr(self.cvae_encoder, "layer%d" % i)(latent, CHUNK_SIZE + 2, batch)
        features = []
        per_cam = image.nbytes // len(CAMERA_NAMES)
        for cam_id, cam_name in enumerate(CAMERA_NAMES):
            cam_image = _like(image, per_cam / float(image.nbytes), saves=None)   # image[:, cam_id]
            features.append(self.input_proj(self.backbone(cam_image)))
        src = _like(features[0], 2.0, saves=tuple(features))                   # 2 x 16 tokens
        memory = src
        for i in range(4):
            memory = getattr(self.encoder, "layer%d" % i)(memory, 2 * 16 + 2, batch)
        hs = memory
        for i in range(7):
            hs = getattr(self.decoder, "layer%d" % i)(hs, CHUNK_SIZE, batch)
        return _like(hs, STATE_DIM / float(HIDDEN_DIM), saves=hs), latent


class ACTPolicy(nn.Module):
    def __init__(self):
        super().__init__()
        self.model = DETRVAE()

    def forward(self, qpos, image, actions, is_pad, batch):
        a_hat, latent = self.model(qpos, image, actions, is_pad, batch)
        return _like(a_hat, 512.0 / a_hat.nbytes, saves=(a_hat, latent))      # l1 + kl_weight * kl


def train_bc(dataset, policy, optimizer, num_epochs, rng):
    policy.train()
    for epoch in range(num_epochs):
        for it in range(len(dataset)):
            image_data, qpos_data, action_data, is_pad = dataset.sample_batch(BATCH_SIZE, rng)
            image_data = _like(image_data, 0.5)                # image_data.float()
            qpos_data, action_data = _like(qpos_data, 0.5), _like(action_data, 0.5)
            loss = policy(qpos_data, image_data, action_data, is_pad, BATCH_SIZE)
            backward(loss)
            optimizer.step()
            optimizer.zero_grad()


def main():
    torch.cuda.set_device(0)
    rng = random.Random(0)
    demo_lengths = [rng.randint(300, 500) for _ in range(NUM_DEMOS)]
    dataset = GPUEpisodicDataset(demo_lengths, CAMERA_NAMES, device="cuda:0")
    policy = ACTPolicy()
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-5, weight_decay=1e-4)
    train_bc(dataset, policy, optimizer, num_epochs=2000, rng=rng)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
