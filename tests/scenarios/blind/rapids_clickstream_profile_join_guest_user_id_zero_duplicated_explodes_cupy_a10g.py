"""build_features.py -- a nightly RAPIDS-style feature job (CuPy arrays, hand-written sort-merge join, no
PyTorch in this process) on an AWS g5 instance (A10G, 24 GiB), run with plain
`LD_PRELOAD=liboomguard.so python build_features.py`:

    ev_user = cp.asarray(events["user_id"])          # 60M click events: user_id int64, item_id int32, ts int64
    pr_user = cp.asarray(profiles["user_id"])        # 8M user profiles: user_id int64 + 32 float32 features
    order = cp.argsort(pr_user); pr_sorted = pr_user[order]
    lo = cp.searchsorted(pr_sorted, ev_user, "left")
    hi = cp.searchsorted(pr_sorted, ev_user, "right")
    counts = hi - lo                                  # matches per event (1 for a normal user)
    offsets = cp.cumsum(counts)
    n_out = int(offsets[-1])                          # rows of the join's output
    left_idx = cp.empty(n_out, cp.int64)              # <- fails
    right_idx = cp.empty(n_out, cp.int64)
    ... gather the profile features per event, then aggregate per item ...

It ran for months.  Last night's profiles came from a backfill that wrote every logged-out visitor with the
placeholder user_id 0: 2,000 profile rows share key 0 (the key was unique before), and 3.0M of the 60M
click events are logged-out sessions, also user_id 0.  The join now pairs each of those 3.0M events with
each of the 2,000 placeholder profiles: 6.0 billion output rows (plus the 57M normal ones), so the first
output index array alone is 6.06e9 x 8 B = 45 GiB, asked for in one cp.empty on a card with ~19.8 GiB free
(the inputs and the join's working arrays hold 3.9 GB).  CuPy frees its pool's cached blocks and retries,
then raises cupy.cuda.memory.OutOfMemoryError("Out of memory allocating 48,456,000,000 bytes").

What an expert says first: the request is absurd for this job -- 45 GiB for one column of a join whose
inputs are 2.3 GB -- which means the join exploded on a duplicated key: drop (or deduplicate) the
placeholder user_id 0 before joining (profiles must be unique per user; guest events get no profile
features).  The memory-level fallback is to do the join in chunks of events and aggregate each chunk
before the next (split the operation).  Wrong advice: freeing CuPy's pool / empty_cache (the pool already
did, and the request is 2.3x the free memory), PyTorch allocator settings (expandable segments: no
PyTorch here, no fragmentation), a smaller batch or mixed precision (there is no batch or model), and a
bigger GPU (even an 80 GB card cannot hold the two 45 GiB index arrays, and the rows are garbage).
"""
import sys

import cupy as cp

import scen_truth

M = 1000000
N_EVENTS = 60 * M
N_PROFILES = 8 * M
N_FEAT = 32
GUEST_EVENTS = 3 * M
GUEST_PROFILES = 2000


def mark_cupy_oom(size, total_before):
    """Truth mark (test scaffolding): the cudaMalloc CuPy's pool made for the failing request (rounded to
    512 B), what the pool holds and what it gave back between its two attempts."""
    pool = cp.get_default_memory_pool()
    rounded = (size + 511) // 512 * 512
    scen_truth.mark("fail", 0, rounded, allocated=pool.used_bytes(), reserved=pool.total_bytes(),
                    released=total_before - pool.total_bytes(), fw=1)


def main():
    pool = cp.get_default_memory_pool()
    # the two tables, column by column, as cudf.read_parquet puts them on the GPU
    ev_user = cp.empty(N_EVENTS, "int64")
    ev_item = cp.empty(N_EVENTS, cp.int32)
    ev_ts = cp.empty(N_EVENTS, "int64")
    pr_user = cp.empty(N_PROFILES, "int64")
    pr_feat = cp.empty((N_PROFILES, N_FEAT), cp.float32)

    # sort the right side by key (argsort's scratch is freed when it returns)
    scratch = cp.empty(2 * N_PROFILES, "int64")
    order = cp.empty(N_PROFILES, "int64")
    del scratch
    pr_sorted = cp.empty(N_PROFILES, "int64")

    # matches per event
    lo = cp.empty(N_EVENTS, "int64")
    hi = cp.empty(N_EVENTS, "int64")
    counts = cp.empty(N_EVENTS, "int64")
    del hi
    offsets = cp.empty(N_EVENTS, "int64")
    # what offsets[-1] says: one row per normal event, 2,000 per guest event
    n_out = (N_EVENTS - GUEST_EVENTS) + GUEST_EVENTS * GUEST_PROFILES

    before = pool.total_bytes()
    try:
        left_idx = cp.empty(n_out, "int64")
        right_idx = cp.empty(n_out, "int64")
    except cp.cuda.memory.OutOfMemoryError:
        mark_cupy_oom(n_out * 8, before)
        raise
    del left_idx, right_idx, lo, counts, offsets, order, pr_sorted, ev_user, ev_item, ev_ts, pr_user, pr_feat
    return 0


if __name__ == "__main__":
    sys.exit(main())
