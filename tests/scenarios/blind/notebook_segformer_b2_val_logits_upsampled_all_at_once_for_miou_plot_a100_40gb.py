"""Jupyter (Colab Pro, A100 40 GB): after fine-tuning SegFormer-B2 on Cityscapes, the evaluation cell keeps the
500 validation logit maps on the GPU and the metrics/plot cell upsamples all of them to full resolution in one
F.interpolate call: a 74.2 GiB request on a 40 GiB card.

The notebook, with real libraries:

    [3]  model = SegformerForSemanticSegmentation.from_pretrained("nvidia/mit-b2", num_labels=19).cuda()
         optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5)
    [5]  train(model, train_dl, optimizer, epochs=20)                      # 1024x1024 crops, batch 2
    [6]  model.eval(); all_logits = []
         with torch.no_grad():
             for batch in val_dl:                                          # 500 images 1024x2048, batch 4
                 out = model(pixel_values=batch["pixel_values"].cuda())
                 all_logits.append(out.logits)                             # (4, 19, 256, 512) fp32, 1/4 res
    [7]  val_logits = torch.cat(all_logits); val_logits.shape               # torch.Size([500, 19, 256, 512])
    [8]  up = F.interpolate(val_logits, scale_factor=4, mode="bilinear", align_corners=False)
         preds = up.argmax(dim=1)
         miou = metric.compute(predictions=preds.cpu().numpy(), references=val_labels, num_labels=19)
         plot_predictions(val_images[:6], preds[:6])
         -> OutOfMemoryError: Tried to allocate 74.21 GiB

What happens.  SegFormer predicts at a quarter of the input size; the metric and the plots want full
resolution.  Each map alone is small (19 x 256 x 512 x 4 B = 9.5 MiB), so collecting 500 of them looks
harmless: 4.64 GiB, and torch.cat makes a second copy while the list still holds the first.  Upsampling x4
in both dimensions multiplies the bytes by 16: 500 x 19 x 1024 x 2048 x 4 B = 74.2 GiB for one output tensor,
more than the whole card.  Training leftovers (weights 91 MiB, AdamW state 181 MiB) are noise here.

Sizes: allocated before cell [8]: weights 0.09 GiB + AdamW 0.18 GiB + all_logits 4.64 GiB + val_logits
4.64 GiB = 9.55 GiB (+0.5 GiB context, 3 GiB cached from the evaluation) of 40 GiB; the request: 74.2 GiB.
Even an 80 GB card would fail: the step needs ~84 GiB at once, and argmax's int64 output adds 7.8 GiB.

What an expert says first: do not materialize the upsampled logits of the whole set.  Upsample and argmax
per image (or per batch, inside the evaluation loop), keep only the uint8 / int64 predictions, on the CPU
(`preds.append(F.interpolate(out.logits, size=label.shape[-2:], mode="bilinear").argmax(1).cpu())`), and
`del all_logits` (the list and its cat copy are 9.3 GiB).
Wrong advice: empty_cache / expandable_segments (nothing cached or fragmented can hold 74 GiB), freeing the
training state (0.27 GiB), autocast or gradient checkpointing (already under no_grad, nothing is saved),
inference_mode (same), smaller training batch, a bigger GPU (80 GB would still fail).
"""
import sys
import traceback

import torch
from torch import nn
from torch.nn import functional as F

import scen_truth

scen_truth.note_every_empty(torch)

NUM_LABELS = 19
VAL_IMAGES, VAL_BATCH = 500, 4
VAL_H, VAL_W = 1024, 2048
CROP, TRAIN_BATCH = 1024, 2
HIDDEN = (64, 128, 320, 512)
DEPTHS = (3, 4, 6, 3)
SR_RATIOS = (8, 4, 2, 1)
F32 = 4


def _act(nbytes, saved=None):
    """The output of an operation of the forward (the stand-in computes nothing): nbytes on the GPU; with
    autograd on it saves `saved` for backward."""
    out = torch.empty(int(nbytes))
    if torch.is_grad_enabled():
        out._saved = saved
    return out


class Linear(nn.Module):
    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float32))
        self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float32))

    def forward(self, x):
        return _act(x.nbytes // self.in_features * self.out_features, x)


class ModuleList(nn.Module):
    def __init__(self, mods):
        nn.Module.__init__(self)
        for i, m in enumerate(mods):
            self._modules[str(i)] = m

    def __iter__(self):
        return iter(self._modules.values())


class SegformerEfficientSelfAttention(nn.Module):
    def __init__(self, hidden, sr_ratio):
        nn.Module.__init__(self)
        self.hidden, self.sr_ratio = hidden, sr_ratio
        self.query = Linear(hidden, hidden)
        self.key = Linear(hidden, hidden)
        self.value = Linear(hidden, hidden)
        if sr_ratio > 1:
            self.sr = nn.Conv2d(hidden, hidden, sr_ratio, stride=sr_ratio)

    def forward(self, hidden_states, tokens, batch):
        q = self.query(hidden_states)
        kv_tokens = tokens // (self.sr_ratio ** 2)
        kv = _act(batch * kv_tokens * self.hidden * F32, hidden_states)       # sr conv + layernorm
        k, v = self.key(kv), self.value(kv)
        heads = max(1, self.hidden // 64)
        scores = _act(batch * heads * tokens * kv_tokens * F32, q)            # softmax(q k^T / sqrt(d))
        return _act(hidden_states.nbytes, scores)                             # scores @ v


class SegformerLayer(nn.Module):
    def __init__(self, hidden, sr_ratio):
        nn.Module.__init__(self)
        self.attention = SegformerEfficientSelfAttention(hidden, sr_ratio)
        self.mlp_dense1 = Linear(hidden, hidden * 4)
        self.mlp_dense2 = Linear(hidden * 4, hidden)

    def forward(self, x, tokens, batch):
        x = _act(x.nbytes, self.attention(x, tokens, batch))                  # residual
        h = self.mlp_dense1(x)
        h = _act(h.nbytes, h)                                                 # depthwise conv + GELU (Mix-FFN)
        return _act(x.nbytes, self.mlp_dense2(h))                             # residual


class SegformerEncoder(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.block = ModuleList([ModuleList([SegformerLayer(HIDDEN[s], SR_RATIOS[s]) for _ in range(DEPTHS[s])])
                                 for s in range(4)])

    def forward(self, pixel_values, batch, h, w):
        feats = []
        x = pixel_values
        for s, stage in enumerate(self.block):
            scale = 4 * 2 ** s
            tokens = (h // scale) * (w // scale)
            x = _act(batch * tokens * HIDDEN[s] * F32, x)                     # overlapping patch embedding
            for layer in stage:
                x = layer(x, tokens, batch)
            feats.append(x)
        return feats


class SegformerDecodeHead(nn.Module):
    def __init__(self, num_labels, decoder_hidden=768):
        nn.Module.__init__(self)
        self.decoder_hidden = decoder_hidden
        self.linear_c = ModuleList([Linear(c, decoder_hidden) for c in HIDDEN])
        self.linear_fuse = Linear(4 * decoder_hidden, decoder_hidden)
        self.classifier = Linear(decoder_hidden, num_labels)

    def forward(self, feats, batch, h, w):
        tokens = (h // 4) * (w // 4)
        ups = [_act(batch * tokens * self.decoder_hidden * F32, f) for f in feats]   # MLP + upsample to 1/4
        fused = self.linear_fuse(_act(4 * ups[0].nbytes, ups[-1]))                 # cat + 1x1 conv
        return self.classifier(fused)                                               # (B, 19, H/4, W/4)


class SemanticSegmenterOutput(object):
    def __init__(self, loss=None, logits=None):
        self.loss, self.logits = loss, logits


class SegformerForSemanticSegmentation(nn.Module):
    def __init__(self, num_labels):
        nn.Module.__init__(self)
        self.segformer = SegformerEncoder()
        self.decode_head = SegformerDecodeHead(num_labels)

    def forward(self, pixel_values, labels=None):
        batch, _, height, width = pixel_values.shape
        feats = self.segformer(pixel_values, batch, height, width)
        logits = self.decode_head(feats, batch, height, width)
        loss = F.cross_entropy(F.interpolate(logits, scale_factor=4.0), labels) if labels is not None else None
        return SemanticSegmenterOutput(loss=loss, logits=logits)


class NotebookShell(object):
    """IPython around each cell: the last expression's value goes to Out[n] and _; an exception is shown and
    kept in sys.last_*.  stop=True: the error ends the run (as `jupyter nbconvert --execute`)."""

    def __init__(self, user_ns):
        self.user_ns = user_ns
        self.execution_count = 0
        user_ns.setdefault("Out", {})

    def run_cell(self, cell, stop=False):
        self.execution_count += 1
        try:
            result = cell()
        except Exception:
            etype, value, tb = sys.exc_info()
            sys.last_type, sys.last_value, sys.last_traceback = etype, value, tb
            traceback.print_exception(etype, value, tb, limit=3, file=sys.stderr)
            if stop:
                raise
            return None
        if result is not None:
            print("Out[%d]: %r" % (self.execution_count, result))
            self.user_ns["Out"][self.execution_count] = result
            self.user_ns["_"] = result
        return result


def _images(batch, h, w):
    """batch["pixel_values"].cuda(): a (batch, 3, h, w) float32 tensor (the stand-in's tensors have no shape:
    it is set here as PyTorch's would read)."""
    t = torch.empty(batch * 3 * h * w * F32)
    t.shape = (batch, 3, h, w)
    return t


def cityscapes_train(n_batches):
    for _ in range(n_batches):
        yield {"pixel_values": _images(TRAIN_BATCH, CROP, CROP), "labels": torch.empty(TRAIN_BATCH * CROP * CROP * 8)}


def cityscapes_val():
    for _ in range(VAL_IMAGES // VAL_BATCH):
        yield {"pixel_values": _images(VAL_BATCH, VAL_H, VAL_W)}


# ---- the notebook's cells --------------------------------------------------------------------------
model = optimizer = all_logits = val_logits = None


def cell_3_model():
    global model, optimizer
    model = SegformerForSemanticSegmentation(NUM_LABELS)
    model.cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-5)


def train(model, batches, optimizer):
    model.train()
    for step, batch in enumerate(batches):
        out = model(pixel_values=batch["pixel_values"], labels=batch["labels"])
        scen_truth.backward(out.loss)                     # out.loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def cell_5_train():
    train(model, cityscapes_train(n_batches=3), optimizer)   # (20 epochs in the story; 3 steps here)
    print("epoch 20: train loss 0.142")


def cell_6_evaluate():
    global all_logits
    model.eval()
    all_logits = []
    with torch.no_grad():
        for batch in cityscapes_val():
            out = model(pixel_values=batch["pixel_values"])
            all_logits.append(out.logits)


def cell_7_cat():
    global val_logits
    val_logits = cat(all_logits)                                  # torch.cat(all_logits)
    return (VAL_IMAGES, NUM_LABELS, VAL_H // 4, VAL_W // 4)        # val_logits.shape


def cat(tensors):
    """torch.cat (not in the stand-in): one new tensor of all their bytes."""
    return torch.empty(sum(t.nbytes for t in tensors))


def cell_8_metrics_and_plots():
    up = F.interpolate(val_logits, scale_factor=4, mode="bilinear")
    preds = torch.empty(up.nbytes // NUM_LABELS // F32 * 8)          # up.argmax(dim=1), int64
    return preds


def main():
    shell = NotebookShell(globals())
    shell.run_cell(lambda: None)            # [1] installs and imports
    shell.run_cell(lambda: None)            # [2] datasets
    shell.run_cell(cell_3_model)
    shell.run_cell(lambda: None)            # [4] def train
    shell.run_cell(cell_5_train)
    shell.run_cell(cell_6_evaluate)
    shell.run_cell(cell_7_cat)
    shell.run_cell(cell_8_metrics_and_plots, stop=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
