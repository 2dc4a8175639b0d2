"""A training job on the stand-in torch that fails with every role of memory alive, and jobs that
fail in each phase.  python3 job_roles.py MODE OUT.json; OUT.json gets the truth the dump must
show: the bytes of each role as the stand-in's allocator holds them (its blocks, to the byte), the
named holders, and the phase with the line that decides it.

  roles     a model (parameters, a buffer) after one AdamW step (gradients, optimizer state), a
            view of a weight kept in a global list (still the weight's bytes), the losses kept in a
            global list, a dict cache on a Trainer object, the output of a captured CUDA graph (a
            private pool), then a forward pass whose activation is alive when a request fails
  roles-uncaught   the same, the error not caught (the stderr summary is printed)
  forward | backward | step | load | handler: the failure in that phase
  placement a statement that reads a copy of the model on cuda:1 makes its tensor on the current device, cuda:0
            (SIMGPU_DEVICES=2)
  restored  shards torch.load restored onto the GPU (no map_location) held in a list, one more loaded to the host,
            then a request larger than the device
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import jobkit  # noqa: E402
from jobkit import MiB, here  # noqa: E402

import torch  # noqa: E402

mode = jobkit.mode
_seen = set()
truth = {"roles": {}, "holders": {}, "phase": None, "phase_file": None, "phase_line": None,
         "phase_function": None, "site_line": None, "site_function": None}
HUGE = 64 << 30          # more than the simulated device has: fails at once


def block(t):
    """The allocator block behind a tensor's storage: what the allocator counts for it."""
    return t._root()._block.size


def add(role, *tensors):
    for t in tensors:
        r = t._root()
        if id(r) in _seen:
            continue
        _seen.add(id(r))             # ids: the truth must not hold a tensor itself
        truth["roles"][role] = truth["roles"].get(role, 0) + block(t)


def phase_at(phase, line, function, file=None, site=None):
    """The frame that decides the phase, and the program's own line (event.phase_site): this file's
    `site` (line, function) when the deciding frame is the framework's, else that frame itself."""
    truth.update(phase=phase, phase_line=line, phase_function=function,
                 phase_file=file or os.path.abspath(__file__))
    truth.update(site_line=site[0] if site else line, site_function=site[1] if site else function)


class Net(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.w1 = torch.nn.Parameter(torch.empty(48 * MiB))
        self.w2 = torch.nn.Parameter(torch.empty(16 * MiB))
        self.register_buffer("running_mean", torch.empty(2 * MiB))
        self.act_size = 8 * MiB
        self.fail_size = 0

    def forward(self, x):
        h = torch.empty(self.act_size)          # an activation, alive in this frame
        if self.fail_size:
            phase_at("forward", here() + 1, "forward")
            torch.empty(self.fail_size)
        return h


class Trainer(object):
    def __init__(self):
        self.cache = {}


model = Net()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
add("parameters", model.w1, model.w2)
add("buffers", model.running_mean)


def train_step(x):
    out = model(x)
    out.backward()
    opt.step()
    truth.setdefault("after_steps", []).append(torch.cuda.memory_allocated())   # what the step hook reads
    return out


def main():
    x = torch.empty(1 * MiB)
    if mode in ("roles", "roles-uncaught"):
        train_step(x)
        add("gradients", model.w1.grad, model.w2.grad)
        for st in opt.state.values():
            add("optimizer_state", st["exp_avg"], st["exp_avg_sq"])
        views.append(model.w1.view(-1))          # a view: the weight's storage, counted once
        for _ in range(6):
            losses.append(torch.empty(1 * MiB))  # losses.append(loss) without .item()
        truth["losses_line"] = here() - 1
        trainer.cache["a"] = torch.empty(8 * MiB)
        trainer.cache["b"] = [torch.empty(4 * MiB), torch.empty(4 * MiB)]
        graph_out.append(torch.empty(6 * MiB, pool_id=(1, 1)))
        add("held_by_python", *losses)
        truth["holders"]["losses (list, global in job_roles.py)"] = sum(block(t) for t in losses)
        add("held_by_python", trainer.cache["a"], *trainer.cache["b"])
        truth["holders"]["self.cache (dict on Trainer)"] = block(trainer.cache["a"]) + \
            sum(block(t) for t in trainer.cache["b"])
        add("graph_pools", *graph_out)
        truth["activations"] = block(x) + model.act_size     # x here, h in forward (512-byte multiples)
        model.fail_size = HUGE
        if mode == "roles-uncaught":
            jobkit.write({"truth": truth})
            model(x)                            # the job dies of it: the stderr summary is printed
        try:
            model(x)
        except torch.OutOfMemoryError:
            pass
    elif mode == "forward":
        model.fail_size = HUGE
        try:
            model(x)
        except torch.OutOfMemoryError:
            pass
    elif mode == "backward":
        out = model(x)
        big = torch.nn.Parameter(torch.empty(1100 * MiB))        # a frozen embedding of no module
        add("parameters", big)
        truth["activations"] = block(x) + model.act_size
        out._params = (big,) + tuple(model.parameters())
        phase_at("backward", None, "backward", "torch/autograd/__init__.py", site=(here() + 2, "main"))
        try:
            out.backward()
        except torch.OutOfMemoryError:
            pass
    elif mode == "step":
        big = torch.nn.Parameter(torch.empty(700 * MiB))
        big.grad = torch.empty(1 * MiB)
        add("parameters", big)
        add("gradients", big.grad)
        opt2 = torch.optim.AdamW([big])
        phase_at("optimizer_step", None, "_update", "torch/optim/adamw.py", site=(here() + 2, "main"))
        try:
            opt2.step()                         # exp_avg + exp_avg_sq of 700 MiB each do not fit
        except torch.OutOfMemoryError:
            pass
    elif mode == "load":
        path = os.path.join(os.getcwd(), "ckpt.json")
        with open(path, "w") as f:
            f.write('{"w1": %d, "big": %d}' % (48 * MiB, HUGE))
        # the innermost frame of torch/serialization.py is the deserializer restoring the storage, as in PyTorch
        phase_at("loading", None, "_cuda_deserialize", "torch/serialization.py", site=(here() + 2, "main"))
        try:
            torch.load(path)                    # restores onto the GPU: no map_location="cpu"
        except torch.OutOfMemoryError:
            pass
    elif mode == "restored":
        paths = []
        for i in range(2):
            paths.append(os.path.join(os.getcwd(), "shard%d.json" % i))
            with open(paths[-1], "w") as f:
                f.write('{"feats": %d, "labels": %d}' % (96 * MiB, MiB))
        truth["restored_line"] = here() + 1
        shards = [torch.load(p) for p in paths]     # no map_location: back onto the GPU they were saved from
        host = torch.load(paths[0], map_location="cpu")                                 # noqa: F841
        add("held_by_python", *[t for s in shards for t in s.values()])
        phase_at(None, None, None, site=(here() + 4, "main"))     # no frame says a phase
        truth["holders"]["shards (list, local in main (job_roles.py:%d))" % truth["site_line"]] = \
            sum(block(t) for s in shards for t in s.values())
        try:
            torch.empty(HUGE)                        # a bank of all of them: more than the device
        except torch.OutOfMemoryError:
            pass
    elif mode == "placement":
        torch.cuda.set_device(1)
        replica = Net()                        # a second copy, on cuda:1: none of its tensors is this device's
        torch.cuda.set_device(0)
        phase_at(None, None, None, site=(here() + 2, "main"))
        try:
            cache = torch.empty(replica.fail_size or HUGE, device="cuda")   # the current device, not the replica's   # noqa: F841
        except torch.OutOfMemoryError:
            pass
    elif mode == "handler":
        try:
            torch.empty(HUGE)
        except torch.OutOfMemoryError:
            try:
                phase_at("oom_handler", here() + 1, "main")
                retry = torch.empty(HUGE // 2)  # the retry, still inside the handler   # noqa: F841
            except torch.OutOfMemoryError:
                pass
    jobkit.write({"truth": truth})


ballast = [[i] for i in range(int(os.environ.get("JOB_BALLAST", "0")))]   # Python objects for the budget
views = []
losses = []
graph_out = []
trainer = Trainer()
main()
