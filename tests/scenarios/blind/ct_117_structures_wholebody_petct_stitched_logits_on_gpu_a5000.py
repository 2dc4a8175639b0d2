"""segment_batch.py -- a hospital research group runs its own 117-structure CT segmentation network (a
3D U-Net trained TotalSegmentator-style at 1.5 mm, one network for all 117 structures + background) over
a PACS export on the department's RTX A5000 (24 GB) workstation, under inference_mode and autocast:

    model = UNet3D(out_channels=118).cuda().eval()
    for path in sorted(glob("export/*.nii.gz")):
        img = load_and_resample(path, spacing=1.5).cuda()           # (1, 1, 334, 334, D)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            logits = sliding_window_inference(img, roi_size=(128, 128, 128), sw_batch_size=4,
                                              predictor=model, overlap=0.5)   # MONAI's defaults:
            labels = logits.argmax(1)                                         # stitched on img's device
        save(labels.cpu(), path)

The export is mostly abdomen CTs (D ~ 300 slices at 1.5 mm): the stitched logits are 118 x 334 x 334 x
300 fp16 = 7.4 GiB and every case goes through.  Then a whole-body PET-CT (head to toes, D = 1400)
comes: after its first window batch, the stitching buffer for the whole volume, 118 x 334 x 334 x 1400
fp16 = 34.3 GiB, is allocated on the GPU and fails -- more than the card has.  The network, its window
batch and its weights are small; one input makes the peak.

An expert: the stitched output of the whole volume does not belong on the GPU: run the windows on the
GPU and stitch on the CPU (MONAI: sliding_window_inference(..., sw_device="cuda", device="cpu")), or
cap the volume (split it into overlapping slabs along z / crop to the body, then merge).  The window
batch (sw_batch_size) is not what fails, autocast is already on, the weights are 120 MiB (quantizing
them saves nothing), nothing is cached or leaked.
"""
import glob
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

NUM_CLASSES = 118
ROI = 128
sw_batch_size = 4


class ConvBlock(torch.nn.Module):
    def __init__(self, cin, cout, stride=1):
        torch.nn.Module.__init__(self)
        self.conv1 = torch.nn.Conv3d(cin, cout, 3, stride=stride, device="cuda")
        self.conv2 = torch.nn.Conv3d(cout, cout, 3, device="cuda")

    def forward(self, x):
        return self.conv2(self.conv1(x))


class UNet3D(torch.nn.Module):
    def __init__(self, out_channels):
        torch.nn.Module.__init__(self)
        chans = [32, 64, 128, 256, 320, 320]
        self.enc0 = ConvBlock(1, chans[0])
        self.enc1 = ConvBlock(chans[0], chans[1], stride=2)
        self.enc2 = ConvBlock(chans[1], chans[2], stride=2)
        self.enc3 = ConvBlock(chans[2], chans[3], stride=2)
        self.enc4 = ConvBlock(chans[3], chans[4], stride=2)
        self.enc5 = ConvBlock(chans[4], chans[5], stride=2)
        self.dec4 = ConvBlock(chans[5], chans[4])
        self.dec3 = ConvBlock(chans[4], chans[3])
        self.dec2 = ConvBlock(chans[3], chans[2])
        self.dec1 = ConvBlock(chans[2], chans[1])
        self.dec0 = ConvBlock(chans[1], chans[0])
        self.head = torch.nn.Conv3d(chans[0], out_channels, 1, device="cuda")

    def forward(self, x):
        s0 = self.enc0(x)
        s1 = self.enc1(s0)
        s2 = self.enc2(s1)
        s3 = self.enc3(s2)
        s4 = self.enc4(s3)
        b = self.enc5(s4)
        u = self.dec4(torch.nn.functional.interpolate(b, 2.0))
        u = self.dec3(torch.nn.functional.interpolate(torch.empty(s4.nbytes * 256 // 320, device="cuda"), 2.0))
        u = self.dec2(torch.nn.functional.interpolate(torch.empty(s3.nbytes // 2, device="cuda"), 2.0))
        u = self.dec1(torch.nn.functional.interpolate(torch.empty(s2.nbytes // 2, device="cuda"), 2.0))
        u = self.dec0(torch.nn.functional.interpolate(torch.empty(s1.nbytes // 2, device="cuda"), 2.0))
        return self.head(u)


def sliding_window_inference(inputs, roi_size, sw_batch_size, predictor, overlap=0.5):
    """MONAI's algorithm (monai.inferers.sliding_window_inference), copied into the project: the output
    and count buffers live on inputs' device unless device= says otherwise."""
    depth = inputs.nbytes // (334 * 334 * 4)
    n_windows = 9 * max(1, (depth - roi_size // 2) // (roi_size // 2))
    output_image, count_map = None, None
    for start in range(0, n_windows, sw_batch_size):
        window = torch.empty(sw_batch_size * roi_size ** 3 * 2, device="cuda")         # fp16 crops
        seg_prob = predictor(window)                                                   # (4, 118, 128^3) fp16
        if output_image is None:
            # allocated once the first window says how many channels (MONAI >= 1.0)
            output_image = torch.empty(NUM_CLASSES * depth * 334 * 334 * 2, device="cuda")
            count_map = torch.empty(depth * 334 * 334 * 4, device="cuda")
        del window, seg_prob
    return output_image                 # divided by count_map in place


def load_and_resample(path):
    depth = 1400 if "wholebody" in path else 300
    return torch.empty(334 * 334 * depth * 4, device="cuda")         # (1, 1, 334, 334, D) fp32


def main():
    model = UNet3D(out_channels=NUM_CLASSES).cuda().eval()
    export = ["export/case_%04d_abdomen.nii.gz" % i for i in range(3)] + ["export/case_0003_wholebody_petct.nii.gz"]
    for path in sorted(export):
        img = load_and_resample(path)
        with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
            logits = sliding_window_inference(img, roi_size=ROI, sw_batch_size=sw_batch_size, predictor=model,
                                              overlap=0.5)
            labels = torch.empty(logits.nbytes // NUM_CLASSES // 2, dtype=torch.uint8, device="cuda")   # argmax
        del img, logits, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
