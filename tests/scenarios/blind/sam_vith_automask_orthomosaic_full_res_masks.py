"""label_fields.py -- pre-labelling drone imagery with Segment Anything (ViT-H, 636M parameters, fp32 2.4 GiB)
and SamAutomaticMaskGenerator(points_per_batch=32) on an AWS g5 (A10G, 24 GB):

    sam = sam_model_registry["vit_h"](checkpoint="sam_vit_h_4b8939.pth").to("cuda")
    gen = SamAutomaticMaskGenerator(sam, points_per_batch=32)
    for path in sorted(glob("survey_0412/*")):
        image = cv2.cvtColor(cv2.imread(path), cv2.COLOR_BGR2RGB)
        masks = gen.generate(image)                 # @torch.no_grad()
        save_masks(path, masks)

The folder holds 4000 x 3000 photos from the drone, and they go through fine: for each batch of 32 points
the decoder's 256 x 256 low-resolution masks (32 x 3 of them) are upsampled to 1024 x 1024, cropped, and then
upsampled to the original image's size in float32 -- 4.4 GiB per batch for a 12 MP photo.  Somebody also put
the stitched orthomosaic of the field in the folder, 12000 x 9000 (108 MP).  For that one image the
upsampling to full resolution asks for 32 x 3 x 12000 x 9000 x 4 bytes = 38.6 GiB in one tensor, more than
the whole card, and it dies with CUDA out of memory on the first batch of points.

An expert: that single input is the peak -- tile the orthomosaic (or downscale it / let the generator crop it)
before generating, or cut points_per_batch for it (at 4 points a batch the full-resolution masks are
4.8 GiB).  No memory is held by anything else: the model is 2.4 GiB, everything runs under no_grad.  Not
gradient checkpointing, quantization, CPU offload, 8-bit optimizers or LoRA (there is no training and the
weights are not the problem), not empty_cache / expandable_segments (one request larger than the card).
"""
import sys

import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
F = torch.nn.functional


class ImageEncoderViT(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = torch.nn.Parameter(torch.empty(2400 * MiB, device="cuda"))    # 32 blocks, 1280 wide

    def forward(self, x):
        h = torch.empty(2048 * MiB, device="cuda")              # 64 x 64 x 1280 tokens, attention, MLP (transient)
        del h
        return torch.empty(4 * MiB, device="cuda")              # 256 x 64 x 64 image embedding


class MaskDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))

    def forward(self, image_embeddings, points):
        return torch.empty(32 * 3 * 256 * 256 * 4, device="cuda")   # low-res masks, 3 per point


class Sam(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.image_encoder = ImageEncoderViT()
        self.mask_decoder = MaskDecoder()

    def postprocess_masks(self, masks, input_size, original_size):
        masks = F.interpolate(masks, scale_factor=1024 / 256, mode="bilinear")       # to 1024 x 1024
        h, w = input_size
        masks = torch.empty(masks.nbytes * h * w // (1024 * 1024), device="cuda")      # [..., :h, :w] made contiguous
        return F.interpolate(masks, scale_factor=original_size[0] / h, mode="bilinear")


class SamAutomaticMaskGenerator(object):
    def __init__(self, model, points_per_batch=64):
        self.model = model
        self.points_per_batch = points_per_batch

    def generate(self, image):
        with torch.no_grad():
            return self._process_crop(image)

    def _process_crop(self, image):
        h, w = image["size"]
        emb = self.model.image_encoder(image["pixels"])
        input_size = (1024 * h // max(h, w), 1024 * w // max(h, w))
        data = []
        for _ in range(1024 // self.points_per_batch):        # the 32 x 32 point grid
            data.append(self._process_batch(emb, input_size, (h, w)))
        return data

    def _process_batch(self, emb, input_size, orig_size):
        low_res = self.model.mask_decoder(emb, None)
        masks = self.model.postprocess_masks(low_res, input_size, orig_size)
        keep = torch.empty(masks.nbytes // 4, device="cuda")    # masks > mask_threshold (bool), stability scores
        del masks
        return torch.empty(64 * 1024, device="cuda")             # RLE of the kept masks


def main():
    sam = Sam()
    gen = SamAutomaticMaskGenerator(sam, points_per_batch=32)
    survey = [(3000, 4000)] * 3 + [(9000, 12000)] + [(3000, 4000)] * 3     # sorted(glob(...)): the mosaic is 4th
    for h, w in survey:
        image = {"pixels": torch.empty(h * w * 3, device="cuda"), "size": (h, w)}
        masks = gen.generate(image)
        del masks, image


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
