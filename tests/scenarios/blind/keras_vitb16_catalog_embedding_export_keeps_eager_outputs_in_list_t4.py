"""export_embeddings.py -- a retail team exports image embeddings for a 50,000-photo product catalog with
a Keras ViT-B/16 backbone (TensorFlow 2.17, eager) on a Colab-style Tesla T4 (15 GiB), with
TF_FORCE_GPU_ALLOW_GROWTH=true set in the notebook's environment, run with plain
`LD_PRELOAD=liboomguard.so python export_embeddings.py`:

    backbone = keras_hub.models.ViTBackbone.from_preset("vit_base_patch16_224_imagenet")   # 86M fp32: 344 MB
    ds = tf.data.Dataset.from_tensor_slices(paths).map(load_and_resize).batch(256)
    all_feats = []
    for images in ds:
        out = backbone(images, training=False)      # (256, 197, 768) float32, on the GPU
        all_feats.append(out)                       # meant: out[:, 0, :].numpy()  (the CLS token, on the host)
    np.save("catalog_emb.npy", tf.concat(all_feats, 0)[:, 0].numpy())

Sizes: a batch of 256 RGB 224x224 float32 images is 154 MB; inside the forward pass the largest
temporaries are the attention scores (256 x 12 heads x 197 x 197 x 4 B = 477 MB) and the MLP's hidden
activations (256 x 197 x 3072 x 4 B = 620 MB), freed layer by layer (inference: nothing is kept for a
backward pass).  The output -- the whole last hidden state, every one of the 197 tokens -- is 256 x 197 x
768 x 4 B = 155 MB, and the loop keeps every batch's output as an EagerTensor on the GPU in `all_feats`.
TensorFlow's arena (memory growth on) grows region by region as the list grows; the T4's 15 GiB less the
context leave ~14.5 GiB, of which TensorFlow may take 90% (13 GiB).  After ~82 batches (21,000 of the
50,000 photos) the list holds ~11.8 GiB and the next batch's MLP activation (591 MiB) no longer fits:
ResourceExhaustedError ("OOM when allocating tensor with shape[256,197,3072]") in the middle of a batch
identical to the 82 before it.

What an expert says first: this is a leak by design of the loop, not a model that is too big -- memory grows
by the same 155 MB every batch and every batch's output is kept on the GPU.  Keep only what is needed, on the
host: `all_feats.append(out[:, 0, :].numpy())` (or `backbone.predict(ds)`, which returns NumPy), so the GPU
holds one batch at a time.  Wrong advice: a smaller batch (the list would still grow to the same 11.8 GiB,
just later -- 50,000 photos x 197 x 768 x 4 B is 30 GB, twice the card), mixed precision (halves the leak,
the export still dies), PyTorch's expandable_segments or empty_cache (no PyTorch here; nothing is cached
unused), a bigger GPU (the list grows with the catalog), and inference_mode-style advice (a Keras call with
training=False already keeps nothing for a backward pass).
"""
import sys

import tensorflow as tf

import scen_truth

B = 256
TOKENS, HIDDEN, MLP, HEADS = 197, 768, 3072, 12
N_PHOTOS = 50000


def weights():
    """ViT-B/16: patch embedding, 12 encoder blocks (qkv + proj + 2 MLP matrices each), head: 86M fp32."""
    w = [tf.zeros((768 * 3 * 16 * 16 + 768,), tf.float32), tf.zeros((TOKENS * HIDDEN,), tf.float32)]
    for _ in range(12):
        w.append(tf.zeros((HIDDEN, 3 * HIDDEN), tf.float32))
        w.append(tf.zeros((HIDDEN, HIDDEN), tf.float32))
        w.append(tf.zeros((HIDDEN, MLP), tf.float32))
        w.append(tf.zeros((MLP, HIDDEN), tf.float32))
    return w


def backbone(images):
    """One forward pass in inference: each block's temporaries are freed when the next one runs (the largest
    is the MLP's hidden activation); the output is the last hidden state of every token."""
    x = tf.zeros((B, TOKENS, HIDDEN), tf.float32)                 # patch tokens + position embedding
    for _ in range(12):
        h = tf.zeros((B, TOKENS, MLP), tf.float32)                # attention + MLP hidden activations
        del h
        x2 = tf.zeros((B, TOKENS, HIDDEN), tf.float32)            # the block's output
        x = x2
        del x2
    return x


def mark_tf_oom(err):
    """Truth mark (test scaffolding): the request TensorFlow's arena refused, read from its message."""
    import re
    m = re.search(r"shape\[([0-9,]*)\] and type (\w+)", err.message)
    n = {"float": 4, "half": 2, "int32": 4}[m.group(2)]
    for d in m.group(1).split(","):
        n *= int(d)
    a = tf._bfc.arena(0)
    scen_truth.mark("fail", 0, (n + 255) // 256 * 256, allocated=a.in_use, reserved=a.pool, released=0, fw=1)


def main():
    params = weights()
    all_feats = []
    for step in range(N_PHOTOS // B + 1):
        images = tf.zeros((B, 224, 224, 3), tf.float32)
        try:
            out = backbone(images)
        except tf.errors.ResourceExhaustedError as e:
            mark_tf_oom(e)
            raise
        del images
        all_feats.append(out)                                      # the whole (256, 197, 768) output, on the GPU
    del params
    return 0


if __name__ == "__main__":
    sys.exit(main())
