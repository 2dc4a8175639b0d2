"""A Jupyter session fine-tuning a latent-diffusion UNet (860M parameters, fp32, AdamW) on a 24 GiB
card.  The training cell:

    unet = UNet2DConditionModel.from_pretrained(base, subfolder="unet").cuda()
    opt = torch.optim.AdamW(unet.parameters(), lr=lr)
    train(unet, opt, loader, steps=2000)

The user interrupts the cell (Kernel > Interrupt) at step 25 to change the learning rate, edits lr
and runs the same cell again.  The interrupted train() frame lives on in the kernel's last
traceback (sys.last_traceback, for %debug), and with it the old UNet, its gradients, its AdamW
state and the activations of the interrupted forward (~16 GiB).  The re-run loads a second UNet
(3.2 GiB) and fails in its first forward.  Nothing is wrong with the model or the batch: the first
run's objects are still alive.  An expert: restart the kernel (or del unet, opt; clear the
traceback (%reset / sys.last_traceback = None); gc.collect(); torch.cuda.empty_cache()) before
re-running; not quantization, not a smaller batch, not another GPU.
"""
import sys
import time
import traceback
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class ResnetAttnBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(256 * MiB, device="cuda")        # saved for backward
        a._saved = h
        return a


class UNet2DConditionModel(torch.nn.Module):
    def __init__(self, n_blocks=25):
        torch.nn.Module.__init__(self)
        self.blocks = [ResnetAttnBlock() for _ in range(n_blocks)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    @classmethod
    def from_pretrained(cls, path, subfolder=None):
        return cls()

    def forward(self, latents, t, text_emb):
        h = latents
        for b in self.blocks:
            h = b(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


class KernelInterrupt(object):
    """Kernel > Interrupt: SIGINT lands in the training loop at step 25, inside a forward."""
    steps = 0

    @classmethod
    def tick(cls):
        cls.steps += 1
        if cls.steps == 25 * 25 + 12:
            raise KeyboardInterrupt


def train(unet, opt, loader_steps):
    for step in range(loader_steps):
        latents = torch.empty(8 * 4 * 64 * 64 * 4, device="cuda")
        h = latents
        for b in unet.blocks:
            h = b(h)
            KernelInterrupt.tick()
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(unet.parameters())
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=True)
        del loss, h, latents


CELL = """
unet = UNet2DConditionModel.from_pretrained(base, subfolder="unet").cuda()
opt = torch.optim.AdamW(unet.parameters(), lr=lr)
train(unet, opt, 2000)
"""


def run_cell(source, user_ns):
    """What IPython does with a cell: run it in the user namespace; on an exception, show the
    traceback and keep it as sys.last_type/last_value/last_traceback (for %debug)."""
    try:
        exec(compile(source, "<ipython-input-7>", "exec"), user_ns)
    except KeyboardInterrupt:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        traceback.print_exc(limit=1)


user_ns = {"torch": torch, "UNet2DConditionModel": UNet2DConditionModel, "train": train,
           "base": "runwayml/sd-base", "lr": 1e-5}
try:
    run_cell(CELL, user_ns)                      # interrupted at step 25
    time.sleep(0.05)
    user_ns["lr"] = 5e-6                         # the user edits the cell and runs it again
    run_cell(CELL, user_ns)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
