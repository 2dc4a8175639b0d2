"""segment_ct.py -- inference of a 3D UNet (MONAI, 62M parameters, trained on 160^3 patches) on whole
abdominal CT volumes of 512 x 512 x 384 voxels, one volume at a time, on a 24 GiB RTX A5000:

    model = UNet(spatial_dims=3, in_channels=1, out_channels=14, channels=(48, 96, 192, 384)).cuda()
    model.load_state_dict(torch.load("best.pt", map_location="cpu")); model.eval()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        for vol in volumes:                               # (1, 1, 512, 512, 384)
            logits = model(vol.cuda())                    # the whole volume in one forward

Training used MONAI's sliding_window_inference for validation; the export script calls the model
on the whole volume.  The first full-resolution feature map alone is 48 x 512 x 512 x 384 in fp16,
9 GiB; the decoder's last stage concatenates its upsampled map with that skip connection into one
18 GiB tensor, which fails with ~5 GiB free.  The weights are 0.24 GiB; the batch is 1; autograd is
off.  An expert: run the volume through sliding_window_inference (roi 160^3, overlap 0.25,
sw_batch_size 2: ~2 GiB), i.e. split the one oversized operation into tiles; nothing else here is
worth changing.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class UNet3D(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, mib in enumerate((2, 6, 24, 96, 64, 40, 12, 2)):
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(mib * MiB, device="cuda")))

    def forward(self, vol):
        full = 512 * 512 * 384
        enc1 = torch.empty(48 * full * 2, device="cuda")                  # 9 GiB, kept for the skip
        enc2 = torch.empty(96 * full // 8 * 2, device="cuda")             # 2.25 GiB
        enc3 = torch.empty(192 * full // 64 * 2, device="cuda")           # 0.56 GiB
        bott = torch.empty(384 * full // 512 * 2, device="cuda")
        dec3 = torch.empty(192 * full // 64 * 2, device="cuda")
        del bott
        dec2 = torch.empty(96 * full // 8 * 2, device="cuda")
        del dec3, enc3
        up1 = torch.empty(48 * full * 2, device="cuda")                   # upsampled to full resolution, 9 GiB
        del dec2, enc2
        cat1 = torch.empty(96 * full * 2, device="cuda")                  # torch.cat([up1, enc1], 1): 18 GiB
        del up1, enc1
        return torch.empty(14 * full * 2, device="cuda")


def main():
    model = UNet3D().cuda()
    model.eval()
    with torch.inference_mode(), torch.autocast("cuda", dtype=torch.float16):
        for case in range(40):
            vol = torch.empty(512 * 512 * 384 * 4, device="cuda")        # fp32 HU volume, 384 MiB
            logits = model(vol)
            del logits, vol


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
