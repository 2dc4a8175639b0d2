"""train_video.py -- action recognition on a 24 GiB card, a VideoMAE-B-sized model (fp32, AdamW,
16-frame clips at 224 px, batch 24) fed by an NVIDIA DALI pipeline in the same process (GPU video
decoding and augmentation).  The project's launcher caps PyTorch at half the card "to leave room
for DALI", a number guessed when the pipeline was first written:

    pipe = video_pipeline(batch_size=24, num_threads=8, device_id=0, prefetch_queue_depth=8)
    pipe.build()                                            # DALI's own buffers: 2.5 GiB, cudaMalloc
    torch.cuda.set_per_process_memory_fraction(0.5)         # train.yaml: torch_memory_fraction: 0.5
    model = VideoMAEForVideoClassification.from_pretrained(ckpt).cuda()   # 1 GiB
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for data in DALIGenericIterator(pipe, ["clips", "labels"]):
        loss = criterion(model(data[0]["clips"]), data[0]["labels"]); loss.backward(); ...

The first forward needs 12 GiB of activations on top of the weights; PyTorch refuses past its
12 GiB allowance, with ~9 GiB of the card free and the rest held by this process itself (DALI's
2.5 GiB, the CUDA context).  No other process is on the GPU.  The step needs ~15 GiB in all, which
the card has once DALI's real 2.5 GiB are set aside.  An expert: raise the cap to what DALI
actually leaves (0.85 or so; or drop it); not a smaller batch first, no other process to stop, not
DALI's memory (it is small and needed).
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class DALIPipeline(object):
    def __init__(self, batch_size, prefetch_queue_depth):
        self.lib = ctypes.CDLL(os.environ["SCEN_DALI"])
        self.lib.dali_pipeline_build.argtypes = [ctypes.c_int, ctypes.c_size_t]
        self.depth = prefetch_queue_depth

    def build(self):
        if self.lib.dali_pipeline_build(self.depth, 320 * MiB) != 0:          # decoded clips, 8 x 320 MiB
            raise RuntimeError("DALI: CUDA allocation failed")


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.qkv = torch.nn.Parameter(torch.empty(27 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(54 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(384 * MiB, device="cuda")       # attention over 1568 tokens x 12 heads, saved
        a._saved = h
        m = torch.empty(640 * MiB, device="cuda")       # MLP activations, saved
        m._saved = a
        return m


class VideoMAEForVideoClassification(torch.nn.Module):
    def __init__(self, depth=12):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(52 * MiB, device="cuda"))
        self.blocks = [Block() for _ in range(depth)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, clips):
        h = clips
        for b in self.blocks:
            h = b(h)
        logits = torch.empty(512, device="cuda")
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def main():
    pipe = DALIPipeline(batch_size=24, prefetch_queue_depth=8)
    pipe.build()
    torch.cuda.set_per_process_memory_fraction(0.5)
    model = VideoMAEForVideoClassification.from_pretrained("MCG-NJU/videomae-base").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for step in range(10000):
        clips = torch.empty(24 * 16 * 3 * 224 * 224 * 4, device="cuda")    # DALI's output as a tensor
        loss = model(clips)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        del loss, clips


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
