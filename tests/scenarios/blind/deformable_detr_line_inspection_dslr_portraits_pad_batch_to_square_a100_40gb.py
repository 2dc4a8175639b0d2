"""train_line_defects.py -- fine-tuning Hugging Face's Deformable DETR (SenseTime/deformable-detr, ResNet-50,
40M parameters) to find defects on power-line poles, one A100-SXM4-40GB, batch 8, AdamW, float32 (the
multi-scale deformable attention kernel runs in float32).  The data side is the Hugging Face DETR
fine-tuning notebook's, with multi-scale training added:

    processor = AutoImageProcessor.from_pretrained("SenseTime/deformable-detr")
    train_tf = A.Compose([A.SmallestMaxSize(max_size=[480, 512, ..., 800]), A.LongestMaxSize(1333),
                          A.HorizontalFlip(), ...], bbox_params=...)
    def collate_fn(batch):
        pixel_values = [item["pixel_values"] for item in batch]
        encoding = processor.pad(pixel_values, return_tensors="pt")  # to the batch's tallest H and widest W
        return {"pixel_values": encoding["pixel_values"], "pixel_mask": encoding["pixel_mask"], "labels": ...}
    loader = DataLoader(train_set, batch_size=8, shuffle=True, collate_fn=collate_fn, num_workers=8)
    for batch in loader:
        outputs = model(pixel_values=batch["pixel_values"].cuda(), pixel_mask=..., labels=...)
        outputs.loss.backward(); optimizer.step(); optimizer.zero_grad()

For three weeks the training set was 19,800 frames of the patrol helicopter's camera (1920x1080,
landscape): at a short side of 480-800 and a long side of at most 1333 a batch pads to at most
750 x 1333 (1.0 MP an image) and the job peaked at 28 GiB.  This week the inspectors' DSLR close-ups
were merged in: 240 portrait photos (4000x6000) that resize to up to 800 wide x 1200 high.  At step 12
one drawn at a short side of 576 padded its batch to 864 x 1333 (32 GiB peak, it passed); at step 34 one
drawn at 800 pads its batch to 1200 x 1333: 1.6 MP for every one of the 8 images, 1.6x the activations
of a usual batch (ResNet layers 2-4 and, mostly, the six encoder layers, whose tokens are the pixels of
four feature levels).  It fails in the encoder's forward pass with 37.4 GiB allocated (and
1.9 GiB cached in pieces); the batch as a whole needs ~44 GiB, more than the card's 39.5 GiB.

An expert: one portrait photo pads the whole batch into 1200 x 1333 squares; batch images of like aspect
ratio together (torchvision's GroupedBatchSampler with create_aspect_ratio_groups, detectron2's
AspectRatioGroupedDataset), so no batch is padded beyond its own images; or cap the portraits' size so a
padded image stays near 1 MP.  Not a leak (the step before peaked at 27 GiB), not fragmentation (the
cached 1.9 GiB would not cover the rest of the pass), not other processes: empty_cache or
expandable_segments cannot make ~44 GiB fit in 39.5.  A smaller batch would fit
but pays on every batch for the few mixed ones; gradient checkpointing of the encoder is a later lever.
"""
import math
import random
import sys

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

SEED = 2
BATCH_SIZE = 8
SHORT_SIDES = [480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800]
MAX_SIZE = 1333


def new(*shape, dtype=torch.float32):
    """A tensor of that shape on the GPU (the stand-in tensor is its bytes; its shape is noted)."""
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=dtype, device="cuda")
    t.shape = tuple(int(s) for s in shape)
    return t


def op(*shape, saved=()):
    """The output of an operation, keeping what autograd saves for backward (nothing under no_grad)."""
    t = new(*shape)
    if torch.is_grad_enabled():
        t._saved = tuple(saved)
    return t


def backward(loss):
    """loss.backward() as PyTorch runs it: gradients made, then every tensor the graph saved is freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        s = t.__dict__.pop("_saved", None)
        if isinstance(s, (tuple, list)):
            todo.extend(x for x in s if isinstance(x, torch.Tensor))


def param(n, trainable=True):
    return nn.Parameter(torch.empty(int(n), dtype=torch.float32, device="cuda"), requires_grad=trainable)


# ---------------------------------------------------------------- the model (transformers' module names)
class Bottleneck(nn.Module):
    def __init__(self, cin, width, cout, stride, trainable):
        nn.Module.__init__(self)
        self.stride = stride
        self.width, self.cout = width, cout
        self.conv1 = param(cin * width, trainable)
        self.conv2 = param(width * width * 9, trainable)
        self.conv3 = param(width * cout, trainable)
        self.downsample = param(cin * cout, trainable) if (stride != 1 or cin != cout) else None

    def forward(self, x):
        B, _, h, w = x.shape
        h, w = math.ceil(h / self.stride), math.ceil(w / self.stride)
        a = op(B, self.width, h, w, saved=(x,))                 # conv1 + frozen BN + ReLU
        a = op(B, self.width, h, w, saved=(a,))
        a = op(B, self.width, h, w, saved=(a,))                 # conv2 (3x3, stride) + BN + ReLU
        a = op(B, self.width, h, w, saved=(a,))
        y = op(B, self.cout, h, w, saved=(a,))                  # conv3 + BN
        if self.downsample is not None:
            idn = op(B, self.cout, h, w, saved=(x,))
        else:
            idn = x
        return op(B, self.cout, h, w, saved=(y, idn))           # add + ReLU


class ResNetStage(nn.Module):
    def __init__(self, cin, width, cout, blocks, stride, trainable):
        nn.Module.__init__(self)
        self.blocks = []
        for i in range(blocks):
            b = Bottleneck(cin if i == 0 else cout, width, cout, stride if i == 0 else 1, trainable)
            setattr(self, "block%d" % i, b)
            self.blocks.append(b)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class DeformableDetrConvEncoder(nn.Module):
    """timm resnet50, features of layers 2-4; the stem and layer1 frozen, as transformers does."""

    def __init__(self):
        nn.Module.__init__(self)
        self.stem = param(3 * 64 * 49, trainable=False)
        self.layer1 = ResNetStage(64, 64, 256, 3, 1, trainable=False)
        self.layer2 = ResNetStage(256, 128, 512, 4, 2, trainable=True)
        self.layer3 = ResNetStage(512, 256, 1024, 6, 2, trainable=True)
        self.layer4 = ResNetStage(1024, 512, 2048, 3, 2, trainable=True)

    def forward(self, pixel_values):
        B, _, H, W = pixel_values.shape
        with torch.no_grad():                                    # frozen: nothing is saved up to layer1
            x = new(B, 64, math.ceil(H / 4), math.ceil(W / 4))
            x = self.layer1(x)
        c3 = self.layer2(x)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c3, c4, c5]


class DeformableDetrMultiscaleDeformableAttention(nn.Module):
    def __init__(self, d_model=256, n_levels=4, n_heads=8, n_points=4):
        nn.Module.__init__(self)
        self.sampling_offsets = param(d_model * n_heads * n_levels * n_points * 2)
        self.attention_weights = param(d_model * n_heads * n_levels * n_points)
        self.value_proj = param(d_model * d_model)
        self.output_proj = param(d_model * d_model)

    def forward(self, hidden_states, reference_points):
        B, N, C = hidden_states.shape
        value = op(B, N, C, saved=(hidden_states,))
        offsets = op(B, N, 256, saved=(hidden_states,))
        weights = op(B, N, 128, saved=(hidden_states,))
        weights = op(B, N, 128, saved=(weights,))                # softmax over levels x points
        locations = op(B, N, 256, saved=(offsets, reference_points))
        sampled = op(B, N, C, saved=(value, locations, weights))  # MultiScaleDeformableAttention kernel
        return op(B, N, C, saved=(sampled,))


class DeformableDetrEncoderLayer(nn.Module):
    def __init__(self, d_model=256, ffn_dim=1024):
        nn.Module.__init__(self)
        self.self_attn = DeformableDetrMultiscaleDeformableAttention(d_model)
        self.fc1 = param(d_model * ffn_dim)
        self.fc2 = param(ffn_dim * d_model)
        self.ffn_dim = ffn_dim

    def forward(self, hidden_states, position_embeddings, reference_points):
        B, N, C = hidden_states.shape
        q = op(B, N, C, saved=(hidden_states, position_embeddings))
        attn = self.self_attn(q, reference_points)
        h = op(B, N, C, saved=(attn, hidden_states))             # dropout + residual
        h = op(B, N, C, saved=(h,))                              # self_attn_layer_norm
        f = op(B, N, self.ffn_dim, saved=(h,))                   # fc1
        f = op(B, N, self.ffn_dim, saved=(f,))                   # ReLU + dropout
        f = op(B, N, C, saved=(f,))                              # fc2
        h = op(B, N, C, saved=(f, h))
        return op(B, N, C, saved=(h,))                           # final_layer_norm


class DeformableDetrDecoderLayer(nn.Module):
    def __init__(self, d_model=256, ffn_dim=1024):
        nn.Module.__init__(self)
        self.self_attn = param(4 * d_model * d_model)
        self.encoder_attn = DeformableDetrMultiscaleDeformableAttention(d_model)
        self.fc1 = param(d_model * ffn_dim)
        self.fc2 = param(ffn_dim * d_model)

    def forward(self, queries, memory, reference_points):
        B, Q, C = queries.shape
        B, N, C = memory.shape
        value = op(B, N, C, saved=(memory,))                     # cross-attention values over all tokens
        q = op(B, Q, C, saved=(queries, value))
        for _ in range(8):
            q = op(B, Q, C, saved=(q,))
        return q


class DeformableDetrModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.backbone = DeformableDetrConvEncoder()
        self.input_proj = param((512 + 1024 + 2048 + 2048 * 9) * 256)
        self.encoder_layers = []
        self.decoder_layers = []
        for i in range(6):
            e, d = DeformableDetrEncoderLayer(), DeformableDetrDecoderLayer()
            setattr(self, "encoder_layer%d" % i, e)
            setattr(self, "decoder_layer%d" % i, d)
            self.encoder_layers.append(e)
            self.decoder_layers.append(d)
        self.query_position_embeddings = param(300 * 512)

    def forward(self, pixel_values, pixel_mask):
        B, _, H, W = pixel_values.shape
        feats = self.backbone(pixel_values)
        levels = [(math.ceil(H / s), math.ceil(W / s)) for s in (8, 16, 32, 64)]
        srcs = []
        for i, (h, w) in enumerate(levels):
            src = op(B, 256, h, w, saved=(feats[min(i, 2)],))    # 1x1 (or 3x3 stride 2) conv
            srcs.append(op(B, 256, h, w, saved=(src,)))          # GroupNorm
        N = sum(h * w for h, w in levels)
        hidden = op(B, N, 256, saved=tuple(srcs))                # flattened, level embeddings added
        pos = op(B, N, 256)                                      # sine position embeddings
        refs = op(B, N, 4, 2)
        for layer in self.encoder_layers:
            hidden = layer(hidden, pos, refs)
        queries = op(B, 300, 256, saved=(hidden,))
        for layer in self.decoder_layers:
            queries = layer(queries, hidden, refs)
        return queries


class DeformableDetrForObjectDetection(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.model = DeformableDetrModel()
        self.class_embed = param(256 * 7)
        self.bbox_embed = param(3 * 256 * 256)

    def forward(self, pixel_values, pixel_mask, labels):
        B = pixel_values.shape[0]
        queries = self.model(pixel_values, pixel_mask)
        logits = op(B, 300, 7, saved=(queries,))
        boxes = op(B, 300, 4, saved=(queries,))
        loss = op(1, saved=(logits, boxes))                      # Hungarian matching + focal, L1, GIoU
        return {"loss": loss, "logits": logits, "pred_boxes": boxes}


# ---------------------------------------------------------------- the data
def resized(w, h, short):
    """A.SmallestMaxSize(short) then A.LongestMaxSize(1333): the image's (width, height)."""
    scale = short / min(w, h)
    if max(w, h) * scale > MAX_SIZE:
        scale = MAX_SIZE / max(w, h)
    return round(w * scale), round(h * scale)


def build_train_set():
    patrol = [("patrol_%05d.jpg" % i, 1920, 1080) for i in range(19800)]
    dslr = [("dslr_%04d.jpg" % i, 4000, 6000) for i in range(240)]     # portrait close-ups, new this week
    return patrol + dslr


def loader(train_set, rng):
    order = list(range(len(train_set)))
    rng.shuffle(order)
    for i in range(0, len(order) - BATCH_SIZE + 1, BATCH_SIZE):
        items = [train_set[j] for j in order[i:i + BATCH_SIZE]]
        sizes = [resized(w, h, rng.choice(SHORT_SIDES)) for _, w, h in items]
        H = max(h for _, h in sizes)                             # processor.pad: tallest and widest
        W = max(w for w, _ in sizes)
        yield [name for name, _, _ in items], H, W


def main():
    rng = random.Random(SEED)
    model = DeformableDetrForObjectDetection().cuda()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, weight_decay=1e-4)
    print("parameters %.1fM, trainable %.1fM" % (sum(p.nbytes for p in model.parameters()) / 4e6,
                                                  sum(p.nbytes for p in params) / 4e6))
    train_set = build_train_set()
    for step, (names, H, W) in enumerate(loader(train_set, rng)):
        pixel_values = new(BATCH_SIZE, 3, H, W)                  # batch["pixel_values"].cuda()
        pixel_mask = new(BATCH_SIZE, H, W, dtype=torch.uint8)
        outputs = model(pixel_values=pixel_values, pixel_mask=pixel_mask, labels=None)
        loss = outputs["loss"]
        backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        portraits = sum(n.startswith("dslr") for n in names)
        print("step %d  batch padded to %d x %d (h x w, %.2f MP/image, %d DSLR)  peak %.1f GiB" % (
            step, H, W, H * W / 1e6, portraits, torch.cuda.max_memory_allocated() / 2 ** 30))
        sys.stdout.flush()
        torch.cuda.reset_peak_memory_stats()


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
