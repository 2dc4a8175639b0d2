"""DDPM on 128x128 faces: every 50 kimg the trainer spawns a fire-and-forget FID evaluator process on the same
GPU; each one runs for ~35 minutes, longer than the 4-5 minutes between evaluations, so they pile up until the
trainer's own next training step no longer fits.

The real code (train_ddpm.py, one RTX A5000 24GB workstation, improved-diffusion style UNet, ~100M parameters,
batch 64, fp16 autocast + GradScaler, AdamW, an EMA copy on the GPU):

    ctx = mp.get_context("spawn")
    results_q = ctx.Queue()
    ...
    if kimg_done >= next_eval_kimg:                   # every 50 kimg, ~4-5 minutes
        torch.save(ema.state_dict(), "ckpt/ema_latest.pt")
        torch.cuda.empty_cache()                      # "make room for the evaluator"
        p = ctx.Process(target=fid_worker, args=("ckpt/ema_latest.pt", step, results_q), daemon=True)
        p.start()                                     # never joined: training must not stall 35 minutes
        msg = results_q.get()                         # wait for "sampling started": a broken eval script fails
                                                      # early, and ema_latest.pt is not overwritten under it

    def fid_worker(ckpt, step, q):                    # in the child: its own CUDA context on cuda:0
        unet = UNetModel(...).cuda(); state = torch.load(ckpt); unet.load_state_dict(state)
        inception = InceptionV3FID().cuda()
        with torch.inference_mode():
            for b in range(50):                       # 10k samples, 200 per batch, DDIM-50, PNGs for clean-fid
                imgs = ddim_sample(unet, batch=200); feats.append(inception(imgs)); save_png_batch(imgs)
        q.put(("fid", step, compute_fid(feats)))

The arithmetic (24564 MiB card):
  trainer: context 0.5 GiB; weights 0.39 + EMA 0.39 + gradients 0.39 (zeroed in place, kept) + AdamW 0.77 GiB
           = 1.93 GiB; batch-64 fp16 activations ~13.6 GiB: ~16.1 GiB while it trains, ~2.5 GiB right after
           its empty_cache()
  each FID child: context 0.5 GiB + a UNet and its torch.load'ed state dict (restored onto cuda:0, where it was
           saved) 0.77 GiB + InceptionV3 0.09 GiB + DDIM buffers of a 200-sample batch under inference_mode
           (~2 GiB cached): ~3.4 GiB, for ~35 minutes
  eval 1: training resumes at ~19.5 GiB; eval 2: ~22.9 GiB, still fits;
  eval 3: 2.5 + 3 x 3.4 = 12.7 GiB before the trainer's next forward needs its ~13.6 GiB of activations back:
  the trainer dies in the forward pass on a 1.25 GiB up-path activation with 0.73 GiB free.

What an expert says first: three FID processes of this very job (children of the trainer) hold ~10.2 GiB of the
card; evaluations are launched faster than they finish.  Keep at most one evaluation in flight (join or skip
while the previous one runs), or evaluate in-process on a schedule, or put the evaluator on another GPU / lower
its sample batch.  The trainer's memory itself did not change.
Wrong advice: expandable_segments / empty_cache (the trainer already empties its cache, which is what lets the
children take its room), a smaller training batch or gradient checkpointing first (the children keep coming),
mixed precision (already fp16 autocast), inference_mode (the trainer trains).
"""
import multiprocessing as mp
import os
import time

import torch
from torch import nn

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
IMAGE_SIZE = 128
BATCH_SIZE = 64
EVAL_EVERY_KIMG = 50
FID_NUM_SAMPLES = 10000
FID_BATCH = 200
CKPT_DIR = os.environ.get("DDPM_CKPT_DIR", "/tmp/ddpm_faces_ckpt")
LEVELS = [  # (channels, resolution, res blocks per level) of the improved-diffusion 128x128 config
    (128, 128, 3), (256, 64, 3), (384, 32, 3), (512, 16, 3),
]


class ResBlock(nn.Module):
    def __init__(self, ch, res, up=False):
        nn.Module.__init__(self)
        self.ch, self.res, self.up = ch, res, up
        c_in = ch * 2 if up else ch
        # in_layers (GroupNorm, SiLU, conv3x3), emb_layers (SiLU, linear), out_layers (GroupNorm, SiLU, conv3x3)
        self.in_layers = nn.Parameter(torch.empty((c_in * ch * 9 + 2 * c_in) * 4, device="cuda"))
        self.emb_layers = nn.Parameter(torch.empty(512 * ch * 2 * 4, device="cuda"))
        self.out_layers = nn.Parameter(torch.empty((ch * ch * 9 + 2 * ch) * 4, device="cuda"))

    def forward(self, h, emb, batch):
        w1, we, w2 = self.in_layers, self.emb_layers, self.out_layers
        # what autograd keeps of the block for backward: the norms' and convs' outputs, fp16 under autocast
        # (the concatenated skip connection of the up path doubles the first); under inference_mode only
        # the block's output survives it
        act = batch * self.ch * self.res * self.res * 2
        saved = act * (5 if self.up else 3) if torch.is_grad_enabled() else act
        out = torch.empty(saved, device="cuda")
        out._dtype = torch.float16
        if torch.is_grad_enabled():
            out._saved = h
        return out


class AttentionBlock(nn.Module):
    def __init__(self, ch, res, heads=4):
        nn.Module.__init__(self)
        self.ch, self.res, self.heads = ch, res, heads
        self.qkv = nn.Parameter(torch.empty(ch * ch * 3 * 4, device="cuda"))
        self.proj_out = nn.Parameter(torch.empty(ch * ch * 4, device="cuda"))

    def forward(self, h, batch):
        w1, w2 = self.qkv, self.proj_out
        tokens = self.res * self.res
        qkv = torch.empty(batch * tokens * self.ch * 3 * 2, device="cuda")
        weights = torch.empty(batch * self.heads * tokens * tokens * 2, device="cuda")
        out = torch.empty(batch * tokens * self.ch * 2, device="cuda")
        if torch.is_grad_enabled():
            qkv._saved, weights._saved, out._saved = h, qkv, weights
        return out


class UNetModel(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.time_embed = nn.Parameter(torch.empty((128 * 512 + 512 * 512) * 4, device="cuda"))
        self.input_conv = nn.Parameter(torch.empty(3 * 128 * 9 * 4, device="cuda"))
        self.input_blocks = nn.Module()
        self.output_blocks = nn.Module()
        i = 0
        for ch, res, n in LEVELS:
            for _ in range(n):
                setattr(self.input_blocks, str(i), ResBlock(ch, res))
                i += 1
        self.middle_res1 = ResBlock(512, 16)
        self.middle_attn = AttentionBlock(512, 16)
        self.middle_res2 = ResBlock(512, 16)
        i = 0
        for ch, res, n in reversed(LEVELS):
            for _ in range(n + 1):
                setattr(self.output_blocks, str(i), ResBlock(ch, res, up=True))
                i += 1
        self.out_conv = nn.Parameter(torch.empty(128 * 3 * 9 * 4, device="cuda"))

    def forward(self, x, timesteps):
        batch = x.nbytes // (3 * IMAGE_SIZE * IMAGE_SIZE * 4)
        emb = self.time_embed
        w = self.input_conv
        h = torch.empty(batch * 128 * IMAGE_SIZE * IMAGE_SIZE * 2, device="cuda")
        if torch.is_grad_enabled():
            h._saved = x
        for blk in self.input_blocks._modules.values():
            h = blk(h, emb, batch)
        h = self.middle_res1(h, emb, batch)
        h = self.middle_attn(h, batch)
        h = self.middle_res2(h, emb, batch)
        for blk in self.output_blocks._modules.values():
            h = blk(h, emb, batch)
        w = self.out_conv
        eps = torch.empty(x.nbytes, device="cuda")
        if torch.is_grad_enabled():
            eps._saved = h
        return eps


class InceptionV3FID(nn.Module):
    """pt_inception-2015-12-05 (the FID network), 23.8M parameters."""

    def __init__(self):
        nn.Module.__init__(self)
        self.blocks = nn.Parameter(torch.empty(23_800_000 * 4, device="cuda"))

    def forward(self, images):
        w = self.blocks
        feats = torch.empty(images.nbytes // (3 * IMAGE_SIZE * IMAGE_SIZE * 4) * 2048 * 4, device="cuda")
        return feats


def mse_loss(eps, noise):
    """F.mse_loss(eps, noise): a scalar in eps's graph (the stand-in's nll_loss makes the same)."""
    return nn.functional.nll_loss(eps, noise)


def zero_grad(params):
    """improved-diffusion's zero_grad: the gradients are zeroed in place and kept (no set_to_none)."""
    for p in params:
        if p.grad is not None:
            pass   # p.grad.detach_(); p.grad.zero_()


def save_png_batch(images, out_dir):
    """Write the batch as PNGs for clean-fid: the host-side work of a sampling batch (and the time the
    DDIM loop takes on a GPU the trainer is using too)."""
    time.sleep(6.0)


def ddim_sample(unet, batch):
    x = torch.empty(batch * 3 * IMAGE_SIZE * IMAGE_SIZE * 4, device="cuda")
    for t in range(50):
        eps = unet(x, t)
        x_next = torch.empty(x.nbytes, device="cuda")
        del eps
        x = x_next
    return x


def fid_worker(ckpt_path, step, results_q):
    """Runs in the spawned child: its own CUDA context on cuda:0 (the same card as the trainer)."""
    trainer_pid = os.getppid()
    unet = UNetModel()
    state = torch.load(ckpt_path)            # saved from the GPU: restored onto cuda:0
    unet.load_state_dict(state)
    inception = InceptionV3FID()
    feats = []
    with torch.inference_mode():
        for b in range(FID_NUM_SAMPLES // FID_BATCH):
            imgs = ddim_sample(unet, FID_BATCH)
            feats.append(inception(imgs))
            if b == 0:
                results_q.put(("started", step, os.getpid()))
            save_png_batch(imgs, os.path.join(CKPT_DIR, "samples_%d" % step))
            if os.getppid() != trainer_pid:          # the trainer is gone: nobody will read the FID
                return
    results_q.put(("fid", step, 0.0))


class FacesLoader(object):
    """ImageFolder(FFHQ-128) DataLoader, batches moved to the GPU by the training loop."""

    def __iter__(self):
        while True:
            yield torch.empty(BATCH_SIZE * 3 * IMAGE_SIZE * IMAGE_SIZE * 4, device="cuda")


def main():
    os.makedirs(CKPT_DIR, exist_ok=True)
    ctx = mp.get_context("spawn")
    results_q = ctx.Queue()
    model = UNetModel()
    ema = UNetModel()                       # EMA copy kept on the GPU, as improved-diffusion does
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    scaler = torch.cuda.amp.GradScaler()
    evaluators = []
    kimg_done, next_eval_kimg, step = 0.0, EVAL_EVERY_KIMG, 0
    for x_start in FacesLoader():
        t = step % 1000
        noise = torch.empty(x_start.nbytes, device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            x_t = torch.empty(x_start.nbytes, device="cuda")
            eps = model(x_t, t)
            loss = mse_loss(eps, noise)
        scen_truth.backward(scaler.scale(loss))      # scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        zero_grad(model.parameters())
        del eps, loss, x_t, noise
        step += 1
        kimg_done += BATCH_SIZE / 1000.0
        if kimg_done >= next_eval_kimg:
            path = os.path.join(CKPT_DIR, "ema_latest.pt")
            torch.save(ema.state_dict(), path)
            torch.cuda.empty_cache()        # make room for the evaluator
            p = ctx.Process(target=fid_worker, args=(path, step, results_q), daemon=True)
            p.start()
            evaluators.append(p)
            kind, at_step, pid = results_q.get()
            print("step %d: FID evaluator pid %d %s (%d evaluators alive)"
                  % (step, pid, kind, sum(e.is_alive() for e in evaluators)), flush=True)
            next_eval_kimg += EVAL_EVERY_KIMG


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
