"""BEVFormer-base (R101-DCN, 6 cameras at 1600x900, 200x200 BEV, temporal queue of 4) trained on nuScenes on one
RTX 4090 (24 GB), one sample per GPU, fp32, backbone without checkpointing: the first iteration runs out of
memory in the BEV encoder.  The README of BEVFormer lists ~28.5 GB for this config on A100s; the user tried it
on the lab's 4090 because "batch size is already 1".

The real program is BEVFormer's tools/train.py (mmdet3d 0.17 / mmcv-full 1.4), launched as

    ./tools/dist_train.sh ./projects/configs/bevformer/bevformer_base.py 1

with the config unchanged:

    img_backbone=dict(type='ResNet', depth=101, num_stages=4, out_indices=(1, 2, 3), frozen_stages=1,
                      norm_cfg=dict(type='BN2d', requires_grad=False), norm_eval=True, style='caffe',
                      dcn=dict(type='DCNv2', deform_groups=1, fallback_on_stride=False),
                      stage_with_dcn=(False, False, True, True)),          # no with_cp=True
    img_neck=dict(type='FPN', in_channels=[512, 1024, 2048], out_channels=256, num_outs=4, ...),
    pts_bbox_head=dict(type='BEVFormerHead', bev_h=200, bev_w=200, num_query=900,
                       transformer=dict(type='PerceptionTransformer', encoder=dict(num_layers=6, ...),
                                        decoder=dict(num_layers=6, ...))),
    data = dict(samples_per_gpu=1, workers_per_gpu=4, train=dict(queue_length=4, ...))
    optimizer = dict(type='AdamW', lr=2e-4, paramwise_cfg=dict(custom_keys={'img_backbone': dict(lr_mult=0.1)}),
                     weight_decay=0.01)
    # no fp16 = dict(loss_scale=512.)

Sizes. ~67 M parameters (ResNet-101 with the DCN offset convs 44 M, FPN 3.3 M, the BEV transformer and heads ~19 M
with the 200x200x256 BEV embedding), 0.27 GB fp32; AdamW state would add 0.5 GB at the first step. For the queue's
three earlier frames obtain_history_bev() runs backbone, neck and encoder in eval mode under torch.no_grad():
transient, only the 200x200x256 prev_bev (41 MB) is kept. The current frame runs with autograd: the 6 images
(6x3x928x1600) through the frozen stem and layer1 save nothing, but from layer2 on every conv and BN(+in-place
ReLU) output of the caffe-style bottlenecks is kept for backward: layer2 ~4 GB at 116x200, layer3 (23 DCN
bottlenecks at 58x100) ~9.8 GB, layer4 ~0.6 GB: ~15 GB allocated when the backbone is done, ~0.3 GB more for the
FPN. Each of the 6 BEVFormerLayers then saves ~1.7 GB: temporal self-attention over 2 x 40,000 BEV queries,
spatial cross-attention with queries rebatched per camera (6 x ~12,500 hits x 256, sampling offsets 6 x 12,500 x
512, the value projection of the 6 cameras' 4-level features), and a 512-wide FFN over 40,000 queries. The forward
pass needs ~26 GB of saved activations before the decoder, so with the CUDA context it cannot finish on a 24 GB
card: after four encoder layers 22.7 GB are allocated, and it dies in the fifth layer's spatial cross-attention
(the attention-weights projection, 6 x 12,500 x 256 fp32 = 73 MiB) with ~23.4 GB allocated and nothing cached to
serve it.

What an expert says first: make the activations smaller, the batch cannot be: with_cp=True on the ResNet
(checkpoint each bottleneck: the ~15 GB of backbone activations become a few GB, +25% step time) and/or the
fp16 training the repo ships configs for (`fp16 = dict(loss_scale=512.)`, mmcv's Fp16OptimizerHook), or the
bevformer_small recipe (smaller images, 150x150 BEV, 3 encoder layers, ~10.5 GB).  Wrong advice: a smaller
batch (samples_per_gpu is already 1, and the six cameras of one sample are not a batch one can cut),
expandable_segments / empty_cache (nothing is cached that could serve it, the card is full of live
activations), flash-attention (the attention here is multi-scale deformable attention, no QK^T matrix),
inference mode or quantization (this is training).  A 40/48 GB card fits, as the README's 28.5 GB says.
"""
import types

import torch
from torch import nn
# what autograd records for an op on these inputs (the stand-in's graph, as PyTorch's grad_fn would be)
from torch.autograd._graph import derive as recorded_by_autograd

import scen_truth

scen_truth.note_every_empty(torch)

_ITEM = {"float32": 4, "int64": 8, "bool": 1}

cfg = types.SimpleNamespace(
    data=types.SimpleNamespace(samples_per_gpu=1, workers_per_gpu=4, queue_length=4, num_cams=6,
                               img_shape=(928, 1600)),
    bev_h=200, bev_w=200, embed_dims=256, num_query=900, encoder_layers=6, decoder_layers=6,
    max_len_per_cam=12500, total_epochs=24, fp16=None, with_cp=False,
)


def new(shape, dtype="float32"):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n * _ITEM[dtype])
    t.shape = tuple(shape)
    return t


def op(shape, *inputs):
    """The output of a torch / mmcv op on `inputs`: in their autograd graph when one of them has a graph or
    requires grad (autograd on), the op then keeping its inputs for backward (its grad_fn's saved tensors)."""
    out = recorded_by_autograd(new(shape), *inputs)
    if out._params:
        out._saved = inputs if len(inputs) > 1 else inputs[0]
    return out


# ---------------------------------------------------------------------------------------------------------
# mmcv / mmdet layers

class ConvModule(nn.Module):
    """mmcv ConvModule: conv (optionally DCNv2) + frozen BN (requires_grad=False, eval mode) + ReLU(inplace)."""

    def __init__(self, in_ch, out_ch, k=1, stride=1, frozen=False, dcn=False, norm=True, act=True):
        nn.Module.__init__(self)
        self.out_ch, self.stride, self.dcn, self.norm, self.act = out_ch, stride, dcn, norm, act
        self.weight = nn.Parameter(torch.empty(in_ch * out_ch * k * k * 4), requires_grad=not frozen)
        if dcn:
            # conv_offset: 3 * k * k channels (offsets and mask) of DCNv2
            self.conv_offset_weight = nn.Parameter(torch.empty(in_ch * 27 * k * k * 4), requires_grad=not frozen)
        if norm:
            self.bn_weight = nn.Parameter(torch.empty(out_ch * 4), requires_grad=False)
            self.bn_bias = nn.Parameter(torch.empty(out_ch * 4), requires_grad=False)
            self.register_buffer("running_mean", torch.empty(out_ch * 4))
            self.register_buffer("running_var", torch.empty(out_ch * 4))

    def forward(self, x):
        n, c, h, w = x.shape
        oh, ow = h // self.stride, w // self.stride
        if self.dcn:
            offset = op((n, 27, oh, ow), x, self.conv_offset_weight)
            y = op((n, self.out_ch, oh, ow), x, self.weight, offset)     # modulated_deform_conv2d
        else:
            y = op((n, self.out_ch, oh, ow), x, self.weight)
        if self.norm:
            y = op(y.shape, y, self.bn_weight)                           # F.batch_norm (frozen statistics)
        # act: ReLU(inplace=True) rewrites the BN output in place and keeps it for backward: no new tensor
        return y


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, in_ch, mid, stride=1, downsample=False, frozen=False, dcn=False):
        nn.Module.__init__(self)
        self.conv1 = ConvModule(in_ch, mid, 1, stride=stride, frozen=frozen)     # caffe style: stride on 1x1
        self.conv2 = ConvModule(mid, mid, 3, frozen=frozen, dcn=dcn)
        self.conv3 = ConvModule(mid, mid * 4, 1, frozen=frozen, act=False)
        self.downsample = ConvModule(in_ch, mid * 4, 1, stride=stride, frozen=frozen, act=False) \
            if downsample else None

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.conv3(self.conv2(self.conv1(x)))
        # out += identity; out = self.relu(out): both in place, the same tensor, now in identity's graph too
        out = recorded_by_autograd(out, identity)
        if self.downsample is not None and out._params:
            out._saved = out._saved + (identity,)
        return out


class ResLayer(nn.Module):
    def __init__(self, in_ch, mid, blocks, stride, frozen=False, dcn=False):
        nn.Module.__init__(self)
        self.blocks = []
        for i in range(blocks):
            b = Bottleneck(in_ch if i == 0 else mid * 4, mid, stride if i == 0 else 1, downsample=(i == 0),
                           frozen=frozen, dcn=dcn)
            setattr(self, str(i), b)
            self.blocks.append(b)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


class ResNet(nn.Module):
    """mmdet ResNet(depth=101, style='caffe', frozen_stages=1, norm_eval=True, DCN in stages 3 and 4)."""

    def __init__(self, with_cp=False):
        nn.Module.__init__(self)
        self.with_cp = with_cp
        self.stem = ConvModule(3, 64, 7, stride=2, frozen=True)
        self.layer1 = ResLayer(64, 64, 3, 1, frozen=True)
        self.layer2 = ResLayer(256, 128, 4, 2)
        self.layer3 = ResLayer(512, 256, 23, 2, dcn=True)
        self.layer4 = ResLayer(1024, 512, 3, 2, dcn=True)

    def forward(self, img):
        x = self.stem(img)
        x = op((x.shape[0], 64, x.shape[2] // 2, x.shape[3] // 2), x)     # max pool
        x = self.layer1(x)
        c3 = self.layer2(x)
        c4 = self.layer3(c3)
        c5 = self.layer4(c4)
        return [c3, c4, c5]


class FPN(nn.Module):
    def __init__(self, in_channels=(512, 1024, 2048), out_channels=256):
        nn.Module.__init__(self)
        self.lateral = []
        self.fpn = []
        for i, c in enumerate(in_channels):
            l = ConvModule(c, out_channels, 1, norm=False, act=False)
            f = ConvModule(out_channels, out_channels, 3, norm=False, act=False)
            setattr(self, "lateral_conv%d" % i, l)
            setattr(self, "fpn_conv%d" % i, f)
            self.lateral.append(l)
            self.fpn.append(f)
        self.extra = ConvModule(out_channels, out_channels, 3, stride=2, norm=False, act=False)

    def forward(self, feats):
        outs = [fpn(lat(f)) for f, lat, fpn in zip(feats, self.lateral, self.fpn)]
        outs.append(self.extra(outs[-1]))
        return outs


class Linear(nn.Module):
    """nn.Linear (the stand-in torch has none)."""

    def __init__(self, in_features, out_features):
        nn.Module.__init__(self)
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features * 4))
        self.bias = nn.Parameter(torch.empty(out_features * 4))

    def forward(self, x):
        return op(x.shape[:-1] + (self.out_features,), x, self.weight)


class LayerNorm(nn.Module):
    def __init__(self, dims):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dims * 4))
        self.bias = nn.Parameter(torch.empty(dims * 4))

    def forward(self, x):
        return op(x.shape, x, self.weight)


# ---------------------------------------------------------------------------------------------------------
# projects/mmdet3d_plugin/bevformer/modules

class TemporalSelfAttention(nn.Module):
    def __init__(self, embed_dims=256, num_heads=8, num_levels=1, num_points=4, num_bev_queue=2):
        nn.Module.__init__(self)
        self.sampling_offsets = Linear(embed_dims * num_bev_queue,
                                       num_bev_queue * num_heads * num_levels * num_points * 2)
        self.attention_weights = Linear(embed_dims * num_bev_queue, num_bev_queue * num_heads * num_levels * num_points)
        self.value_proj = Linear(embed_dims, embed_dims)
        self.output_proj = Linear(embed_dims, embed_dims)

    def forward(self, query, prev_bev):
        bs, nq, c = query.shape
        value = op((2 * bs, nq, c), query, prev_bev)                     # torch.stack([prev_bev, query])
        query_cat = op((bs, nq, 2 * c), value, query)                    # torch.cat((value[:bs], query), -1)
        offsets = self.sampling_offsets(query_cat)
        weights = self.attention_weights(query_cat)
        weights = op(weights.shape, weights)                             # softmax
        value = self.value_proj(value)
        out = op((2 * bs, nq, c), value, offsets, weights)               # MultiScaleDeformableAttnFunction
        out = op((bs, nq, c), out)                                       # mean over the two BEV queues
        out = self.output_proj(out)
        return op(out.shape, out, query)                                 # identity + dropout(out)


class MSDeformableAttention3D(nn.Module):
    def __init__(self, embed_dims=256, num_heads=8, num_levels=4, num_points=8):
        nn.Module.__init__(self)
        self.sampling_offsets = Linear(embed_dims, num_heads * num_levels * num_points * 2)
        self.attention_weights = Linear(embed_dims, num_heads * num_levels * num_points)
        self.value_proj = Linear(embed_dims, embed_dims)

    def forward(self, queries_rebatch, value):
        offsets = self.sampling_offsets(queries_rebatch)
        weights = self.attention_weights(queries_rebatch)
        weights = op(weights.shape, weights)                             # softmax
        locations = op(offsets.shape, offsets)                           # reference points + offsets / normalizer
        value = self.value_proj(value)
        return op(queries_rebatch.shape, value, locations, weights)      # ms_deform_attn


class SpatialCrossAttention(nn.Module):
    def __init__(self, embed_dims=256, num_cams=6, max_len=12500):
        nn.Module.__init__(self)
        self.num_cams, self.max_len = num_cams, max_len
        self.deformable_attention = MSDeformableAttention3D(embed_dims)
        self.output_proj = Linear(embed_dims, embed_dims)

    def forward(self, query, key, value):
        bs, nq, c = query.shape
        queries_rebatch = op((bs * self.num_cams, self.max_len, c), query)   # gather the BEV queries each camera sees
        out = self.deformable_attention(queries_rebatch, value)
        slots = op((bs, nq, c), out)                                     # scatter-add back, / count
        slots = self.output_proj(slots)
        return op(slots.shape, slots, query)                             # dropout(slots) + inp_residual


class FFN(nn.Module):
    def __init__(self, embed_dims=256, feedforward_channels=512):
        nn.Module.__init__(self)
        self.fc1 = Linear(embed_dims, feedforward_channels)
        self.fc2 = Linear(feedforward_channels, embed_dims)

    def forward(self, x):
        h = self.fc1(x)
        h = op(h.shape, h)                                               # ReLU(inplace) + dropout
        h = self.fc2(h)
        return op(h.shape, h, x)                                         # identity + dropout(h)


class BEVFormerLayer(nn.Module):
    def __init__(self, embed_dims=256, num_cams=6, max_len=12500):
        nn.Module.__init__(self)
        self.temporal_self_attention = TemporalSelfAttention(embed_dims)
        self.norm0 = LayerNorm(embed_dims)
        self.spatial_cross_attention = SpatialCrossAttention(embed_dims, num_cams, max_len)
        self.norm1 = LayerNorm(embed_dims)
        self.ffn = FFN(embed_dims, embed_dims * 2)
        self.norm2 = LayerNorm(embed_dims)

    def forward(self, query, key, value, prev_bev):
        query = self.norm0(self.temporal_self_attention(query, prev_bev))
        query = self.norm1(self.spatial_cross_attention(query, key, value))
        return self.norm2(self.ffn(query))


class BEVFormerEncoder(nn.Module):
    def __init__(self, num_layers, embed_dims, num_cams, max_len):
        nn.Module.__init__(self)
        self.layers = []
        for i in range(num_layers):
            layer = BEVFormerLayer(embed_dims, num_cams, max_len)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    def forward(self, bev_query, key, value, prev_bev):
        output = bev_query
        for layer in self.layers:
            output = layer(output, key, value, prev_bev)
        return output


class DetrTransformerDecoderLayer(nn.Module):
    def __init__(self, embed_dims=256, num_query=900):
        nn.Module.__init__(self)
        self.self_attn_in = Linear(embed_dims, 3 * embed_dims)
        self.self_attn_out = Linear(embed_dims, embed_dims)
        self.cross_attn = MSDeformableAttention3D(embed_dims, num_levels=1, num_points=4)
        self.ffn = FFN(embed_dims, embed_dims * 2)
        self.norms = LayerNorm(embed_dims)

    def forward(self, query, bev_embed):
        qkv = self.self_attn_in(query)
        attn = op((8, query.shape[1], query.shape[1]), qkv)              # nn.MultiheadAttention, 900 x 900
        query = self.self_attn_out(op(query.shape, attn))
        query = self.cross_attn(query, bev_embed)
        return self.norms(self.ffn(query))


class PerceptionTransformer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.encoder = BEVFormerEncoder(c.encoder_layers, c.embed_dims, c.data.num_cams, c.max_len_per_cam)
        self.decoder_layers = []
        for i in range(c.decoder_layers):
            d = DetrTransformerDecoderLayer(c.embed_dims, c.num_query)
            setattr(self, "decoder_layer%d" % i, d)
            self.decoder_layers.append(d)
        self.level_embeds = nn.Parameter(torch.empty(4 * c.embed_dims * 4))
        self.cams_embeds = nn.Parameter(torch.empty(c.data.num_cams * c.embed_dims * 4))
        self.can_bus_mlp = Linear(18, c.embed_dims)

    def get_bev_features(self, mlvl_feats, bev_queries, prev_bev):
        feat_flatten = [op((f.shape[0], f.shape[2] * f.shape[3], f.shape[1]), f) for f in mlvl_feats]
        n = sum(f.shape[1] for f in feat_flatten)
        value = op((mlvl_feats[0].shape[0], n, 256), *(feat_flatten + [self.cams_embeds, self.level_embeds]))
        bev_queries = op(bev_queries.shape, bev_queries, self.can_bus_mlp.weight)
        return self.encoder(bev_queries, value, value, prev_bev)

    def forward(self, mlvl_feats, bev_queries, object_query_embed, prev_bev):
        bev_embed = self.get_bev_features(mlvl_feats, bev_queries, prev_bev)
        query = op((1, 900, 256), object_query_embed)
        for layer in self.decoder_layers:
            query = layer(query, bev_embed)
        return bev_embed, query


class BEVFormerHead(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.bev_h, self.bev_w = c.bev_h, c.bev_w
        self.bev_embedding = nn.Parameter(torch.empty(c.bev_h * c.bev_w * c.embed_dims * 4))
        self.query_embedding = nn.Parameter(torch.empty(c.num_query * c.embed_dims * 2 * 4))
        self.transformer = PerceptionTransformer(c)
        self.cls_branch = Linear(c.embed_dims, 10)
        self.reg_branch = Linear(c.embed_dims, 10)

    def forward(self, mlvl_feats, prev_bev=None, only_bev=False):
        bev_queries = op((1, self.bev_h * self.bev_w, 256), self.bev_embedding)
        if only_bev:
            return self.transformer.get_bev_features(mlvl_feats, bev_queries, prev_bev)
        bev_embed, hs = self.transformer(mlvl_feats, bev_queries, self.query_embedding, prev_bev)
        return {"bev_embed": bev_embed, "all_cls_scores": self.cls_branch(hs), "all_bbox_preds": self.reg_branch(hs)}


class BEVFormer(nn.Module):
    def __init__(self, c):
        nn.Module.__init__(self)
        self.img_backbone = ResNet(with_cp=c.with_cp)
        self.img_neck = FPN()
        self.pts_bbox_head = BEVFormerHead(c)

    def extract_img_feat(self, img):
        b, n, ch, h, w = img.shape
        img = op((b * n, ch, h, w), img)                                 # img.reshape(B * N, C, H, W)
        feats = self.img_backbone(img)
        return self.img_neck(feats)

    def obtain_history_bev(self, imgs_queue):
        """The queue's earlier frames, in eval mode and without gradients, as BEVFormer does."""
        self.eval()
        with torch.no_grad():
            prev_bev = None
            for img in imgs_queue:
                img_feats = self.extract_img_feat(img)
                prev_bev = self.pts_bbox_head(img_feats, prev_bev, only_bev=True)
            self.train()
            return prev_bev

    def forward_train(self, img, gt_bboxes_3d, gt_labels_3d):
        prev_img = img[:-1]
        prev_bev = self.obtain_history_bev(prev_img)
        img_feats = self.extract_img_feat(img[-1])
        outs = self.pts_bbox_head(img_feats, prev_bev)
        cls = op((1,), outs["all_cls_scores"])                           # FocalLoss + L1 over 6 decoder layers
        return {"loss_cls": cls, "loss_bbox": op((1,), outs["all_bbox_preds"])}

    def forward(self, return_loss=True, **data):
        return self.forward_train(**data)


# ---------------------------------------------------------------------------------------------------------
# tools/train.py -> mmdet's train_detector -> EpochBasedRunner.train

def build_dataloader(samples_per_gpu, queue_length, num_cams, img_shape):
    h, w = img_shape
    while True:
        # CustomNuScenesDataset.prepare_train_data: queue_length frames, each with 6 camera images
        queue = [new((samples_per_gpu, num_cams, 3, h, w)) for _ in range(queue_length)]
        yield {"img": queue, "gt_bboxes_3d": None, "gt_labels_3d": None}


def train_detector(model, c):
    data_loader = build_dataloader(c.data.samples_per_gpu, c.data.queue_length, c.data.num_cams, c.data.img_shape)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4, weight_decay=0.01)
    model.train()
    for epoch in range(c.total_epochs):
        for i, data_batch in enumerate(data_loader):
            losses = model(return_loss=True, **data_batch)
            loss = losses["loss_cls"]
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            del losses, loss
            if i % 50 == 0:
                print("Epoch [%d][%d/28130]" % (epoch + 1, i))


def main():
    torch.cuda.set_device(0)
    model = BEVFormer(cfg)
    model.cuda()
    train_detector(model, cfg)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
