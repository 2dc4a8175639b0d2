"""finetune_k400.py -- fine-tuning VideoMAE ViT-L (304M parameters, fp32 master weights) on Kinetics-400
on one RTX 3090 (24 GB), research code on top of Hugging Face's VideoMAE (eager attention):

    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3 * batch_size / 256)
    for clips, labels in train_loader:                     # batch 8 x 16 frames x 224^2
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(clips), labels)
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)
        if step % eval_every == 0:
            evaluate(model, val_loader)

    @torch.no_grad()
    def evaluate(model, loader):                            # the paper's protocol: 5 clips x 3 crops
        model.eval()
        for videos, labels in loader:                       # batch 8 videos, each 15 views
            views = videos.view(-1, 3, 16, 224, 224)        # 120 clips in ONE forward
            probs = model(views).softmax(-1).view(8, 15, -1).mean(1)

Training fits with room to spare (bf16 autocast, checkpointing, 8 clips: weights 1.1 GiB, AdamW 2.3 GiB,
a few GiB of activations).  The first evaluation dies in the first encoder layer: the 15-view test
protocol turns a batch of 8 videos into 120 clips in one forward pass, outside autocast (fp32), and
eager attention makes 120 x 16 heads x 1568^2 scores (17.6 GiB) at once.  Autograd is off (no_grad)
and the model is in eval mode.

An expert: this is the evaluation pass, not training -- run the 15 views in chunks (or a smaller
evaluation batch: 1-2 videos per forward), and/or use SDPA/flash attention, which never makes the
score matrix; evaluating in the same bf16 autocast as training halves it too.  Gradient checkpointing
does nothing under no_grad, inference_mode saves nothing over no_grad here, and the optimizer state
(2.3 GiB) is not what fills the card.
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

TOKENS = 1568          # 8 temporal x 14 x 14 patches (tubelet 2, patch 16)
HIDDEN = 1024
HEADS = 16
LAYERS = 24
CLASSES = 400
CLIP_BYTES_FP32 = 3 * 16 * 224 * 224 * 4
cfg = {"batch_size": 8, "num_views": 15, "eval_every": 3, "lr": 1e-3}


def act_bytes(clips, per_clip, itemsize):
    return clips * per_clip * itemsize


def itemsize():
    return 2 if torch.is_autocast_enabled() else 4


class VideoMAESelfAttention(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.qkv = nn.Parameter(torch.empty(3 * HIDDEN * HIDDEN * 4, device="cuda"))
        self.proj = nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))

    def forward(self, hidden_states, clips):
        w = itemsize()
        mixed = torch.empty(act_bytes(clips, 3 * TOKENS * HIDDEN, w), device="cuda")      # q, k, v
        mixed._saved = hidden_states
        # attention_scores = torch.matmul(query_layer, key_layer.transpose(-1, -2))
        attention_scores = torch.empty(act_bytes(clips, HEADS * TOKENS * TOKENS, w), device="cuda")
        attention_scores._saved = mixed
        attention_probs = torch.empty(act_bytes(clips, HEADS * TOKENS * TOKENS, w), device="cuda")
        attention_probs._saved = attention_scores
        del attention_scores
        context = torch.empty(act_bytes(clips, TOKENS * HIDDEN, w), device="cuda")
        context._saved = attention_probs
        return context


class VideoMAELayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = VideoMAESelfAttention()
        self.fc1 = nn.Parameter(torch.empty(HIDDEN * 4 * HIDDEN * 4, device="cuda"))
        self.fc2 = nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN * 4, device="cuda"))

    def forward(self, hidden_states, clips):
        a = self.attention(hidden_states, clips)
        h = torch.empty(act_bytes(clips, 4 * TOKENS * HIDDEN, itemsize()), device="cuda")
        h._saved = a
        out = torch.empty(act_bytes(clips, TOKENS * HIDDEN, itemsize()), device="cuda")
        out._saved = h
        return out


class VideoMAEForVideoClassification(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.patch_embed = nn.Parameter(torch.empty(3 * 2 * 16 * 16 * HIDDEN * 4, device="cuda"))
        self.layers = [VideoMAELayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = nn.Parameter(torch.empty(HIDDEN * CLASSES * 4, device="cuda"))
        self.gradient_checkpointing = False

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, pixel_values, clips):
        x = torch.empty(act_bytes(clips, TOKENS * HIDDEN, itemsize()), device="cuda")
        x._saved = pixel_values
        for layer in self.layers:
            if self.gradient_checkpointing and self.training:
                # torch.utils.checkpoint: keep only the layer's input; the inside is recomputed in backward
                with torch.no_grad():
                    y = layer(x, clips)
                y._saved = x
                y._params = tuple(layer.parameters())
            else:
                y = layer(x, clips)
            x = y
        logits = torch.empty(act_bytes(clips, CLASSES, 4), device="cuda")
        logits._saved = x
        if torch.is_grad_enabled():
            logits._params = tuple(self.parameters())          # every layer, through the checkpoints
        return logits


def evaluate(model, val_loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for videos, labels in val_loader:
            n_videos = len(labels)
            clips = n_videos * cfg["num_views"]            # views = videos.view(-1, 3, 16, 224, 224)
            logits = model(videos, clips)
            probs = logits          # .softmax(-1).view(n_videos, num_views, -1).mean(1)
            correct += n_videos
    model.train()
    return correct


def val_batches():
    for _ in range(250):
        videos = torch.empty(cfg["batch_size"] * cfg["num_views"] * CLIP_BYTES_FP32, device="cuda")
        yield videos, list(range(cfg["batch_size"]))


def main():
    batch_size = cfg["batch_size"]
    model = VideoMAEForVideoClassification()
    model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"] * batch_size / 256)
    for step in range(1, 100000):
        clips = torch.empty(batch_size * CLIP_BYTES_FP32, device="cuda")
        labels = torch.empty(batch_size * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(clips, batch_size)
            loss = F.cross_entropy(logits, labels)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits, clips, labels
        if step % cfg["eval_every"] == 0:
            acc = evaluate(model, val_batches())
            print("step %d val top-1 %s" % (step, acc))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
