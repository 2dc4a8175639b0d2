"""flow_batch.py -- a nightly job on a workstation with one RTX A6000 (48 GB) that computes dense optical
flow for every uploaded clip with torchvision's RAFT (raft_large, C_T_V2 weights, 5.3M params), for a
motion-analytics pipeline.  Frames are fed at their native resolution, 4 consecutive frame pairs per
call, fp32, under torch.inference_mode():

    model = raft_large(weights=Raft_Large_Weights.C_T_V2).to("cuda").eval()
    with torch.inference_mode():
        for clip in clips:
            for img1, img2 in pairs(clip, batch_size=4):        # B x 3 x H x W, padded to a multiple of 8
                flows = model(img1, img2, num_flow_updates=12)
                save(flows[-1])

The user: "it has processed hundreds of 1080p clips a night for months at ~22 GB; tonight it died on
one clip with 'Tried to allocate 250 GiB'.  A leak?  Should I set expandable_segments?"

What fills the memory: RAFT builds an all-pairs correlation volume, a matmul of the two 1/8-resolution
feature maps: (H/8 x W/8)^2 floats per pair.  At 1080p that is 136 x 240 = 32,640 positions, 32,640^2 x 4
bytes = 3.97 GiB per pair, 15.9 GiB for a batch of 4 (plus its 3-level pyramid, 5.3 GiB) -- fine on the
A6000.  The failing clip is a 4K drone video (3840 x 2160): 480 x 270 = 129,600 positions, 16x the
1080p volume: 62.6 GiB for ONE pair, 250 GiB for the batch of 4.  One outlier input, quadratic in its
pixel count.

An expert says first: cap the input size -- downscale frames to at most 1080p before RAFT (flow is
computed at 1/8 resolution anyway; upsample the flow field afterwards), or compute the correlation on
the fly / in chunks instead of the full all-pairs volume (RAFT's alternate_corr, or tiling the frame):
`cap_input_size` or `split_operation`.  Wrong advice: a smaller batch (even one 4K pair needs 62.6 GiB on a
48 GB card), mixed precision (fp16 still 31 GiB per pair, 125 GiB for the batch), expandable_segments or
empty_cache (nothing is cached: the request alone is 5x the card), inference_mode (already on), a leak or
released references (every clip before it ran at the same flat peak), a bigger GPU.
"""
import sys

import torch
import torch.nn as nn

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

batch_size = 4
num_flow_updates = 12


def pad8(n):
    return (n + 7) // 8 * 8


class BasicEncoder(nn.Module):
    """RAFT's feature / context encoder: 256 channels at 1/8 resolution."""

    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(nbytes // 4, dtype=torch.float32, device="cuda"))

    def forward(self, x, b, h, w):
        t = torch.empty(b * 64 * (h // 2) * (w // 2), dtype=torch.float32, device="cuda")   # conv1, 1/2 res
        del t
        return torch.empty(b * 256 * (h // 8) * (w // 8), dtype=torch.float32, device="cuda")


class CorrBlock(nn.Module):
    """torchvision.models.optical_flow.raft.CorrBlock: the all-pairs correlation volume
    (torch.matmul of fmap1^T and fmap2) and its pyramid (avg_pool2d, num_levels=4)."""

    def __init__(self, num_levels=4):
        nn.Module.__init__(self)
        self.num_levels = num_levels

    def build_pyramid(self, fmap1, fmap2, b, positions):
        corr = torch.empty(b * positions * positions, dtype=torch.float32, device="cuda")   # _compute_corr_volume
        self.corr_pyramid = [corr]
        n = positions * positions
        for _ in range(self.num_levels - 1):
            n //= 4
            self.corr_pyramid.append(torch.empty(b * n, dtype=torch.float32, device="cuda"))


class UpdateBlock(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(4 * MiB // 4, dtype=torch.float32, device="cuda"))

    def forward(self, b, h, w):
        return torch.empty(b * 2 * h * w, dtype=torch.float32, device="cuda")


class RAFT(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.feature_encoder = BasicEncoder(8 * MiB)
        self.context_encoder = BasicEncoder(8 * MiB)
        self.corr_block = CorrBlock()
        self.update_block = UpdateBlock()

    def forward(self, image1, image2, num_flow_updates=12):
        b, h, w = image1.shape_bhw
        fmap1 = self.feature_encoder(image1, b, h, w)
        fmap2 = self.feature_encoder(image2, b, h, w)
        self.corr_block.build_pyramid(fmap1, fmap2, b, (h // 8) * (w // 8))
        context = self.context_encoder(image1, b, h, w)
        flows = []
        for _ in range(num_flow_updates):
            flows.append(self.update_block(b, h, w))
        self.corr_block.corr_pyramid = []
        return flows


def raft_large(weights=None):
    return RAFT()


def frame_pairs(height, width, n_frames):
    """consecutive frames of a decoded clip as B x 3 x H x W float tensors, padded to a multiple of 8."""
    h, w = pad8(height), pad8(width)
    for i in range(0, n_frames - 1, batch_size):
        img1 = torch.empty(batch_size * 3 * h * w, dtype=torch.float32, device="cuda")
        img2 = torch.empty(batch_size * 3 * h * w, dtype=torch.float32, device="cuda")
        img1.shape_bhw = img2.shape_bhw = (batch_size, h, w)
        yield img1, img2


CLIPS = [("warehouse_cam03_0412.mp4", 1080, 1920, 17), ("loading_dock_0412.mp4", 1080, 1920, 13),
         ("gate_b_0412.mp4", 720, 1280, 21), ("aisle7_0412.mp4", 1080, 1920, 9),
         ("roof_inspection_dji_0412.mp4", 2160, 3840, 25), ("parking_0412.mp4", 1080, 1920, 11)]


def main():
    model = raft_large(weights="C_T_V2").to("cuda").eval()
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    with torch.inference_mode():
        for name, height, width, n_frames in CLIPS:
            for img1, img2 in frame_pairs(height, width, n_frames):
                flows = model(img1, img2, num_flow_updates=num_flow_updates)
                flow = flows[-1]
                del flows, flow, img1, img2
            print("done", name)
    return 0


if __name__ == "__main__":
    sys.exit(main())
