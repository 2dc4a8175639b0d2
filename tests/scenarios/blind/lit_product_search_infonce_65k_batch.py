"""train_lit.py -- locked-image tuning (LiT) for a shop's product search: the image tower is frozen and its
embeddings of the 40M catalogue photos are precomputed on disk; a 12-layer text tower (width 512, titles cut
to 40 tokens, gradient checkpointing on) learns to match them with the symmetric InfoNCE loss of CLIP, on
one 80 GB H100, with a plain `LD_PRELOAD=liboomguard.so`.  Contrastive training wants big batches, so after
a good run at 16384 the user tries 65536 pairs per step:

    with torch.autocast("cuda", dtype=torch.bfloat16):
        text_features = text_tower(input_ids)                       # checkpointed layers
    # loss in fp32 for a stable 65k-way softmax (open_clip's ClipLoss computes both matrices)
    logits_per_image = logit_scale * image_features @ text_features.float().T     # 65536 x 65536
    logits_per_text  = logit_scale * text_features.float() @ image_features.T
    loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2

Each similarity matrix is 65536^2 fp32 = 16 GiB, and cross_entropy keeps a log_softmax of the same size
for backward.  The tower keeps 32.5 GiB (the embedded input and 12 checkpointed layer outputs of 2.5 GiB);
the two logit matrices take 32 GiB more; the first cross_entropy's log_softmax (16 GiB asked, 14 GiB free)
fails in the very first step, and the second direction would need another 16 GiB, the backward more.
At 16384 the same four matrices were 4 GiB together: the loss grows with the square of
the batch, the tower only linearly.

An expert: the N x N loss is the problem, not the tower.  Compute the contrastive loss in chunks of rows
(a chunked or fused InfoNCE that never materialises the whole matrix and its log_softmax -- as SigLIP's
chunked loss or GradCache do), or shard it across GPUs (each rank scores its local rows against the
gathered features), and at least take logits_per_text as the transpose of logits_per_image instead of a
second product.  A smaller batch with gradient accumulation is not the same training: in-batch negatives
do not accumulate.  Not mixed precision (autocast already on; the softmax runs in fp32 under autocast
anyway), not more checkpointing (the tower is checkpointed; the loss is outside it), not inference.
"""
import sys

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

GiB = 1 << 30
scen_truth.note_every_empty(torch)

batch_size = 65536
SEQ = 40
WIDTH = 512
EMBED = 1024


class TextTransformerLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attn = nn.Parameter(torch.empty(4 * WIDTH * WIDTH * 4, device="cuda"))
        self.mlp = nn.Parameter(torch.empty(2 * WIDTH * 4 * WIDTH * 4, device="cuda"))

    def forward(self, x):
        # checkpointed: the inner activations are recomputed in backward; only the layer's input is kept
        out = torch.empty(batch_size * SEQ * WIDTH * 2, device="cuda")
        out._saved = x
        return out


class TextTower(nn.Module):
    def __init__(self, layers=12):
        nn.Module.__init__(self)
        self.token_embedding = nn.Parameter(torch.empty(49408 * WIDTH * 4, device="cuda"))
        self.layers = [TextTransformerLayer() for _ in range(layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer_%d" % i, l)
        self.text_projection = nn.Parameter(torch.empty(WIDTH * EMBED * 4, device="cuda"))
        self.gradient_checkpointing = True

    def forward(self, input_ids):
        x = torch.empty(batch_size * SEQ * WIDTH * 2, device="cuda")
        x._saved = input_ids
        for layer in self.layers:
            x = layer(x)
        pooled = torch.empty(batch_size * WIDTH * 2, device="cuda")
        pooled._saved = x
        features = torch.empty(batch_size * EMBED * 2, device="cuda")
        features._saved = pooled
        return features


def similarity(scale, a, b):
    """logit_scale * a @ b.T in fp32: a batch_size x batch_size matrix."""
    out = torch.empty(batch_size * batch_size * 4, device="cuda")
    out._saved = a
    return torch._derive(out, a, b, scale)


def as_float(t):
    out = torch.empty(t.nbytes * 2, device="cuda")
    out._saved = t
    return torch._derive(out, t)


class ClipLoss(nn.Module):
    def forward(self, image_features, text_features, logit_scale):
        labels = torch.empty(batch_size * 8, device="cuda")
        text_features = as_float(text_features)
        logits_per_image = similarity(logit_scale, image_features, text_features)
        logits_per_text = similarity(logit_scale, text_features, image_features)
        total_loss = (F.cross_entropy(logits_per_image, labels) + F.cross_entropy(logits_per_text, labels)) / 2
        return total_loss


def load_image_embeddings(step):
    """This batch's precomputed (frozen) image embeddings, read from disk and moved to the GPU as fp32."""
    return torch.empty(batch_size * EMBED * 4, device="cuda")


def main():
    text_tower = TextTower()
    text_tower.train()
    logit_scale = nn.Parameter(torch.empty(4, device="cuda"))
    criterion = ClipLoss()
    optimizer = torch.optim.AdamW(text_tower.parameters() + [logit_scale], lr=5e-4, weight_decay=0.05)
    for step in range(20000):
        input_ids = torch.empty(batch_size * SEQ * 8, device="cuda")
        image_features = load_image_embeddings(step)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            text_features = text_tower(input_ids)
        loss = criterion(image_features, text_features, logit_scale)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, text_features, image_features, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
