"""Building an IVF (inverted-file) index for a product-search corpus on one A10G (24 GB, 22.5 GiB usable).

The real code (build_index.py, run nightly after the e5-base encoder refresh):

    emb = torch.from_numpy(np.load("passages_e5.npy")).cuda()        # 2,000,000 x 768 float32, L2-normalised
    centroids = spherical_kmeans(emb, n_lists=4096, n_iter=20, sample=64 * 4096)
    with torch.no_grad():
        assign = (emb @ centroids.T).argmax(dim=1)                   # the list of every passage
    lists = build_inverted_lists(assign, emb)

spherical_kmeans trains on a random sample of 64 points per list (262,144 x 768) and was written that way on
purpose: each iteration's similarity matrix is 262,144 x 4,096 x 4 B = 4.3 GB, fine.  The final assignment
line was copied from it and run on the whole corpus: emb @ centroids.T is 2,000,000 x 4,096 x 4 B = 32.8 GB
(30.5 GiB) in one tensor, more than the whole card.  Held at that moment: the corpus 6.14 GB, the centroids
12.6 MB, the CUDA context; the allocator's cached 4.3 GB segment is given back on its retry, and
~16.3 GiB is all that is free.
No training, no autograd (no_grad), nothing cached or fragmented: one operation whose output is too big.
What an expert says first: do the assignment in chunks (e.g. 131,072 rows at a time: 2.1 GB of scores, argmax,
keep the int64 ids), or hand the assignment to faiss (GpuIndexFlatIP tiles it itself).  Wrong advice:
expandable_segments / empty_cache (the request is bigger than the card), mixed precision (half of 30.5 GiB still
does not fit, and fp16 similarities hurt the assignment), gradient checkpointing / inference_mode (no graph
exists), a bigger GPU (the corpus doubles next quarter).
"""
import torch

import scen_truth

scen_truth.note_every_empty(torch)

N_PASSAGES = 2_000_000
DIM = 768
N_LISTS = 4096
POINTS_PER_LIST = 64
N_ITER = 20
INT64 = 8


def load_passage_embeddings(path="passages_e5.npy"):
    """np.load(path) -> torch.from_numpy(...).cuda(): the whole corpus on the GPU, float32."""
    return torch.empty(N_PASSAGES * DIM, dtype=torch.float32, device="cuda")


def spherical_kmeans(emb, n_lists, n_iter, sample):
    with torch.no_grad():
        centroids = torch.empty(n_lists * DIM, dtype=torch.float32, device="cuda")   # emb[perm[:n_lists]].clone()
        x = torch.empty(sample * DIM, dtype=torch.float32, device="cuda")            # emb[perm[:sample]]
        for it in range(n_iter):
            sims = torch.empty(sample * n_lists, dtype=torch.float32, device="cuda")  # x @ centroids.T
            assign = torch.empty(sample * INT64, device="cuda")                        # sims.argmax(dim=1)
            del sims
            new_centroids = torch.empty(n_lists * DIM, dtype=torch.float32, device="cuda")  # index_add_, normalize
            centroids = new_centroids
            del assign
        return centroids


def assign_to_lists(emb, centroids):
    with torch.no_grad():
        sims = torch.empty(N_PASSAGES * N_LISTS, dtype=torch.float32, device="cuda")  # emb @ centroids.T
        return torch.empty(N_PASSAGES * INT64, device="cuda")                          # sims.argmax(dim=1)


def build_inverted_lists(assign, emb):
    order = torch.empty(N_PASSAGES * INT64, device="cuda")                           # assign.argsort()
    return {"order": order, "offsets": torch.empty((N_LISTS + 1) * INT64, device="cuda")}


def main():
    emb = load_passage_embeddings()
    centroids = spherical_kmeans(emb, N_LISTS, N_ITER, POINTS_PER_LIST * N_LISTS)
    print("k-means done: %d lists" % N_LISTS)
    assign = assign_to_lists(emb, centroids)
    lists = build_inverted_lists(assign, emb)
    print("index built", len(lists))


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
