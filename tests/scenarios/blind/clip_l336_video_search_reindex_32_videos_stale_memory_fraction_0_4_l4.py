"""A video-text retrieval embedding worker (CLIP ViT-L/14@336, 16 frames sampled per video, mean-pooled) alone on
an NVIDIA L4 (24 GB), still capped by torch.cuda.set_per_process_memory_fraction(0.4) from the months when it
shared the card with a Whisper ASR worker.  A bulk re-index job sends 32 videos in one batch: the forward peaks
at ~16 GB, the cap allows 9 GB, and ~17 GB of the card are free when it fails.

The real program is the team's clipvid/worker.py (transformers 4.38, eager CLIP attention), deployed with

    VIDEO_SEARCH_GPU_FRACTION=0.4        # in the Helm values since the ASR worker lived on the same L4

    torch.cuda.set_per_process_memory_fraction(float(os.environ.get("VIDEO_SEARCH_GPU_FRACTION", "1.0")))
    model = CLIPModel.from_pretrained("openai/clip-vit-large-patch14-336", torch_dtype=torch.float16).cuda().eval()

    def embed_videos(paths):
        frames = [sample_frames(p, num_frames=16) for p in paths]               # decord, uniform sampling
        pixel_values = processor(images=sum(frames, []), return_tensors="pt").pixel_values
        with torch.inference_mode():
            feats = model.get_image_features(pixel_values=pixel_values.to("cuda", torch.float16))
        return F.normalize(feats.view(len(paths), 16, -1).mean(1), dim=-1)

The ASR worker moved to its own node last week; the values file kept the fraction.

Sizes.  CLIP ViT-L/14@336 in fp16: vision tower 304 M parameters, text tower 123 M: 0.86 GB.  Cap: 0.4 x 22.5 GiB
= 9.0 GiB.  A frame is 577 tokens (24x24 patches + CLS) of width 1024; in eager attention each layer makes the
16-head 577x577 score matrix, 10.6 MB per frame in fp16, and its softmax, another 10.6 MB.  Ordinary requests
(1-4 videos, up to 64 frames) peak at ~2.6 GB.  The re-index batch: 32 videos x 16 frames = 512 frames:
pixel values 0.35 GB, each hidden state 0.6 GB, q/k/v 1.8 GB, the score matrix 5.4 GB and its softmax
another 5.4 GB: ~16 GB at the peak of a layer, which the 22.5 GB card would hold.  In the first encoder
layer, with ~4.8 GB allocated, the allocator refuses the 5.4 GB score matrix without asking the driver: the
reservation would pass the 9.0 GiB the fraction allows, while cudaMemGetInfo says ~17 GB of the card is free
and no other process is on it.  PyTorch's message says "9213.60 MiB allowed".

What an expert says first: the job is capped by its own setting, not by the card: drop or raise the memory
fraction (VIDEO_SEARCH_GPU_FRACTION=0.9 or unset now that the worker is alone on the L4); then this batch fits
with room to spare.  Splitting the 512 frames into micro-batches of 64-128 frames in embed_videos (or SDPA
attention, attn_implementation="sdpa") is the robust companion fix.  Wrong advice: a bigger GPU, quantization,
CPU offload or tensor parallelism (the card has 13 GB beyond the cap), inference_mode (already on), mixed precision
(already fp16), gradient checkpointing (no training), "stop other processes" (there are none).
"""
import os

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

GPU_FRACTION = float(os.environ.get("VIDEO_SEARCH_GPU_FRACTION", "1.0"))
NUM_FRAMES = 16
MAX_VIDEOS_PER_BATCH = 32
FP16 = 2


def new_tensor(shape, dtype=torch.float16):
    n = 1
    for d in shape:
        n *= d
    t = torch.empty(n, dtype=dtype)
    t.shape = tuple(shape)
    return t


# ---------------------------------------------------------------------------------------------------------
# transformers' CLIP (modeling_clip.py), fp16, eager attention; nn.Linear / nn.LayerNorm shaped here

class Linear(nn.Module):
    def __init__(self, in_features, out_features, bias=True):
        nn.Module.__init__(self)
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(in_features * out_features, dtype=torch.float16))
        if bias:
            self.bias = nn.Parameter(torch.empty(out_features, dtype=torch.float16))

    def forward(self, x):
        return new_tensor(x.shape[:-1] + (self.out_features,))


class LayerNorm(nn.Module):
    def __init__(self, dim):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(dim, dtype=torch.float16))
        self.bias = nn.Parameter(torch.empty(dim, dtype=torch.float16))

    def forward(self, x):
        return new_tensor(x.shape)


class CLIPAttention(nn.Module):
    def __init__(self, embed_dim, num_heads):
        nn.Module.__init__(self)
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.k_proj = Linear(embed_dim, embed_dim)
        self.v_proj = Linear(embed_dim, embed_dim)
        self.q_proj = Linear(embed_dim, embed_dim)
        self.out_proj = Linear(embed_dim, embed_dim)

    def forward(self, hidden_states):
        bsz, tgt_len, _ = hidden_states.shape
        query_states = self.q_proj(hidden_states)
        key_states = self.k_proj(hidden_states)
        value_states = self.v_proj(hidden_states)
        attn_weights = new_tensor((bsz * self.num_heads, tgt_len, tgt_len))      # torch.bmm(q, k.transpose(1, 2))
        attn_weights = new_tensor(attn_weights.shape)                            # nn.functional.softmax(dim=-1)
        attn_output = new_tensor((bsz, tgt_len, self.embed_dim))                 # torch.bmm(attn_probs, v)
        return self.out_proj(attn_output)


class CLIPEncoderLayer(nn.Module):
    def __init__(self, d, heads, mlp):
        nn.Module.__init__(self)
        self.layer_norm1 = LayerNorm(d)
        self.self_attn = CLIPAttention(d, heads)
        self.layer_norm2 = LayerNorm(d)
        self.fc1 = Linear(d, mlp)
        self.fc2 = Linear(mlp, d)

    def forward(self, hidden_states):
        residual = hidden_states
        hidden_states = self.self_attn(self.layer_norm1(hidden_states))
        hidden_states = new_tensor(residual.shape)                               # residual + hidden_states
        residual = hidden_states
        h = self.fc1(self.layer_norm2(hidden_states))
        h = new_tensor(h.shape)                                                  # quick_gelu
        h = self.fc2(h)
        return new_tensor(residual.shape)                                        # residual + h


class CLIPEncoder(nn.Module):
    def __init__(self, d, heads, mlp, n_layers):
        nn.Module.__init__(self)
        self.layers = []
        for i in range(n_layers):
            layer = CLIPEncoderLayer(d, heads, mlp)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)

    def forward(self, hidden_states):
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return hidden_states


class CLIPVisionTransformer(nn.Module):
    def __init__(self, image_size=336, patch=14, d=1024, heads=16, mlp=4096, n_layers=24):
        nn.Module.__init__(self)
        self.num_positions = (image_size // patch) ** 2 + 1
        self.d = d
        self.patch_embedding = nn.Parameter(torch.empty(3 * patch * patch * d, dtype=torch.float16))
        self.class_embedding = nn.Parameter(torch.empty(d, dtype=torch.float16))
        self.position_embedding = nn.Parameter(torch.empty(self.num_positions * d, dtype=torch.float16))
        self.pre_layrnorm = LayerNorm(d)
        self.encoder = CLIPEncoder(d, heads, mlp, n_layers)
        self.post_layernorm = LayerNorm(d)

    def forward(self, pixel_values):
        b = pixel_values.shape[0]
        embeddings = new_tensor((b, self.num_positions, self.d))                 # conv2d patches + cls + pos
        hidden = self.encoder(self.pre_layrnorm(embeddings))
        return self.post_layernorm(new_tensor((b, self.d)))                      # pooled CLS


class CLIPTextTransformer(nn.Module):
    def __init__(self, vocab=49408, d=768, heads=12, mlp=3072, n_layers=12):
        nn.Module.__init__(self)
        self.token_embedding = nn.Parameter(torch.empty(vocab * d, dtype=torch.float16))
        self.position_embedding = nn.Parameter(torch.empty(77 * d, dtype=torch.float16))
        self.encoder = CLIPEncoder(d, heads, mlp, n_layers)
        self.final_layer_norm = LayerNorm(d)


class CLIPModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.vision_model = CLIPVisionTransformer()
        self.text_model = CLIPTextTransformer()
        self.visual_projection = Linear(1024, 768, bias=False)
        self.text_projection = Linear(768, 768, bias=False)
        self.logit_scale = nn.Parameter(torch.empty(1, dtype=torch.float16))

    def get_image_features(self, pixel_values):
        return self.visual_projection(self.vision_model(pixel_values))


# ---------------------------------------------------------------------------------------------------------
# the worker

def sample_frames(video, num_frames):
    """decord.VideoReader + uniform indices; PIL images on the host."""
    return [(video, i) for i in range(num_frames)]


class VideoEmbeddingWorker(object):
    def __init__(self):
        torch.cuda.set_per_process_memory_fraction(GPU_FRACTION)
        self.model = CLIPModel().cuda().eval()
        self.index_log = []

    def embed_videos(self, paths):
        frames = [sample_frames(p, NUM_FRAMES) for p in paths]
        n = sum(len(f) for f in frames)
        # processor(images=...).pixel_values.to("cuda", torch.float16)
        pixel_values = new_tensor((n, 3, 336, 336))
        with torch.inference_mode():
            feats = self.model.get_image_features(pixel_values=pixel_values)
            video_emb = new_tensor((len(paths), 768))                              # view, mean(1), normalize
        return video_emb

    def handle(self, job):
        for i in range(0, len(job["videos"]), MAX_VIDEOS_PER_BATCH):
            emb = self.embed_videos(job["videos"][i:i + MAX_VIDEOS_PER_BATCH])
            self.index_log.append((job["id"], len(job["videos"])))
            del emb
        return {"id": job["id"], "status": "ok"}


def job_queue():
    """Jobs as the broker delivers them: uploads (a few videos each), then the nightly re-index of a channel."""
    for i, n in enumerate([1, 3, 2, 4, 1, 2]):
        yield {"id": "upload-%d" % i, "endpoint": "/embed",
               "videos": ["s3://clips/u%d_%d.mp4" % (i, k) for k in range(n)]}
    yield {"id": "reindex-channel-8841", "endpoint": "/reindex",
           "videos": ["s3://clips/ch8841/%04d.mp4" % k for k in range(212)]}


def main():
    worker = VideoEmbeddingWorker()
    for job in job_queue():
        result = worker.handle(job)
        print("%s: %s" % (job["id"], result["status"]))


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
