"""train_seg.py -- fine-tunes SegFormer-B5 on ADE20K on one L40S (48 GB, cc 8.9) with
torch.compile(mode="reduce-overhead") (CUDA graphs through cudagraph trees), bf16 autocast:

    model = torch.compile(SegformerForSemanticSegmentation.from_pretrained("nvidia/mit-b5", ...).cuda(),
                          mode="reduce-overhead")
    for epoch in range(160):
        model.train()
        for img, mask in train_loader:                 # random 640x640 crops, batch 8: one shape
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(pixel_values=img, labels=mask).loss
            loss.backward(); opt.step(); opt.zero_grad()
        model.eval()
        with torch.no_grad():
            for img, mask in val_loader:              # batch 1, short side 512, native aspect ratio
                logits = model(pixel_values=img).logits
                miou.update(logits.argmax(1).cpu(), mask)

Training has one input shape and runs flat for the whole first epoch: one graph, one private pool.
The validation images keep their aspect ratio (512 x 384..2048, any multiple of 32), so the compiled
model records a new CUDA graph for every new width -- each with its own private memory pool that
keeps that shape's activation workspace and static logits for the life of the process.  PyTorch
prints "recording a new graph for each distinct input size" warnings; about two dozen widths into the
first validation, recording the next one fails.

User: "OOM in validation, under no_grad, batch 1 -- training at batch 8 fits?"
An expert, first: too many captured shapes -- resize/pad the validation images to one or a few
fixed sizes (sliding-window inference at 512x512, as mmseg does), or run validation on the
uncompiled model / compile it without cudagraphs.  Wrong advice: a smaller batch (it is 1),
torch.inference_mode (autograd is already off), torch.cuda.empty_cache (it cannot release the
pools of live graphs), expandable_segments, a bigger GPU.
"""
import random
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class MixTransformerStage(torch.nn.Module):
    def __init__(self, mib):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(mib * MiB, device="cuda"))       # fp32 master


class SegformerB5(torch.nn.Module):
    """mit-b5 encoder + all-MLP decode head: 85M parameters, fp32."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, mib in enumerate((4, 22, 96, 198)):
            setattr(self, "stage%d" % i, MixTransformerStage(mib))
        self.decode_head = torch.nn.Parameter(torch.empty(14 * MiB, device="cuda"))


class CUDAGraphNode(object):
    """One recorded graph of cudagraph trees: its private pool and static outputs."""

    def __init__(self, pool, static_outputs):
        self.pool = pool
        self.static_outputs = static_outputs


class CompiledModule(object):
    """torch.compile(model, mode="reduce-overhead"): one recorded graph per (mode, input shape)."""

    def __init__(self, model):
        self.model = model
        self.graphs = {}

    def _record(self, key, activations, outputs, saved=0):
        pool = (1, len(self.graphs) + 1)
        work = torch.empty(activations, device="cuda", pool_id=pool)           # warm-up + capture
        keep = torch.empty(saved, device="cuda", pool_id=pool) if saved else None
        del work
        outs = [torch.empty(outputs, device="cuda", pool_id=pool)]
        if keep is not None:
            outs.append(keep)
        self.graphs[key] = CUDAGraphNode(pool, outs)

    def train_step(self, batch, h, w):
        key = ("train", batch, h, w)
        if key not in self.graphs:
            px = batch * h * w
            # forward + backward graphs: saved activations (bf16) and the backward's workspace
            self._record(key, activations=px * 1800, outputs=512, saved=px * 1500)
        loss = torch.empty(512, device="cuda")
        loss._params = tuple(self.model.parameters())
        return loss

    def infer(self, h, w):
        key = ("eval", 1, h, w)
        if key not in self.graphs:
            px = h * w
            self._record(key, activations=px * 2900, outputs=150 * (px // 16) * 4)
        return self.graphs[key].static_outputs[0]


def main():
    model = SegformerB5()
    compiled = CompiledModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-5)
    rng = random.Random(160)
    val_sizes = [(512, 32 * rng.randint(12, 64)) for _ in range(2000)]
    for epoch in range(160):
        model.train()
        for it in range(2526):                               # 20210 images / batch 8
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = compiled.train_step(8, 640, 640)
            scen_truth.backward(loss)
            opt.step()
            opt.zero_grad(set_to_none=True)
            del loss
        model.eval()
        with torch.no_grad():
            for h, w in val_sizes:
                logits = compiled.infer(h, w)
                pred = torch.empty(h * w // 16 * 8, device="cuda")    # logits.argmax(1)
                del pred, logits


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
