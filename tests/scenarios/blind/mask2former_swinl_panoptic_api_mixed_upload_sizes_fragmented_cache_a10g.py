"""A Mask2Former (Swin-L, COCO panoptic) HTTP service that post-processes every upload at its own
size: after ~1,200 requests of photos, panoramas and scans of all shapes, the caching allocator's
segments are pinned by small long-lived result maps, and an ordinary 12 MP photo fails with ~14.8 GiB
reserved but unallocated.

The real program (FastAPI + transformers 4.40, one NVIDIA A10G 24 GB, one worker, fp16):

    processor = AutoImageProcessor.from_pretrained("facebook/mask2former-swin-large-coco-panoptic")
    model = Mask2FormerForUniversalSegmentation.from_pretrained(..., torch_dtype=torch.float16).cuda().eval()
    RECENT = OrderedDict()                      # request id -> result, the last 64, for GET /result/{id}

    @app.post("/panoptic")
    def panoptic(file: UploadFile):
        image = Image.open(file.file).convert("RGB")
        image.thumbnail((4032, 4032))           # uploads capped at 4032 px (a phone's 12 MP) on the long side
        inputs = processor(images=image, return_tensors="pt").to("cuda", torch.float16)  # 800 / 1333 resize
        with torch.inference_mode():
            outputs = model(**inputs)
            result = processor.post_process_panoptic_segmentation(
                outputs, target_sizes=[image.size[::-1]], label_ids_to_fuse={...})[0]
        RECENT[rid] = result                    # {"segmentation": (H, W) int32 on the GPU, "segments_info"}
        if len(RECENT) > 64: RECENT.popitem(last=False)

post_process_panoptic_segmentation upsamples all 200 query masks to the upload's size (200 x H x W
fp16), takes the sigmoid (another 200 x H x W), keeps the confident queries (K x H x W, twice),
argmaxes them (H x W int64) and writes the (H, W) int32 segmentation that the service keeps.

Arithmetic.  Weights 216 M fp16 = 0.4 GiB; a forward at <= 800 x 1333 needs a few hundred MiB of
transients.  The post-processing of one upload peaks at 2 x 200 x H x W x 2 bytes: 0.6 GiB for a
1024 x 768 screenshot, 9.1 GiB for a 4032 x 3024 photo (two 4.5 GiB temporaries).  The 64 kept maps
are 4 x H x W bytes each (2-46 MiB, ~1.2 GiB in all).  What the service holds between requests is
~1.3-1.5 GiB and the largest request peaks near 10.5 GiB: the 24 GiB card is more than twice what any
request needs, and allocated stays flat (~1.3 GiB) over the whole run.  But every upload of a new
shape makes the allocator carve the multi-GB temporaries out of cached segments of other sizes, and
each kept segmentation map is placed by best fit into a free piece of one of those segments, where it
stays for the next 64 requests: a segment with one live map in it cannot be given back to the
driver, and its free space is split around the map.  From request ~200 on, 20.9 GiB are reserved.
Request 1,214, a 4016 x 3012 photo: the interpolated masks (4.5 GiB) are made, the sigmoid's 4614
MiB temporary finds no free piece that large (the largest are 4.31, 4.30, 3.27 and 2.48 GiB, in
segments pinned by kept maps), PyTorch frees the segments that are entirely free (none), retries and
fails: 2.6 GiB free on the device, 6.1 GiB allocated, ~14.8 GiB reserved but unallocated.

What an expert says first: this is fragmentation, not a lack of memory: set
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (segments grow and shrink in place, the pinned maps
no longer split them), and keep the returned maps off the GPU (.cpu() before storing them) or
post-process at the model's resolution and upsample only the final label map.  Wrong advice: a bigger
card or a smaller batch (the batch is one image and the job needs ~10.5 GiB), inference_mode or mixed
precision (already in force), gradient checkpointing, other processes (none), a "leak" (what is kept is
bounded at 64 maps).
"""
import collections
import random

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

NUM_QUERIES = 200
KEEP_RESULTS = 64
MiB = 1024 * 1024


def empty(shape, dtype=torch.float16):
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=dtype, device="cuda")
    t.shape = tuple(shape)
    return t


class Mask2FormerForUniversalSegmentation(nn.Module):
    """Swin-L backbone, MSDeformAttn pixel decoder, 9-layer transformer decoder over 200 queries."""

    def __init__(self):
        nn.Module.__init__(self)
        for name, n in (("backbone", 197_000_000), ("pixel_decoder", 9_000_000),
                        ("transformer_decoder", 10_000_000)):
            setattr(self, name, nn.Parameter(torch.empty(n, dtype=torch.float16, device="cuda"),
                                             requires_grad=False))

    def forward(self, pixel_values):
        _, _, h, w = pixel_values.shape
        stages = [empty((1, 192 * 2 ** i, h // (4 * 2 ** i), w // (4 * 2 ** i))) for i in range(4)]
        multi_scale = empty((1, 256, h // 8 * w // 8 + h // 16 * w // 16 + h // 32 * w // 32))
        mask_features = empty((1, 256, h // 4, w // 4))
        del stages
        masks_queries_logits = empty((1, NUM_QUERIES, h // 4, w // 4))
        class_queries_logits = empty((1, NUM_QUERIES, 134))
        del multi_scale, mask_features
        return {"masks_queries_logits": masks_queries_logits, "class_queries_logits": class_queries_logits}


class Mask2FormerImageProcessor(object):
    def __call__(self, image):
        H, W = image.size[1], image.size[0]
        scale = min(800.0 / min(H, W), 1333.0 / max(H, W))
        h, w = int(H * scale + 0.5), int(W * scale + 0.5)
        return {"pixel_values": empty((1, 3, h, w))}

    def post_process_panoptic_segmentation(self, outputs, target_sizes, threshold=0.8):
        H, W = target_sizes[0]
        masks = outputs["masks_queries_logits"]
        mask_probs = empty((NUM_QUERIES, H, W))                # F.interpolate(masks, size=(H, W), "bilinear")
        mask_probs = self._sigmoid(mask_probs)                 # .sigmoid()
        keep = outputs["num_confident"]                        # pred_scores > threshold
        mask_probs_item = empty((keep, H, W))                  # mask_probs[keep]
        del mask_probs
        pred_masks = empty((keep, H, W))                       # mask_probs_item * pred_scores.view(-1, 1, 1)
        mask_labels = empty((H, W, 8), dtype=torch.uint8)      # pred_masks.argmax(0): int64
        segmentation = empty((H, W, 4), dtype=torch.uint8)     # torch.zeros((H, W), dtype=torch.int32)
        del pred_masks, mask_probs_item, mask_labels
        return [{"segmentation": segmentation, "segments_info": [{"id": i} for i in range(keep)]}]

    def _sigmoid(self, x):
        out = empty(x.shape)
        return out


class Upload(object):
    def __init__(self, width, height):
        self.size = (width, height)


# what users sent over a day: phone photos (4:3, 3:4, 16:9), panoramas, screenshots, square scans,
# all capped at 4032 on the long side by image.thumbnail()
SHAPES = [(4032, 3024), (3024, 4032), (4032, 2268), (4032, 1008), (1280, 720), (1024, 768), (2048, 1536),
          (3024, 3024), (1600, 1200), (2400, 1080), (1080, 2400), (4032, 2688), (800, 600), (2000, 2000)]


class PanopticService(object):
    def __init__(self):
        self.processor = Mask2FormerImageProcessor()
        self.model = Mask2FormerForUniversalSegmentation().eval()
        self.recent = collections.OrderedDict()               # request id -> result, for GET /result/{id}

    def panoptic(self, rid, upload, confident):
        inputs = self.processor(upload)
        with torch.inference_mode():
            outputs = self.model(**inputs)
            outputs["num_confident"] = confident
            result = self.processor.post_process_panoptic_segmentation(outputs, target_sizes=[upload.size[::-1]])[0]
        self.recent[rid] = result
        if len(self.recent) > KEEP_RESULTS:
            self.recent.popitem(last=False)
        return {"id": rid, "segments": len(result["segments_info"])}


def serve(n_requests, seed=11):
    svc = PanopticService()
    rng = random.Random(seed)
    for rid in range(n_requests):
        w, h = rng.choice(SHAPES)
        s = rng.uniform(0.55, 1.0) if rng.random() < 0.5 else 1.0
        upload = Upload(int(w * s) // 2 * 2, int(h * s) // 2 * 2)
        svc.panoptic(rid, upload, confident=rng.randint(12, 60))
        if rid % 200 == 0:
            print("request %d: allocated %.1f GiB, reserved %.1f GiB" % (
                rid, torch.cuda.memory_allocated() / 2 ** 30, torch.cuda.memory_reserved() / 2 ** 30))


if __name__ == "__main__":
    try:
        serve(6000)
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
