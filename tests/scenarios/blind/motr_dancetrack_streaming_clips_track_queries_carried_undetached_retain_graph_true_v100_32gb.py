"""MOTR (end-to-end multi-object tracker, Deformable-DETR based) fine-tuned on DanceTrack in "streaming" mode:
the track queries of the last frame of a clip are carried into the next clip without detach(), and
`losses.backward(retain_graph=True)` was added to silence the error that followed. Every clip's autograd graph
stays reachable from the carried queries; memory climbs by one clip's activations per iteration until the
5th iteration fails on a 32 GB V100.

The real program (a fork of MOTR's main.py / engine.py, single GPU while debugging):

    class StreamingTrainer:
        def train_clip(self, clip):
            outputs = self.model(clip, track_instances=self.prev_tracks)     # MOTR.forward over 5 frames (608x1088)
            self.prev_tracks = outputs["track_instances"]                     # carried into the next clip
            losses = self.criterion(outputs)                                  # ClipMatcher: weighted frame losses
            self.optimizer.zero_grad()
            losses.backward(retain_graph=True)   # added after "Trying to backward through the graph a second
            self.optimizer.step()                #  time" -- the real fix was self.prev_tracks = ....detach()

(The program backpropagates the weighted frame losses with torch.autograd.backward(list, retain_graph=True),
which is the same as summing them and calling .backward(retain_graph=True).)

MOTR resets track_instances at every clip; the user wanted identities to persist across clips of DanceTrack's
long sequences, so the last frame's Instances (output_embedding, query_pos, ref_pts) were passed on. They are
outputs of the previous clip's decoder: their graph reaches that clip's decoder, encoder and backbone
activations, and through the query interaction module the clip before it, and so on.

Sizes (fp32, batch 1 clip of 5 frames at 608x1088, ResNet-50 + 6/6-layer deformable transformer, 300 detect
queries + tracks): the stand-in model has ~27M parameters = 104 MiB (MOTR's real 43M are 172 MB), AdamW state twice
that; one frame keeps ~0.5 GB of backbone maps and ~0.7 GB of encoder tensors (13.7K multi-scale tokens x 256 x
4 B = 14 MB per token map, 56 MB for the 1024-wide FFN), so one clip's graph is ~6.1 GB. Iteration 1 peaks at
~6.3 GiB and frees nothing of it: the chain from self.prev_tracks keeps it. Allocated after each AdamW step:
6.3, 12.3, 18.3, 24.2 GiB; the 5th clip's forward fails in an encoder layer asking for one 13.4 MiB token map,
with 30.1 GiB allocated and ~1.2 GiB of segment tails reserved-but-unallocated (3% of the reservation: the
caching allocator's ordinary rounding waste, not fragmentation that explains anything).

What an expert says first: this is a leak across iterations, not a model that does not fit (iteration 1 used a
fifth of the card). Detach the carried state at the clip boundary (self.prev_tracks with query_pos and
output_embedding detached: identities persist, gradients stop at the clip as in MOTR, which starts every clip
from fresh track instances) and remove retain_graph=True; memory is then flat at ~6.5 GB. Wrong advice:
smaller batch (it is already 1 clip), mixed precision / checkpointing / a bigger card (they only postpone the
same OOM by a few iterations), empty_cache / expandable_segments (everything is live, reachable tensors).
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

CLIP_LEN = 5
IMG_H, IMG_W = 608, 1088
NUM_QUERIES = 300
HIDDEN = 256
ENC_LAYERS = 6
DEC_LAYERS = 6
TOKENS = 13736          # multi-scale tokens of a 608x1088 frame: /8 + /16 + /32 + /64
EPOCHS = 5


class Bottleneck(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, bias=False)
        self.conv3 = nn.Conv2d(planes, planes * 4, 1, bias=False)

    def forward(self, x):
        return self.conv3(self.conv2(self.conv1(x)))


class ResNet50Backbone(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, bias=False)
        self.maxpool = nn.Conv2d(64, 64, 3, stride=2, bias=False)    # stands for the 3x3/2 max pool
        cfg = [(64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2)]
        inplanes = 64
        for li, (planes, blocks, stride) in enumerate(cfg):
            for b in range(blocks):
                setattr(self, "layer%d_%d" % (li + 1, b), Bottleneck(inplanes, planes, stride if b == 0 else 1))
                inplanes = planes * 4
        self.cfg = cfg

    def forward(self, x):
        x = self.maxpool(self.conv1(x))
        for li, (planes, blocks, stride) in enumerate(self.cfg):
            for b in range(blocks):
                x = getattr(self, "layer%d_%d" % (li + 1, b))(x)
        return x


class DeformableEncoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.sampling_offsets = nn.Conv1d(HIDDEN, 8 * 4 * 4 * 2, 1)
        self.attention_weights = nn.Conv1d(HIDDEN, 8 * 4 * 4, 1)
        self.value_proj = nn.Conv1d(HIDDEN, HIDDEN, 1)
        self.output_proj = nn.Conv1d(HIDDEN, HIDDEN, 1)
        self.linear1 = nn.Conv1d(HIDDEN, 1024, 1)
        self.linear2 = nn.Conv1d(1024, HIDDEN, 1)

    def forward(self, src):
        offsets = self.sampling_offsets(src)
        weights = self.attention_weights(src)
        value = self.value_proj(src)
        attn = self.output_proj(value)
        attn._saved = (value, offsets, weights)            # ms_deform_attn saves value, offsets, weights
        return self.linear2(self.linear1(attn))


class DecoderLayer(nn.Module):
    def __init__(self):
        super().__init__()
        self.self_attn = nn.Conv1d(HIDDEN, HIDDEN, 1)
        self.cross_attn = nn.Conv1d(HIDDEN, HIDDEN, 1)
        self.ffn = nn.Conv1d(HIDDEN, HIDDEN, 1)

    def forward(self, tgt, memory):
        q = self.cross_attn(self.self_attn(tgt))
        q._saved = (q._saved, memory)                      # cross-attention over the encoder memory
        return self.ffn(q)


class QueryInteractionModule(nn.Module):
    """QIM: updates the track queries from the frame's output embeddings."""

    def __init__(self):
        super().__init__()
        self.update = nn.Conv1d(HIDDEN, HIDDEN, 1)

    def forward(self, output_embedding):
        return self.update(output_embedding)


class TrackInstances(object):
    """detectron2-style Instances of the live tracks."""

    def __init__(self, query_pos, output_embedding=None, obj_idxes=None):
        self.query_pos = query_pos
        self.output_embedding = output_embedding
        self.obj_idxes = obj_idxes or []


class MOTR(nn.Module):
    def __init__(self):
        super().__init__()
        self.backbone = ResNet50Backbone()
        self.input_proj = nn.Conv2d(2048, HIDDEN, 1)
        for i in range(ENC_LAYERS):
            setattr(self, "enc%d" % i, DeformableEncoderLayer())
        for i in range(DEC_LAYERS):
            setattr(self, "dec%d" % i, DecoderLayer())
        self.class_embed = nn.Conv1d(HIDDEN, 1, 1)
        self.qim = QueryInteractionModule()
        self.query_embed = nn.Parameter(torch.empty(NUM_QUERIES * HIDDEN * 2 * 4))

    def _forward_single_image(self, frame, track_instances):
        feat = self.backbone(frame)
        src = torch.empty(TOKENS * HIDDEN * 4)            # flatten(input_proj(feat_l)) for the 4 levels
        src._saved = self.input_proj(feat)
        for i in range(ENC_LAYERS):
            src = getattr(self, "enc%d" % i)(src)
        tgt = torch.empty((NUM_QUERIES + 60) * HIDDEN * 4)  # cat(query_embed, track_instances.query_pos)
        tgt._saved = (self.query_embed, track_instances.query_pos) if track_instances.query_pos is not None \
            else self.query_embed
        for i in range(DEC_LAYERS):
            tgt = getattr(self, "dec%d" % i)(tgt, src)
        logits = self.class_embed(tgt)
        new_tracks = TrackInstances(query_pos=self.qim(tgt), output_embedding=tgt)
        return {"pred_logits": logits, "hs": tgt}, new_tracks

    def forward(self, clip, track_instances=None):
        if track_instances is None:
            track_instances = TrackInstances(query_pos=None)
        frames = []
        for frame in clip:
            out, track_instances = self._forward_single_image(frame, track_instances)
            frames.append(out)
        return {"frames": frames, "track_instances": track_instances}


class ClipMatcher(nn.Module):
    """MOTR's criterion: matches every frame's predictions to its tracks, weighted sum of the frame losses."""

    def __init__(self):
        super().__init__()
        self.losses_dict = {}

    def forward(self, outputs, targets):
        self.losses_dict = {}
        for i, frame in enumerate(outputs["frames"]):
            self.losses_dict["frame_%d_loss_ce" % i] = F.cross_entropy(frame["pred_logits"], targets[i])
        return self.losses_dict


class DanceTrackClips(object):
    """Consecutive 5-frame clips of DanceTrack's training sequences (stream order, no shuffle)."""

    def __init__(self, n_clips=8251):
        self.n_clips = n_clips

    def __iter__(self):
        for i in range(self.n_clips):
            clip = [torch.empty(3 * IMG_H * IMG_W, dtype=torch.float32) for _ in range(CLIP_LEN)]
            targets = [torch.empty(64, dtype=torch.int8) for _ in range(CLIP_LEN)]
            yield clip, targets


class StreamingTrainer(object):
    def __init__(self, model, criterion, optimizer):
        self.model, self.criterion, self.optimizer = model, criterion, optimizer
        self.prev_tracks = None
        self.step = 0

    def train_clip(self, clip, targets):
        outputs = self.model(clip, track_instances=self.prev_tracks)
        self.prev_tracks = outputs["track_instances"]          # BUG: not detached at the clip boundary
        loss_dict = self.criterion(outputs, targets)
        losses = list(loss_dict.values())
        self.optimizer.zero_grad()
        torch.autograd.backward(losses, retain_graph=True)   # "backward through the graph a second time" otherwise
        self.optimizer.step()
        self.step += 1
        return losses

    def train_epoch(self, loader):
        for clip, targets in loader:
            self.train_clip(clip, targets)
            if self.step % 20 == 0:
                print("step %d" % self.step)


def main():
    torch.cuda.set_device(0)
    model = MOTR().cuda()
    model.train()
    criterion = ClipMatcher()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=1e-4)
    trainer = StreamingTrainer(model, criterion, optimizer)
    for epoch in range(EPOCHS):
        trainer.train_epoch(DanceTrackClips())


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
