"""index_archive.py -- visual document retrieval over a company's PDF archive (contracts, technical
manuals, scanned invoice bundles: ~6,000 PDFs, ~85 pages each) with ColPali v1.2 (PaliGemma-3B based,
bf16) on a cloud L4 (24 GB), run as a one-off batch job with plain
`LD_PRELOAD=liboomguard.so python index_archive.py`.

The engineer adapted the colpali-engine README example, but kept one tensor per PDF (for per-document MaxSim
scoring later) and dropped the `.to("cpu")` of the example "because scoring will be on the GPU anyway":

    model = ColPali.from_pretrained("vidore/colpali-v1.2", torch_dtype=torch.bfloat16, device_map="cuda").eval()
    processor = ColPaliProcessor.from_pretrained("vidore/colpali-v1.2")
    doc_embeddings = {}                                   # pdf path -> (pages x 1030, 128) bf16, ON THE GPU
    for path in pdf_paths:
        pages = convert_from_path(path, dpi=100)           # PIL images
        page_embs = []
        for i in range(0, len(pages), 16):
            batch = processor.process_images(pages[i:i + 16]).to(model.device)
            with torch.no_grad():
                page_embs.extend(torch.unbind(model(**batch)))   # 16 x (1030, 128)
        doc_embeddings[path] = torch.cat(page_embs)

Every page becomes 1030 vectors of 128 bf16 values (1024 image patches + the prompt tokens): 257.5 KiB a page,
~21 MiB for an 85-page PDF -- small per document, but none is ever moved off the card.  The weights take
5.4 GiB; each 16-page forward pass needs ~1.1 GiB of transient activations under no_grad (eager attention
scores alone 518 MiB).  After 777 PDFs (15.8 GiB of kept embeddings, one entry per PDF in the dict) a forward
pass no longer finds room and fails, asking for 518 MiB with 100 MiB free.  Memory rises one document at a
time from the start; nothing else grows.

What an expert says first: the index is kept on the GPU -- move each document's embeddings to host memory as it
is made (`.to("cpu")`, as the example does; or write them to disk / a vector store) and bring candidate sets
to the GPU only for scoring.  Wrong: smaller batch (the 16-page batch is not the problem, the dict is),
expandable_segments / empty_cache (the 0.6 GiB cached between the forward's temporaries is not the problem;
16 GiB are live tensors), quantizing the model (saves ~3 GiB once, the dict takes it back after ~140 more
PDFs), gradient checkpointing or inference_mode (it already runs under no_grad; no gradients exist), a bigger
GPU (the archive keeps growing).
"""
import random
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
BF16 = 2
TOKENS = 1030               # 1024 image patches + prompt tokens, per page
DIM = 128


class ColPali(nn.Module):
    """ColPali v1.2: SigLIP-So400m vision tower (448 px, 1024 patches), Gemma-2B decoder (18 layers, 2048 hidden,
    MLP 16384), a 128-d projection; 2.92 B parameters in bf16 (5.4 GiB).  The stand-in computes nothing: under
    no_grad each layer's temporaries are freed as soon as the next one has run."""

    def __init__(self):
        nn.Module.__init__(self)
        self.vision_tower = nn.Parameter(torch.empty(428 * 1000 * 1000, dtype=torch.bfloat16, device="cuda"))
        self.multi_modal_projector = nn.Parameter(torch.empty(2 * 1000 * 1000, dtype=torch.bfloat16, device="cuda"))
        self.embed_tokens = nn.Parameter(torch.empty(525 * 1000 * 1000, dtype=torch.bfloat16, device="cuda"))
        self.decoder = nn.Parameter(torch.empty(1964 * 1000 * 1000, dtype=torch.bfloat16, device="cuda"))
        self.custom_text_proj = nn.Parameter(torch.empty(2048 * DIM, dtype=torch.bfloat16, device="cuda"))

    def forward(self, pixel_values, pages):
        vis = torch.empty(pages * 1024 * 1152 * BF16, device="cuda")          # SigLIP hidden states
        mlp = torch.empty(pages * 1024 * 4304 * BF16, device="cuda")          # a SigLIP MLP
        del mlp
        hidden = torch.empty(pages * TOKENS * 2048 * BF16, device="cuda")     # Gemma hidden states
        del vis
        scores = torch.empty(pages * 8 * TOKENS * TOKENS * 4, device="cuda")  # eager attention, fp32 softmax
        del scores
        mlp = torch.empty(pages * TOKENS * 16384 * BF16, device="cuda")       # Gemma MLP (gate * up)
        del mlp
        out = torch.empty(pages * TOKENS * DIM, dtype=torch.bfloat16, device="cuda")   # custom_text_proj, normalised
        del hidden
        return out


def unbind(t, n):
    """torch.unbind(t): n views of t's storage (each keeps the whole batch's storage alive)."""
    return [t.view() for _ in range(n)]


def cat(tensors):
    """torch.cat of the pages' (1030, 128) views: a new (pages x 1030, 128) bf16 tensor."""
    out = torch.empty(len(tensors) * TOKENS * DIM, dtype=torch.bfloat16, device="cuda")
    return out


def main():
    rng = random.Random(7)
    model = ColPali().eval()
    scen_truth.note_every_empty(torch)
    pdf_paths = ["archive/%05d.pdf" % i for i in range(6000)]
    doc_embeddings = {}
    for n, path in enumerate(pdf_paths):
        n_pages = rng.choice((8, 24, 48, 48, 64, 80, 96, 120, 160, 200))   # convert_from_path(path, dpi=100)
        page_embs = []
        try:
            for i in range(0, n_pages, 16):
                pages = min(16, n_pages - i)
                pixel_values = torch.empty(pages * 3 * 448 * 448 * BF16, device="cuda")   # processor(...).to(cuda)
                with torch.no_grad():
                    page_embs.extend(unbind(model(pixel_values, pages), pages))
                del pixel_values
            doc_embeddings[path] = cat(page_embs)
        except torch.OutOfMemoryError:
            scen_truth.torch_oom_mark()
            raise
        del page_embs
        if n % 100 == 0:
            print("indexed %d PDFs, %.1f GiB allocated" % (n, torch.cuda.memory_allocated() / 2 ** 30))
    return 0


if __name__ == "__main__":
    sys.exit(main())
