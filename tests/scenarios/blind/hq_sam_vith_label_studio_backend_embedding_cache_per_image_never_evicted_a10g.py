"""A Label Studio ML backend serving HQ-SAM ViT-H for click-to-segment annotation keeps every image's
embeddings (image embedding + the four intermediate ViT embeddings HQ-SAM needs) in a dict on the GPU, keyed by
image URL, and never evicts any. After ~200 distinct images of an annotation session the encoder's next global
attention block cannot get a 1 GiB score matrix on a 24 GB A10G.

The real program (label-studio-ml-backend, model.py, the SAM example adapted to sam-hq):

    sam = sam_model_registry["vit_h"](checkpoint="sam_hq_vit_h.pth").to("cuda")
    predictor = SamPredictor(sam)
    class HQSAMBackend(LabelStudioMLBase):
        embedding_cache = {}                                  # url -> (features, interm_features, sizes)
        def predict(self, tasks, context=None, **kw):
            url = tasks[0]["data"]["image"]
            if url in self.embedding_cache:                   # clicks 2..n on the same image are instant
                predictor.features, predictor.interm_features, ... = self.embedding_cache[url]
            else:
                predictor.set_image(load_image(url))          # ViT-H forward, ~0.4 s on an A10G
                self.embedding_cache[url] = (predictor.features, predictor.interm_features, ...)
            masks, scores, _ = predictor.predict(point_coords=..., point_labels=..., hq_token_only=True)

The cache was written so that annotators going back and forth between images do not wait; it has no size
bound, no eviction when a task is submitted, and lives in a module-level dict of the gunicorn worker.

Sizes (fp32, 1024x1024 input, ViT-H: 32 blocks, 1280 wide, 16 heads, 64x64 = 4096 tokens):
  * weights ~632M parameters = 2.4 GiB, CUDA context ~0.5 GiB;
  * per cached image: image embedding 1x256x64x64x4 B = 4 MiB + interm_embeddings 4 x (1x64x64x1280x4 B =
    20 MiB) = 84 MiB;
  * transient per set_image (under torch.inference_mode): a global-attention block (blocks 7, 15, 23, 31) makes
    the 16 x 4096 x 4096 fp32 score matrix (1 GiB), the decomposed relative-position add (another 1 GiB) and the
    softmax (another 1 GiB): ~3 GiB at the peak, freed after the block;
  * 22.5 GiB card - 2.9 GiB - 3 GiB transient leaves ~16.5 GiB for the cache: ~200 images. The annotation
    session (three annotators, one backend) reaches that after lunch: the 210th distinct image fails in its
    first global-attention block (block 7), asking for the 1 GiB relative-position copy of the score matrix,
    with 20.7 GiB allocated, 17.1 GiB of it the 209 cached entries. ~1.1 GiB is reserved but unallocated: cache
    entries were carved out of the cached 1 GiB attention segments over the session, leaving holes -- a side
    effect of the growth; expandable_segments would buy one or two more images.

What an expert says first: the memory grew request after request in the backend's embedding cache; bound it
(an LRU of a few dozen images, or drop an image's entry when its task is submitted), or keep the cached
embeddings on the CPU and move one back per click. Wrong advice: inference_mode / no_grad (already on),
smaller batch (one image per request), mixed precision or a smaller SAM (they only change after how many
images it fails), gradient checkpointing (no training), expandable_segments / empty_cache (the memory is live
tensors in the dict, not a cache or fragmentation), another process (the backend is alone on the card).
"""
import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

IMG_SIZE = 1024
EMBED_DIM = 1280
DEPTH = 32
NUM_HEADS = 16
WINDOW = 14
GLOBAL_ATTN_INDEXES = (7, 15, 23, 31)
TOKENS = (IMG_SIZE // 16) ** 2          # 4096
OUT_CHANS = 256


class Attention(nn.Module):
    """SAM's Attention with decomposed relative positions (eager: q @ k^T materialised)."""

    def __init__(self, window):
        super().__init__()
        self.window = window
        self.qkv = nn.Parameter(torch.empty(EMBED_DIM * EMBED_DIM * 3 * 4))
        self.proj = nn.Parameter(torch.empty(EMBED_DIM * EMBED_DIM * 4))
        n = 2 * (window if window else IMG_SIZE // 16) - 1
        self.rel_pos_h = nn.Parameter(torch.empty(n * (EMBED_DIM // NUM_HEADS) * 4))
        self.rel_pos_w = nn.Parameter(torch.empty(n * (EMBED_DIM // NUM_HEADS) * 4))

    def forward(self, x):
        # the stand-in computes nothing: each operation is the tensor it makes, freed when the name is dropped
        if self.window:
            n_win = ((64 + WINDOW - 1) // WINDOW) ** 2            # window_partition pads 64 -> 70: 25 windows
            seq = WINDOW * WINDOW
        else:
            n_win, seq = 1, TOKENS
        qkv = torch.empty(n_win * seq * EMBED_DIM * 3 * 4)       # self.qkv(x)
        attn = torch.empty(n_win * NUM_HEADS * seq * seq * 4)     # (q * self.scale) @ k.transpose(-2, -1)
        attn_rel = torch.empty(attn.nbytes)                       # add_decomposed_rel_pos(attn, q, ...)
        del attn
        attn = torch.empty(attn_rel.nbytes)                       # attn.softmax(dim=-1)
        del attn_rel
        out = torch.empty(n_win * seq * EMBED_DIM * 4)            # (attn @ v) ... self.proj(x)
        del attn, qkv
        return out


class Block(nn.Module):
    def __init__(self, window):
        super().__init__()
        self.attn = Attention(window)
        self.mlp_lin1 = nn.Parameter(torch.empty(EMBED_DIM * 4 * EMBED_DIM * 4))
        self.mlp_lin2 = nn.Parameter(torch.empty(EMBED_DIM * 4 * EMBED_DIM * 4))

    def forward(self, x):
        x = self.attn(x)                                          # shortcut + attn (window_unpartition)
        h = torch.empty(TOKENS * EMBED_DIM * 4 * 4)               # self.mlp.lin1 + GELU
        x = torch.empty(TOKENS * EMBED_DIM * 4)                   # x + self.mlp(self.norm2(x))
        del h
        return x


class ImageEncoderViTHQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.patch_embed = nn.Parameter(torch.empty(EMBED_DIM * 3 * 16 * 16 * 4))
        self.pos_embed = nn.Parameter(torch.empty(TOKENS * EMBED_DIM * 4))
        for i in range(DEPTH):
            setattr(self, "block%d" % i, Block(0 if i in GLOBAL_ATTN_INDEXES else WINDOW))
        self.neck = nn.Parameter(torch.empty((EMBED_DIM * OUT_CHANS + OUT_CHANS * OUT_CHANS * 9) * 4))

    def forward(self, x):
        x = torch.empty(TOKENS * EMBED_DIM * 4)                   # patch_embed(x) + pos_embed
        interm_embeddings = []
        for i in range(DEPTH):
            x = getattr(self, "block%d" % i)(x)
            if i in GLOBAL_ATTN_INDEXES:
                interm_embeddings.append(x)                       # HQ-SAM keeps the global blocks' outputs
        features = torch.empty(OUT_CHANS * TOKENS * 4)            # self.neck(x.permute(0, 3, 1, 2))
        return features, interm_embeddings


class MaskDecoderHQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.Parameter(torch.empty(4_058_000 * 4))
        self.hf_layers = nn.Parameter(torch.empty(1_100_000 * 4))

    def forward(self, features, interm_embeddings, point_coords):
        hq_features = torch.empty(32 * 256 * 256 * 4)            # embedding_encoder(features) + compress_vit_feat
        low_res_masks = torch.empty(1 * 256 * 256 * 4)
        del hq_features
        return low_res_masks


class SamHQ(nn.Module):
    def __init__(self):
        super().__init__()
        self.image_encoder = ImageEncoderViTHQ()
        self.prompt_encoder = nn.Parameter(torch.empty(6_220 * 4))
        self.mask_decoder = MaskDecoderHQ()


class SamPredictor(object):
    def __init__(self, model):
        self.model = model
        self.features = None
        self.interm_features = None
        self.is_image_set = False

    def set_image(self, image):
        with torch.inference_mode():
            input_image = torch.empty(3 * IMG_SIZE * IMG_SIZE * 4)   # ResizeLongestSide + normalize + pad
            self.features, self.interm_features = self.model.image_encoder(input_image)
        self.original_size = image["size"]
        self.is_image_set = True

    def predict(self, point_coords, point_labels, multimask_output=False, hq_token_only=True):
        with torch.inference_mode():
            low_res = self.model.mask_decoder(self.features, self.interm_features, point_coords)
            masks = torch.empty(image_pixels(self.original_size))    # postprocess_masks -> original size, > 0
        return masks, low_res


def image_pixels(size):
    h, w = size
    return h * w


sam = SamHQ()
predictor = SamPredictor(sam)


class HQSAMBackend(object):
    """label_studio_ml.model.LabelStudioMLBase subclass; one instance serves every annotator."""
    embedding_cache = {}

    def predict(self, tasks, context=None):
        task = tasks[0]
        url = task["data"]["image"]
        if url in self.embedding_cache:
            predictor.features, predictor.interm_features, predictor.original_size = self.embedding_cache[url]
            predictor.is_image_set = True
        else:
            predictor.set_image(load_image(url))
            self.embedding_cache[url] = (predictor.features, predictor.interm_features, predictor.original_size)
        results = []
        for click in context["keypoints"]:
            masks, _ = predictor.predict(point_coords=click, point_labels=[1])
            results.append(mask_to_rle(masks))
        return results


def load_image(url):
    return {"url": url, "size": (3000, 4000)}                  # 12 MP field photos


def mask_to_rle(masks):
    return {"format": "rle", "bytes": masks.nbytes // 8}


def annotation_session(backend, n_tasks=600):
    """Three annotators clicking through a project: each task gets 2-4 clicks, one in five is revisited."""
    for i in range(n_tasks):
        url = "s3://weed-survey/plots/IMG_%05d.JPG" % (4100 + i)
        backend.predict([{"data": {"image": url}}], {"keypoints": [(1500, 2000)] * (2 + i % 3)})
        if i % 5 == 4:
            back = "s3://weed-survey/plots/IMG_%05d.JPG" % (4100 + i - 2)
            backend.predict([{"data": {"image": back}}], {"keypoints": [(900, 1200)]})


def main():
    backend = HQSAMBackend()
    annotation_session(backend)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
