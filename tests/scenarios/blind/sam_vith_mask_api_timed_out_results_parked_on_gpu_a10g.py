"""sam_api.py -- an internal segmentation API for a photo-editing product: Segment Anything ViT-H (636M
parameters, fp32, 2.4 GiB) on one A10G (24 GB), behind FastAPI.  A batching thread takes up to 4 queued images,
runs the image encoder and the mask decoder for every prompt of the request under torch.inference_mode(),
and parks each request's masks in a dict until its HTTP handler picks them up:

    class MaskService:
        def __init__(self):
            self.sam = sam_model_registry["vit_h"](checkpoint=...).cuda().eval()
            self.results = {}                                    # request id -> masks (on the GPU)
        @torch.inference_mode()
        def run_batch(self, reqs):
            emb = self.sam.image_encoder(stack([r.image for r in reqs]))
            for r, e in zip(reqs, emb):
                self.results[r.id] = self.sam.mask_decoder(e, r.prompts)  # [64, 1024, 1024] logits, fp32
    async def segment(req):                                      # the HTTP handler
        done = await wait_for(svc.ready(req.id), timeout=10)     # 504 on timeout ...
        return encode_png(svc.results.pop(req.id).cpu())         # ... and nothing pops that entry

Each result is 256 MiB of mask logits.  When a burst makes requests wait longer than the 10 s timeout, the
client gets a 504 but its masks stay in self.results forever.  After a few bursts in a morning the worker
dies with CUDA out of memory in the image encoder of an ordinary batch (a 1 GiB attention block): 80
abandoned results hold 20 GiB of the card.

An expert: the dict of parked results is the leak -- pop (or expire) the entry when the handler times out,
bound the dict with a TTL, or park results in host memory (.cpu() before storing).  Inference mode is already
on; a smaller batch, fp16, empty_cache or a bigger card only postpone it.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

IMG_BATCH = 4


class ImageEncoderViT(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        for i in range(32):                                   # 32 blocks, ~19.7M parameters each
            setattr(self, "block%d" % i, torch.nn.Parameter(torch.empty(75 * MiB, device="cuda")))
        self.neck = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    def forward(self, images):
        # windowed attention over 64x64 patch tokens, 1280 wide: the blocks' working set for 4 images
        tokens = torch.empty(IMG_BATCH * 64 * 64 * 1280 * 4, device="cuda")          # 80 MiB
        tokens._saved = images
        attn = torch.empty(IMG_BATCH * 16 * 4096 * 4096 * 4 // 4, device="cuda")      # global-attention block, 4 GiB
        attn._saved = tokens
        mlp = torch.empty(IMG_BATCH * 64 * 64 * 5120 * 4, device="cuda")             # 320 MiB
        mlp._saved = attn
        emb = torch.empty(IMG_BATCH * 256 * 64 * 64 * 4, device="cuda")              # 16 MiB
        return emb


class MaskDecoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.transformer = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))

    def forward(self, emb, prompts):
        return torch.empty(prompts * 1024 * 1024 * 4, device="cuda")                # upscaled mask logits


class Sam(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.image_encoder = ImageEncoderViT()
        self.prompt_encoder = torch.nn.Parameter(torch.empty(1 * MiB, device="cuda"))
        self.mask_decoder = MaskDecoder()


class Request(object):
    def __init__(self, rid, prompts):
        self.id, self.prompts = rid, prompts


class MaskService(object):
    def __init__(self):
        self.sam = Sam().cuda().eval()
        self.results = {}

    def run_batch(self, reqs):
        with torch.inference_mode():
            images = torch.empty(IMG_BATCH * 3 * 1024 * 1024 * 4, device="cuda")
            emb = self.sam.image_encoder(images)
            for r in reqs:
                self.results[r.id] = self.sam.mask_decoder(emb, r.prompts)


def main():
    svc = MaskService()
    # truth mark at the failure itself (test scaffolding)
    torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
    rid = 0
    for burst in range(1000):
        # a burst: 5 batches; the handlers of the last batch's requests already gave up (504)
        for b in range(5):
            reqs = []
            for _ in range(IMG_BATCH):
                rid += 1
                reqs.append(Request("req-%06d" % rid, 64))
            svc.run_batch(reqs)
            if b < 4:
                for r in reqs:                              # handler in time: pops and encodes its masks
                    svc.results.pop(r.id, None)
            # else: timed out, nobody pops


try:
    main()
except torch.OutOfMemoryError:
    raise                                   # marked by the observer above
sys.exit(0)
