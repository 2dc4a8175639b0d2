"""search_service.py -- semantic search over a news publisher's archive, one long-running process on an NVIDIA
A100-SXM4-80GB.  Queries are embedded with BAAI/bge-large-en-v1.5 (335M parameters, float16), scored by exact
inner product against every chunk of the archive (a float16 [N, 1024] matrix on the GPU: 2 KiB per chunk),
and the top 200 re-ranked with BAAI/bge-reranker-v2-m3 (568M parameters, float16).  New articles are
chunked and embedded by the ingestion job and appended every hour:

    torch.cuda.set_per_process_memory_fraction(0.45)      # config.yaml: gpu_memory_fraction: 0.45
    ...
    def append(self, new_embs):                              # every hour, ~10k new chunks
        self.index = torch.cat([self.index, new_embs.to("cuda", torch.float16)])
        torch.cuda.empty_cache()                             # give the old copy back

The cap came with the service's config from staging, where the card is shared with a nightly fine-tuning job; in
production the only other process on the card is a small OCR service of the same team (9.5 GiB).  At launch the
archive was 2M chunks (3.8 GiB); ingestion adds ~240k chunks a day.  On day 30, at 03:00, the hourly append failed:
torch.cat asked for a 17.2 GiB matrix beside the old 17.1 GiB one, which would have taken PyTorch's reservation
past 36 GiB, 0.45 of the card -- on a GPU with 51 GiB free.

An expert: the refusal is PyTorch's own cap (set_per_process_memory_fraction(0.45)), not the card: raise it to what
this card can give (or remove it) and the append fits again -- for four more weeks while torch.cat doubles the
index, about three months without that.  Then stop doubling the index at every append (torch.cat needs the old and
the new copy at once: preallocate capacity and write new rows into it), and for a corpus that grows without end
plan a compressed or host-memory index (IVF-PQ, or faiss on the CPU).  Wrong first: a smaller query batch,
quantizing or offloading the two encoders (1.7 GiB of the 36), expandable_segments or empty_cache (the loop already
returns the old copy; the cap counts what is reserved), stopping the OCR service (its 9.5 GiB is not what refused
the request), a bigger GPU (this one is more than half free), restarting.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

F16 = torch.float16
GiB = float(1 << 30)
DIM = 1024


# ---- stand-in gap: torch.cat (a C function in PyTorch): a new tensor of the summed size on the device,
# compiled as part of torch's file so that the failing line stays the program's.
_CAT = """
def cat(tensors, dim=0):
    n = sum(t.nbytes for t in tensors)
    out = torch.empty(n // 2, dtype=tensors[0].dtype, device="cuda")
    return out
"""
if not hasattr(torch, "cat"):
    _ns = {"torch": torch}
    exec(compile(_CAT, torch.__file__, "exec"), _ns)
    torch.cat = _ns["cat"]
# ----


def _weights(n_params):
    return torch.nn.Parameter(torch.empty(n_params, dtype=F16, device="cuda"), requires_grad=False)


class XLMRobertaEncoder(torch.nn.Module):
    def __init__(self, n_params):
        torch.nn.Module.__init__(self)
        self.embeddings = _weights(n_params // 5)
        self.encoder = _weights(n_params - n_params // 5)

    def forward(self, batch, seq):
        h = torch.empty(batch * seq * DIM, dtype=F16, device="cuda")
        ff = torch.empty(batch * seq * 4096, dtype=F16, device="cuda")
        del ff
        return torch.empty(batch * DIM, dtype=F16, device="cuda")


class SearchService(object):
    def __init__(self, n_chunks):
        self.embedder = XLMRobertaEncoder(335_000_000).eval()      # BAAI/bge-large-en-v1.5
        self.reranker = XLMRobertaEncoder(568_000_000).eval()      # BAAI/bge-reranker-v2-m3
        self.index = torch.empty(n_chunks * DIM, dtype=F16, device="cuda")
        self.n = n_chunks

    def search(self, queries):
        with torch.inference_mode():
            q = self.embedder(queries, 64)
            scores = torch.empty(queries * self.n, dtype=F16, device="cuda")   # q @ index.T
            del scores
            pairs = self.reranker(queries * 200, 512)
            del q, pairs

    def append(self, new_chunks):
        new_embs = torch.empty(new_chunks * DIM, dtype=F16, device="cuda")     # from the ingestion job
        self.index = torch.cat([self.index, new_embs])
        self.n += new_chunks
        del new_embs
        torch.cuda.empty_cache()                                                # give the old copy back


_when = {}


def main():
    torch.cuda.set_per_process_memory_fraction(0.45)      # config.yaml: gpu_memory_fraction: 0.45
    svc = SearchService(2_000_000)
    print("encoders %.2f GiB, index %d chunks %.2f GiB, cap %.1f GiB" % (
        (svc.embedder.encoder.nbytes + svc.embedder.embeddings.nbytes + svc.reranker.encoder.nbytes
         + svc.reranker.embeddings.nbytes) / GiB, svc.n, svc.index.nbytes / GiB,
        0.45 * torch.cuda.mem_get_info()[1] / GiB))
    for day in range(1, 61):
        for hour in range(24):
            _when.update(day=day, hour=hour)
            svc.search(queries=2)
            svc.append(10_000)
        free, total = torch.cuda.mem_get_info()
        if day % 4 == 0:
            print("day %d: %d chunks, index %.2f GiB, reserved %.2f GiB, card free %.2f GiB" % (
                day, svc.n, svc.index.nbytes / GiB, torch.cuda.memory_reserved() / GiB, free / GiB))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    print("failed on day %(day)d at %(hour)02d:00" % _when, file=sys.stderr)
    raise
sys.exit(0)
