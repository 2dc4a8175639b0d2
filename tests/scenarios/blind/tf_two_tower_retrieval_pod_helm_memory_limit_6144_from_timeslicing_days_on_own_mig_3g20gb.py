"""retrieval_server.py -- candidate retrieval for a shopping feed: a TensorFlow two-tower model (TFRS), served by a
small gRPC service in a Kubernetes Deployment.  At start the pod loads the user tower and the day's candidate
index (the item tower's output for every item in the catalog, kept on the GPU for brute-force top-k), then
answers a warm-up request before it reports ready:

    limit = int(os.environ.get("TF_GPU_MEMORY_LIMIT_MB", "6144"))         # from the Helm chart's values.yaml
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=limit)])
    user_tower = tf.saved_model.load("/models/user_tower/20261207")
    index = tfrs.layers.factorized_top_k.BruteForce(k=500)
    index.index(candidates=item_embeddings, identifiers=item_ids)   # 14M x 64 float32
    index(user_tower(warmup_queries))                                # 64 queries: scores 64 x 14M

The Helm value TF_GPU_MEMORY_LIMIT_MB=6144 dates from last year, when three replicas shared one 24 GB card
through GPU time-slicing and each had to stay inside a third of it.  Since the platform team moved the
serving node pool to A100-40GB cards cut into MIG 3g.20gb slices, each pod has a slice of its own (19.5 GiB),
but the chart still caps TensorFlow's allocator at 6 GiB.  Meanwhile the catalog grew from 6M to 14M items:

    user tower: user_id table 6M x 64 float32 = 1.43 GiB, other feature tables and dense layers ~0.1 GiB
    candidate index: 14M x 64 float32 = 3.34 GiB (+ 14M int32 ids, 53 MiB)          -> 4.93 GiB in use
    warm-up scores: 64 x 14M float32 = 3.34 GiB                                      -> does not fit in 6 GiB

TensorFlow raises ResourceExhaustedError from its own allocator (GPU_0_bfc) while 13 GiB of the MIG slice are
untouched: no driver allocation failed.  (With 6M items: 1.43 + 1.43 GiB of index + 1.43 GiB of scores fitted.)

What an expert says first: TensorFlow is capped at 6 GiB by a stale setting; raise or remove memory_limit (the
Helm value) now that the pod owns its slice.  Chunked scoring or ScaNN would help later; a smaller MIG profile
is not the problem.  Wrong advice: a bigger GPU, quantizing the index, stopping other processes (there are
none: the slice is the pod's own), empty_cache / expandable segments (PyTorch's), offloading to CPU.
"""
import os
import sys

import tensorflow as tf

import scen_truth

GiB = 1 << 30
EMB_DIM = 64
USERS = 6000000
ITEMS = 14000000            # today's catalog (6M when the limit was chosen)
WARMUP_QUERIES = 64

limit_mb = int(os.environ.get("TF_GPU_MEMORY_LIMIT_MB", "6144"))
gpus = tf.config.list_physical_devices("GPU")
if gpus:
    tf.config.set_logical_device_configuration(gpus[0], [tf.config.LogicalDeviceConfiguration(memory_limit=limit_mb)])


def load_user_tower():
    """tf.saved_model.load: the variables restored onto the GPU."""
    variables = {
        "user_id_embedding": tf.zeros((USERS, EMB_DIM), tf.float32),             # 1.43 GiB
        "user_city_embedding": tf.zeros((120000, 32), tf.float32),
        "user_segment_embedding": tf.zeros((5000, 32), tf.float32),
        "recent_category_embedding": tf.zeros((40000, 32), tf.float32),
        "query_token_embedding": tf.zeros((500000, 64), tf.float32),
        "dense_1/kernel": tf.zeros((416, 1024), tf.float32),
        "dense_2/kernel": tf.zeros((1024, 512), tf.float32),
        "dense_3/kernel": tf.zeros((512, EMB_DIM), tf.float32),
    }
    return variables


def load_candidate_index(day):
    """BruteForce.index(): the item tower's embeddings of the whole catalog and their ids, kept on the GPU."""
    return {"candidates": tf.zeros((ITEMS, EMB_DIM), tf.float32),                  # 3.34 GiB
            "identifiers": tf.zeros((ITEMS,), tf.int32)}


def brute_force_top_k(index, queries, k=500):
    """tfrs BruteForce.call: scores = tf.linalg.matmul(queries, candidates, transpose_b=True), then
    tf.math.top_k.  The scores of the whole batch against the whole catalog exist at once."""
    n = queries.shape[0]
    scores = tf.zeros((n, ITEMS), tf.float32)                                     # 64 x 14M: 3.34 GiB
    top = tf.zeros((n, k), tf.float32)
    return top


def user_tower_call(tower, batch):
    hidden = tf.zeros((batch, 1024), tf.float32)
    return tf.zeros((batch, EMB_DIM), tf.float32)


tower = load_user_tower()
index = load_candidate_index("20261207")
try:
    queries = user_tower_call(tower, WARMUP_QUERIES)
    result = brute_force_top_k(index, queries)
except tf.errors.ResourceExhaustedError:
    from tensorflow import _bfc
    arena = _bfc.arena(0)
    scen_truth.mark("fail", 0, WARMUP_QUERIES * ITEMS * 4, allocated=arena.in_use, reserved=arena.pool,
                    released=0, fw=1)
    raise
print("retrieval server ready")
sys.exit(0)
