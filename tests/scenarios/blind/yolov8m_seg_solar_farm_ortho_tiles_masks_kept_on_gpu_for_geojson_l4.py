"""Sliced (SAHI-style) YOLOv8m-seg inference over a solar farm's drone orthomosaic blocks: every tile's
instance masks stay on the GPU in a dict until the GeoJSON export at the end, and the L4 runs out of
memory in the 9th of 40 blocks.

The real program (an O&M contractor's script, ultralytics 8.1 + rasterio, one NVIDIA L4 24 GB):

    model = YOLO("solar_tables_yolov8m-seg.pt")                  # fine-tuned, 2 classes
    class OrthoSolarSegmenter:
        def __init__(self): self.results = {}                    # block name -> per-tile detections
        def segment_block(self, path):
            with rasterio.open(path) as src: block = src.read()  # 10240 x 10240, 3 cm GSD
            tiles = []
            for x0, y0 in slice_offsets(10240, 10240, 1024, overlap=0.2):   # 13 x 13 = 169 tiles
                r = model.predict(block[:, y0:y0+1024, x0:x0+1024], imgsz=1024, half=True,
                                  retina_masks=True, conf=0.35, verbose=False)[0]
                tiles.append({"offset": (x0, y0), "boxes": r.boxes.data, "masks": r.masks.data})
            self.results[path.stem] = tiles                      # polygons are made at the end
        def export_geojson(self, out): ...  masks.cpu().numpy() -> cv2.findContours -> shapely, merged
    for path in sorted(glob("blocks/*.tif")): seg.segment_block(path)
    seg.export_geojson("tables.geojson")

ultralytics runs predict under torch.inference_mode(), in fp16 (half=True).  r.masks.data with
retina_masks=True is (n, 1024, 1024) fp16 on the GPU: 2 MiB per detected panel table.

Arithmetic.  Weights: 27.2 M params fp16 = 54 MB.  One tile's forward at 1024 x 1024 needs a few
hundred MiB of short-lived feature maps (freed after the tile).  A block has 169 tiles with ~9
tables each on average (0 on roads and the substation, up to 18 inside the arrays): ~1,350-1,600
masks x 2 MiB = ~2.8-3 GiB kept per block (a block at the fence line: ~0.8 GiB), plus the boxes.
After 8 blocks the dict holds ~20.8 GiB of masks; with the 0.5 GiB CUDA context and the tile's
working set the 24 GiB L4 fills up during the 9th block, and a 12 MiB feature map of a late
tile's forward fails.  allocated rises ~3 GiB per block; reserved follows it; almost nothing is
cached (under 0.2 GiB).

What an expert says first: the per-tile results are kept on the GPU across blocks; move them off as
you go (r.masks.data.cpu(), or turn each mask into a polygon / RLE right after the tile) and the job
runs in constant memory.  Wrong advice: smaller batch (one tile at a time already), mixed precision
or inference_mode (already fp16 and under inference_mode), gradient checkpointing, quantization,
expandable_segments or empty_cache (nothing is cached or fragmented: the live masks fill the card), a
bigger card (only delays it: 40 blocks would need ~110 GiB).
"""
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1024 * 1024
BLOCK_SIZE = 10240
TILE = 1024
OVERLAP = 0.2
CONF = 0.35


class Tile(object):
    """A 1024 x 1024 window of the block (rasterio read, host memory) and the panel tables in it."""

    def __init__(self, offset, tables):
        self.offset, self.tables = offset, tables


def slice_offsets(height, width, tile, overlap):
    step = int(tile * (1 - overlap))
    ys = list(range(0, height - tile, step)) + [height - tile]
    xs = list(range(0, width - tile, step)) + [width - tile]
    return [(x, y) for y in ys for x in xs]


def fp16(n_elements):
    return torch.empty(n_elements, dtype=torch.float16, device="cuda")


class Conv(nn.Module):
    """ultralytics.nn.modules.Conv: conv + BN + SiLU, fused for inference, fp16."""

    def __init__(self, c1, c2, k=3, s=1):
        nn.Module.__init__(self)
        self.conv = nn.Parameter(fp16(c2 * c1 * k * k), requires_grad=False)
        self.c2, self.s = c2, s

    def forward(self, x):
        c, h, w = x.chw
        out = fp16(self.c2 * (h // self.s) * (w // self.s))
        out.chw = (self.c2, h // self.s, w // self.s)
        return out


class C2f(nn.Module):
    def __init__(self, c1, c2, n):
        nn.Module.__init__(self)
        self.cv1 = Conv(c1, c2, 1)
        self.n = n
        for i in range(n):
            setattr(self, "m%d" % i, Conv(c2 // 2, c2 // 2, 3))
        self.cv2 = Conv((2 + n) * c2 // 2, c2, 1)

    def forward(self, x):
        y = [self.cv1(x)]
        for i in range(self.n):
            part = y[-1]
            half = fp16(part.chw[0] // 2 * part.chw[1] * part.chw[2])
            half.chw = (part.chw[0] // 2,) + part.chw[1:]
            y.append(getattr(self, "m%d" % i)(half))
        cat = fp16(sum(t.chw[0] for t in y) * y[0].chw[1] * y[0].chw[2])
        cat.chw = (sum(t.chw[0] for t in y),) + y[0].chw[1:]
        return self.cv2(cat)


class SegmentationModel(nn.Module):
    """YOLOv8m-seg: backbone, PAN neck, Segment head (Detect + 32 prototypes at 1/4 resolution)."""

    def __init__(self):
        nn.Module.__init__(self)
        self.stem = Conv(3, 48, 3, 2)
        self.down1 = Conv(48, 96, 3, 2)
        self.c2f1 = C2f(96, 96, 2)
        self.down2 = Conv(96, 192, 3, 2)
        self.c2f2 = C2f(192, 192, 4)
        self.down3 = Conv(192, 384, 3, 2)
        self.c2f3 = C2f(384, 384, 4)
        self.down4 = Conv(384, 576, 3, 2)
        self.c2f4 = C2f(576, 576, 2)
        self.neck = C2f(576, 576, 6)
        self.proto = Conv(192, 32, 1)
        self.head = nn.Parameter(fp16(6_500_000), requires_grad=False)

    def forward(self, x):
        x = self.down1(self.stem(x))
        p2 = self.c2f1(x)
        p3 = self.c2f2(self.down2(p2))
        p4 = self.c2f3(self.down3(p3))
        p5 = self.neck(self.c2f4(self.down4(p4)))
        up = fp16(p3.chw[0] * p3.chw[1] * 2 * p3.chw[2] * 2)        # proto upsample to 1/4
        up.chw = (p3.chw[0], p3.chw[1] * 2, p3.chw[2] * 2)
        protos = self.proto(up)                                     # (32, 256, 256)
        anchors = (TILE // 8) ** 2 + (TILE // 16) ** 2 + (TILE // 32) ** 2
        preds = fp16((4 + 2 + 32) * anchors)                        # boxes, 2 class scores, 32 mask coefs
        return preds, protos


def non_max_suppression(preds, n_keep):
    det = fp16(n_keep * 38)                                         # (n, 6 + 32)
    return det


def process_mask(protos, det, n, shape):
    """ultralytics.utils.ops.process_mask(..., upsample=True), as retina_masks uses it."""
    masks = fp16(n * protos.chw[1] * protos.chw[2])                # (masks_in @ protos).sigmoid()
    up = fp16(n * shape[0] * shape[1])                             # F.interpolate(masks[None], shape, "bilinear")
    del masks
    return up                                                       # .gt_(0.5) in place


class OrthoSolarSegmenter(object):
    def __init__(self, model):
        self.model = model
        self.results = {}              # block name -> per-tile detections, exported to GeoJSON at the end
        self.rng = random.Random(7)

    def predict_tile(self, tile):
        img = fp16(3 * TILE * TILE)                                 # torch.from_numpy(tile).cuda().half() / 255
        img.chw = (3, TILE, TILE)
        with torch.inference_mode():
            preds, protos = self.model(img)
            n = tile.tables                                         # what NMS keeps above conf=0.35
            det = non_max_suppression(preds, n)
            masks = process_mask(protos, det, n, (TILE, TILE)) if n else None
        return det, masks

    def segment_block(self, name):
        tiles, found = [], 0
        on_farm = self.rng.random() < 0.9
        for x0, y0 in slice_offsets(BLOCK_SIZE, BLOCK_SIZE, TILE, OVERLAP):
            tile = Tile((x0, y0), self.rng.randint(0, 18) if on_farm or self.rng.random() < 0.3 else 0)
            boxes, masks = self.predict_tile(tile)
            found += tile.tables
            tiles.append({"offset": (x0, y0), "boxes": boxes, "masks": masks})
        self.results[name] = tiles
        print("%s: %d tiles, %d tables" % (name, len(tiles), found))

    def export_geojson(self, path):
        for name, tiles in self.results.items():
            for t in tiles:
                pass                   # t["masks"].cpu().numpy() -> cv2.findContours -> shapely polygons


def main():
    model = SegmentationModel().eval()
    seg = OrthoSolarSegmenter(model)
    blocks = ["block_%02d_%02d" % (r, c) for r in range(5) for c in range(8)]
    for name in blocks:
        seg.segment_block(name)
    seg.export_geojson("solar_tables.geojson")


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
