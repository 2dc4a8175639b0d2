"""DINO-DETR (Swin-L, 4-scale) fine-tuned on dense aerial vehicle tiles: the Hungarian matcher's batch-wide
cost matrix blows up on the one batch whose four tiles are packed parking lots.

The real program is IDEA-Research/DINO's main.py / engine.train_one_epoch with config
DINO_4scale_swin.py, edited for a DOTA-style "small-vehicle" dataset cut into 1024x1024 tiles:

    num_queries = 3000          # raised from 900: some tiles hold more than 900 cars
    batch_size = 4              # one A100-SXM4-40GB, fp32 (the repo's default, amp off)
    ...
    for samples, targets in data_loader:
        outputs = model(samples, targets)                  # Swin-L + deformable enc/dec, 6 aux heads
        loss_dict = criterion(outputs, targets)             # SetCriterion -> HungarianMatcher per head
        losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict)
        optimizer.zero_grad(); losses.backward(); optimizer.step()

models/dino/matcher.py (as in DETR) computes the matching cost of the WHOLE batch at once:
    out_prob = outputs["pred_logits"].flatten(0, 1).sigmoid()      # [bs*nq, C]
    tgt_ids  = torch.cat([v["labels"] for v in targets])            # [sum of targets]
    cost_class = pos_cost_class[:, tgt_ids] - neg_cost_class[:, tgt_ids]
    cost_bbox  = torch.cdist(out_bbox, tgt_bbox, p=1)
    cost_giou  = -generalized_box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))
    C = (...).view(bs, num_queries, -1).cpu()
    indices = [linear_sum_assignment(c[i]) for i, c in enumerate(C.split(sizes, -1))]
Only the bs diagonal blocks (nq x n_i) are ever used, but (bs*nq) x (sum n_i) is built, and
generalized_box_iou materialises several [N, M, 2] float32 temporaries (lt, rb, wh, twice).

Arithmetic.  N = bs*nq = 4 x 3000 = 12,000 query rows.  A normal batch has ~300 vehicles per tile,
M ~ 1,200: an N x M float32 matrix is 57.6 MB and the matcher peaks well under 1 GB.  Iteration 3 of
the epoch draws four packed parking-lot tiles (2,640 + 2,580 + 2,710 + 2,470 = 10,400 vehicles):
N x M = 124.8 M elements = 476 MiB per matrix, 952 MiB per [N, M, 2] temporary; cost_class,
cost_bbox, iou, union, lt, rb and (rb - lt) alive together are ~4.7 GiB.  The 40 GiB card holds the
CUDA context (0.5 GiB), 218 M fp32 params (0.81 GiB), AdamW's moments (1.62 GiB) and ~33.1 GiB of
activations saved by the forward (Swin-L at 1024^2 x 4 ~19.9 GiB, 6 deformable encoder layers over
~21.8 k tokens/image ~9.8 GiB, 6 decoder layers over 3000 + denoising queries ~3.4 GiB): ~36.3 GiB
allocated before the matcher, ~3.1 GiB left in all (about 0.9 GiB of it cached in pieces of a few
hundred MiB at most).  With cost_class, cost_bbox and lt made (1.9 GiB), the 952 MiB `rb` of
box_iou fails, ~1.6 GiB short of the matcher's peak.  Nothing grows across steps: the first three
steps (normal batches) peaked at 39.7 GB (37.0 GiB), the batch size the user tuned to the card.

What an expert says first: the matcher's batch-wide cost matrix is quadratic in (batch x queries)
and in the batch's total number of objects; compute it per image (the blocks that are used, 4x
smaller here: nq x n_i per image), or at least cap the targets per tile / lower the batch for dense
tiles.  A smaller batch (2) also cuts the matrix 4x and the activations 2x.  Wrong advice:
expandable_segments or empty_cache (the ~1 GiB cached in pieces would place this one temporary at
best; the matcher needs ~4.7 GiB where ~3.1 GiB is left in all, and PyTorch already emptied its
cache before raising), inference_mode (this is training), flash-attention or shorter sequences (the
failing work is box IoU, not attention), quantization.
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MB = 1000 * 1000
MiB = 1024 * 1024

# --- config (config/DINO/DINO_4scale_swin.py, edited) ------------------------------------------
NUM_QUERIES = 3000
NUM_CLASSES = 2            # small-vehicle, large-vehicle
BATCH_SIZE = 4
IMAGE_SIZE = 1024
DEC_LAYERS = 6
LR = 1e-4
ENC_ACT_MIB = 416          # saved per encoder layer per image
DEC_ACT_MIB = 144          # saved per decoder layer per image


def new_tensor(*shape, **kw):
    """A float32 tensor of `shape` on the GPU (stand-in for the torch op named beside each call)."""
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=kw.get("dtype", torch.float32), device="cuda")
    t.shape = tuple(shape)
    return t


# --- the model -------------------------------------------------------------------------------
class SwinStage(nn.Module):
    def __init__(self, params_m, depth, act_mb_per_block_per_image):
        nn.Module.__init__(self)
        self.depth = depth
        self.act = act_mb_per_block_per_image
        per_block = int(params_m * 1e6 / depth)
        for i in range(depth):
            setattr(self, "block%d" % i, nn.Parameter(torch.empty(per_block, dtype=torch.float32, device="cuda")))

    def forward(self, x):
        h = x
        for i in range(self.depth):
            w = getattr(self, "block%d" % i)
            # window attention + MLP of one Swin block: what autograd saves for backward
            out = new_tensor(int(self.act * MiB) // 4 * x.shape[0])
            out._saved = h
            out.shape = x.shape
            h = torch._derive(out, h, w)
        return h


class SwinTransformerL(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.stages = [SwinStage(1.0, 2, 668), SwinStage(4.0, 2, 334), SwinStage(160.0, 18, 162),
                       SwinStage(32.0, 2, 86)]
        for i, s in enumerate(self.stages):
            setattr(self, "layers%d" % i, s)

    def forward(self, images):
        feats, h = [], images
        for s in self.stages:
            h = s(h)
            feats.append(h)
        return feats


class DeformableTransformer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        for i in range(6):
            setattr(self, "encoder_layer%d" % i,
                    nn.Parameter(torch.empty(int(1.4e6), dtype=torch.float32, device="cuda")))
        for i in range(DEC_LAYERS):
            setattr(self, "decoder_layer%d" % i,
                    nn.Parameter(torch.empty(int(1.6e6), dtype=torch.float32, device="cuda")))
        self.class_embed = nn.Parameter(torch.empty(int(0.4e6), dtype=torch.float32, device="cuda"))
        self.bbox_embed = nn.Parameter(torch.empty(int(0.4e6), dtype=torch.float32, device="cuda"))
        self.input_proj = nn.Parameter(torch.empty(int(4.8e6), dtype=torch.float32, device="cuda"))

    def forward(self, feats, bs):
        memory = feats[-1]
        for i in range(6):
            w = getattr(self, "encoder_layer%d" % i)
            # MSDeformAttn over ~21.8k multi-scale tokens per image (sampling offsets, weights, values)
            out = new_tensor(int(ENC_ACT_MIB * MiB) // 4 * bs)
            out._saved = memory
            memory = torch._derive(out, memory, w, *feats)
        hs, outputs = memory, []          # queries attend to `memory`: the chain of saved tensors goes on
        for i in range(DEC_LAYERS):
            w = getattr(self, "decoder_layer%d" % i)
            # self-attention over 3000 + 200 denoising queries, deformable cross-attention to memory
            out = new_tensor(int(DEC_ACT_MIB * MiB) // 4 * bs)
            out._saved = hs
            hs = torch._derive(out, hs, w, memory)
            logits = new_tensor(bs, NUM_QUERIES, NUM_CLASSES)          # class_embed(hs)
            logits._saved = hs
            torch._derive(logits, hs, self.class_embed)
            boxes = new_tensor(bs, NUM_QUERIES, 4)                     # bbox_embed(hs).sigmoid()
            boxes._saved = hs
            torch._derive(boxes, hs, self.bbox_embed)
            outputs.append({"pred_logits": logits, "pred_boxes": boxes})
        return outputs


class DINO(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.backbone = SwinTransformerL()
        self.transformer = DeformableTransformer()

    def forward(self, samples, targets=None):
        feats = self.backbone(samples)
        outs = self.transformer(feats, samples.shape[0])
        out = dict(outs[-1])
        out["aux_outputs"] = outs[:-1]
        return out


# --- util/box_ops.py ---------------------------------------------------------------------------
def box_cxcywh_to_xyxy(x):
    y = new_tensor(*x.shape)
    return y


def box_area(boxes):
    return new_tensor(boxes.shape[0])


def box_iou(boxes1, boxes2):
    area1 = box_area(boxes1)
    area2 = box_area(boxes2)
    n, m = boxes1.shape[0], boxes2.shape[0]
    lt = new_tensor(n, m, 2)        # torch.max(boxes1[:, None, :2], boxes2[:, :2])  # [N,M,2]
    rb = new_tensor(n, m, 2)        # torch.min(boxes1[:, None, 2:], boxes2[:, 2:])  # [N,M,2]
    diff = new_tensor(n, m, 2)      # (rb - lt)
    wh = new_tensor(n, m, 2)        # .clamp(min=0)  # [N,M,2]
    del diff
    inter = new_tensor(n, m)        # wh[:, :, 0] * wh[:, :, 1]  # [N,M]
    union = new_tensor(n, m)        # area1[:, None] + area2 - inter
    iou = new_tensor(n, m)          # inter / union
    del lt, rb, wh, inter, area1, area2
    return iou, union


def generalized_box_iou(boxes1, boxes2):
    iou, union = box_iou(boxes1, boxes2)
    n, m = boxes1.shape[0], boxes2.shape[0]
    lt = new_tensor(n, m, 2)        # torch.min(boxes1[:, None, :2], boxes2[:, :2])
    rb = new_tensor(n, m, 2)        # torch.max(boxes1[:, None, 2:], boxes2[:, 2:])
    wh = new_tensor(n, m, 2)        # (rb - lt).clamp(min=0)  # [N,M,2]
    area = new_tensor(n, m)         # wh[:, :, 0] * wh[:, :, 1]
    del lt, rb, wh
    giou = new_tensor(n, m)         # iou - (area - union) / area
    return giou


# --- models/dino/matcher.py --------------------------------------------------------------------
class HungarianMatcher(nn.Module):
    def __init__(self, cost_class=2.0, cost_bbox=5.0, cost_giou=2.0, focal_alpha=0.25):
        nn.Module.__init__(self)
        self.cost_class, self.cost_bbox, self.cost_giou = cost_class, cost_bbox, cost_giou
        self.focal_alpha = focal_alpha

    def forward(self, outputs, targets):
        with torch.no_grad():
            bs, num_queries = outputs["pred_logits"].shape[:2]
            out_prob = new_tensor(bs * num_queries, NUM_CLASSES)   # pred_logits.flatten(0, 1).sigmoid()
            out_bbox = new_tensor(bs * num_queries, 4)             # pred_boxes.flatten(0, 1)
            num_tgt = sum(t["boxes"].shape[0] for t in targets)
            tgt_bbox = new_tensor(num_tgt, 4)                      # torch.cat([v["boxes"] for v in targets])
            neg_cost_class = new_tensor(bs * num_queries, NUM_CLASSES)
            pos_cost_class = new_tensor(bs * num_queries, NUM_CLASSES)
            pos_sel = new_tensor(bs * num_queries, num_tgt)        # pos_cost_class[:, tgt_ids]
            neg_sel = new_tensor(bs * num_queries, num_tgt)        # neg_cost_class[:, tgt_ids]
            cost_class = new_tensor(bs * num_queries, num_tgt)     # pos_sel - neg_sel
            del pos_sel, neg_sel
            cost_bbox = new_tensor(bs * num_queries, num_tgt)      # torch.cdist(out_bbox, tgt_bbox, p=1)
            cost_giou = generalized_box_iou(box_cxcywh_to_xyxy(out_bbox), box_cxcywh_to_xyxy(tgt_bbox))
            C = new_tensor(bs * num_queries, num_tgt)              # weighted sum of the three costs
            del cost_class, cost_bbox, cost_giou
            # C.view(bs, num_queries, -1).cpu(); linear_sum_assignment per image on the host
            sizes = [t["boxes"].shape[0] for t in targets]
            indices = [(list(range(n)), list(range(n))) for n in sizes]
            del C
            return indices


class SetCriterion(nn.Module):
    def __init__(self, matcher):
        nn.Module.__init__(self)
        self.matcher = matcher

    def loss_labels(self, outputs, targets, indices):
        loss = new_tensor(1)
        loss._saved = outputs["pred_logits"]
        return torch._derive(loss, outputs["pred_logits"])

    def loss_boxes(self, outputs, targets, indices):
        loss = new_tensor(1)
        loss._saved = outputs["pred_boxes"]
        return torch._derive(loss, outputs["pred_boxes"])

    def forward(self, outputs, targets):
        losses = {}
        indices = self.matcher(outputs, targets)
        losses["loss_ce"] = self.loss_labels(outputs, targets, indices)
        losses["loss_bbox"] = self.loss_boxes(outputs, targets, indices)
        for i, aux in enumerate(outputs["aux_outputs"]):
            indices = self.matcher(aux, targets)
            losses["loss_ce_%d" % i] = self.loss_labels(aux, targets, indices)
            losses["loss_bbox_%d" % i] = self.loss_boxes(aux, targets, indices)
        return losses


# --- the data: 1024x1024 tiles of a DOTA-style small-vehicle set -----------------------------------
class DenseVehicleTiles(object):
    def __init__(self, seed=0):
        self.rng = random.Random(seed)

    def __iter__(self):
        # three ordinary batches, then the batch of four packed parking lots
        counts = [[self.rng.randint(180, 420) for _ in range(BATCH_SIZE)] for _ in range(3)]
        counts.append([2640, 2580, 2710, 2470])
        for batch in counts:
            images = new_tensor(BATCH_SIZE, 3, IMAGE_SIZE, IMAGE_SIZE)
            targets = [{"boxes": new_tensor(n, 4), "labels": new_tensor(n, dtype=torch.uint8)} for n in batch]
            for t, n in zip(targets, batch):
                t["labels"].shape = (n,)
            yield images, targets


def train_one_epoch(model, criterion, data_loader, optimizer, epoch):
    model.train()
    criterion.train()
    for it, (samples, targets) in enumerate(data_loader):
        outputs = model(samples, targets)
        loss_dict = criterion(outputs, targets)
        # losses = sum(loss_dict[k] * weight_dict[k] for k in loss_dict.keys() if k in weight_dict)
        losses = new_tensor(1)
        losses._saved = loss_dict["loss_ce"]
        torch._derive(losses, *loss_dict.values())
        optimizer.zero_grad()
        scen_truth.backward(losses)
        optimizer.step()
        del outputs, loss_dict, losses
        print("epoch %d it %d: max mem %.0f MB, targets in batch %d" % (
            epoch, it, torch.cuda.max_memory_allocated() / MB, sum(t["boxes"].shape[0] for t in targets)))


def main():
    model = DINO()
    criterion = SetCriterion(HungarianMatcher())
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=1e-4)
    train_one_epoch(model, criterion, DenseVehicleTiles(seed=3), optimizer, epoch=3)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
