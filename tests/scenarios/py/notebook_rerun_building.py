"""A Jupyter session fine-tuning a language model (fp32, AdamW) on a 24 GiB card.  The training cell:

    model = LM(config).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    train(model, opt, steps=1000)

The user interrupts it at step 20 (Kernel > Interrupt), changes the learning rate and runs the cell
again.  The interrupted train() frame lives on in the kernel's last traceback (sys.last_traceback),
and with it the first model, its gradients, its AdamW state and half a forward pass (~20 GiB); the
re-run fails while it builds the new model, its parameters of many sizes (run with plain
`LD_PRELOAD=liboomguard.so`).  An expert: the first run's objects are still alive: restart the
kernel, or del model, opt, clear the traceback, gc.collect(), empty_cache(); not a smaller batch,
not quantization, not another GPU.
"""
import sys
import traceback

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class Block(torch.nn.Module):
    def __init__(self, i):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty((96, 160, 288, 480)[i % 4] * MiB, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(((i % 3) + 1) * MiB, device="cuda"))


class LM(torch.nn.Module):
    def __init__(self, n=16):
        torch.nn.Module.__init__(self)
        for i in range(n):
            setattr(self, "block%d" % i, Block(i))
        self.n = n

    def forward(self, x):
        h = x
        for _ in range(self.n):
            a = torch.empty(256 * MiB, device="cuda")    # saved for backward
            a._saved = h
            h = a
        return h


steps = [0]


def train(model, opt, n):
    for _ in range(n):
        x = torch.empty(8 * MiB, device="cuda")
        h = model(x)
        steps[0] += 1
        if steps[0] == 20:
            raise KeyboardInterrupt                      # Kernel > Interrupt, inside the 20th step
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(model.parameters())
        scen_truth.backward(loss)
        opt.step()
        opt.zero_grad(set_to_none=False)                 # zeroed in place: the gradients stay allocated
        del loss, h, x


CELL = """
model = LM().cuda()
opt = torch.optim.AdamW(model.parameters(), lr=lr)
train(model, opt, 1000)
"""


def run_cell(source, user_ns):
    """What IPython does with a cell: run it in the user namespace; on an exception, show the
    traceback and keep it as sys.last_type/last_value/last_traceback (for %debug)."""
    try:
        exec(compile(source, "<ipython-input-3>", "exec"), user_ns)
    except KeyboardInterrupt:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        traceback.print_exc(limit=1)


user_ns = {"torch": torch, "LM": LM, "train": train, "lr": 1e-4}
try:
    run_cell(CELL, user_ns)                              # interrupted at step 20
    user_ns["lr"] = 5e-5                                 # edited and run again
    run_cell(CELL, user_ns)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
