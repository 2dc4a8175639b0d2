"""eval_autoattack.py -- a robustness group's evaluation of their adversarially trained ConvNeXt-B (ImageNet,
Linf eps=4/255, the recipe of Liu et al. 2023, 89M parameters, 0.33 GiB in float32) with AutoAttack's standard
version (APGD-CE, APGD-T, FAB-T, Square) on the 5000-image ImageNet subset RobustBench uses, on the group's
Tesla V100-SXM2-16GB.  The script follows the RobustBench README, plus one line someone added "so AutoAttack
doesn't copy every batch from the host":

    model = convnext_base_robust().to(device).eval()
    x_test, y_test = load_imagenet(n_examples=args.n_ex, data_dir=args.data_dir)   # CPU tensors
    x_test, y_test = x_test.to(device), y_test.to(device)                         # <- the added line
    adversary = AutoAttack(model, norm="Linf", eps=4 / 255, version="standard", device=device)
    x_adv = adversary.run_standard_evaluation(x_test, y_test, bs=args.bs)

bs=50 was chosen on a smoke test with --n_ex 1000, which ran fine.  The full run (--n_ex 5000) computes the
clean accuracy (no_grad, batches of 50), then dies at the first forward pass of APGD-CE, on its first batch of
50 images.  Memory at that moment: the whole test set on the GPU, 5000 x 3 x 224 x 224 float32 = 2.80 GiB, and
AutoAttack's `x_adv = x_orig.clone().detach()` -- a clone on x_orig's device, so another 2.80 GiB; the
weights 0.33 GiB; the CUDA context; and the attack's forward pass, whose activations for 50 images with
autograd on (APGD needs the gradient w.r.t. the input) are about 10.6 GiB.  With 1000 images the two copies
were 1.1 GiB, which is why the smoke test passed.

An expert: keep x_test / y_test on the CPU.  AutoAttack moves each batch to `device` itself
(`x_orig[idcs].clone().to(self.device)`) and keeps x_adv on x_orig's device, so the two 2.8 GiB copies
disappear from the GPU at no cost in speed that matters (a 30 MB copy per batch against seconds of attack
iterations), and the same bs=50 fits with about 4 GiB to spare.
Wrong first advice: inference_mode / no_grad (the attack needs gradients w.r.t. the input: run_standard_evaluation
already runs under no_grad and APGD re-enables grad for its own forward; forcing it off either errors or, worse,
makes a gradient-free "attack" that overstates robust accuracy); mixed precision (float16 attacks
under-estimate gradients -- gradient masking -- and are not what the leaderboard reports); quantization (a
different model from the one being evaluated); expandable_segments / empty_cache (nothing is fragmented: the
memory is live tensors); a bigger GPU.  A smaller bs would also fit, but the batch was right; the test set
is what grew.
"""
import sys
import time

import torch

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps.  (1) Tensor arithmetic (C in PyTorch): a new tensor the size of the larger operand; an
# output that autograd records keeps its operands' graph alive, as PyTorch's grad_fn chain does.  Compiled as
# part of torch's file so the failing line stays the program's.
_TENSOR_OPS = """
def _graph_of(t):
    s = getattr(t, "_saved", None)
    if s is None:
        return ()
    return tuple(s) if isinstance(s, (list, tuple)) else (s,)


def _arith(a, b, saves_operands):
    ts = [t for t in (a, b) if isinstance(t, Tensor)]
    big = max(ts, key=lambda t: t.nbytes)
    out = empty(big.nbytes, device=big.device)
    out._dtype = big.dtype
    if is_grad_enabled() and any(t.requires_grad or t._params for t in ts):
        out._saved = tuple(ts)
    return _derive(out, *ts)


Tensor.__add__ = Tensor.__radd__ = lambda a, b: _arith(a, b, False)
Tensor.__sub__ = Tensor.__rsub__ = lambda a, b: _arith(a, b, False)
Tensor.__mul__ = Tensor.__rmul__ = lambda a, b: _arith(a, b, True)
Tensor.__truediv__ = lambda a, b: _arith(a, b, True)
"""
exec(compile(_TENSOR_OPS, torch.__file__, "exec"), torch.__dict__)

# (2) torch.autograd.grad: PyTorch's caller waits while the engine's device thread (no Python frame of the
# program) walks the part of the graph between the outputs and the inputs, one gradient per saved activation
# (kept, as the new graph's saved tensors, with create_graph=True), then hands back the inputs' gradients.
_ENGINE_GRAD = """
def _flat(s):
    if s is None:
        return ()
    return tuple(s) if isinstance(s, (list, tuple)) else (s,)


def _needed(outs, ins):
    # the part of the graph between outs and ins (tensors whose saved inputs lead to an input), and the
    # activations those nodes saved
    stop = set(id(t) for t in ins)
    memo = {}
    order, todo = [], list(outs)
    while todo:                                  # post-order without recursion: a graph can be deep
        t = todo.pop()
        if isinstance(t, tuple):
            order.append(t[1])
            continue
        if id(t) in memo or id(t) in stop:
            continue
        memo[id(t)] = False
        todo.append((0, t))
        for s in _flat(getattr(t, "_saved", None)):
            if isinstance(s, torch.Tensor) and id(s) not in memo:
                todo.append(s)
    for t in order:
        memo[id(t)] = any(isinstance(s, torch.Tensor) and (id(s) in stop or memo.get(id(s), False))
                          for s in _flat(getattr(t, "_saved", None)))
    walked = [t for t in order if memo[id(t)]]
    acts, seen, tuples = [], set(), set()
    for t in walked:
        s = getattr(t, "_saved", None)
        if id(s) in tuples:
            continue
        tuples.add(id(s))
        for a in _flat(s):
            if isinstance(a, torch.Tensor) and getattr(a, "_act", False) and id(a) not in seen:
                seen.add(id(a))
                acts.append(a)
    return walked, acts


def run_grad(outs, ins, create_graph, box, done):
    _tls.engine = True
    try:
        walked, acts = _needed(outs, ins)
        box["walked"] = walked
        kept, prev = [], None
        for a in acts:
            g = torch.empty(a.nbytes, device=a.device)
            if create_graph:
                g._act = True
                kept.append(g)
            else:
                prev = g
        prev = None
        grads = [torch.empty(x.nbytes, device=x.device) for x in ins]
        if create_graph:
            graph = tuple(kept) + tuple(outs)
            for g in grads:
                g._saved = graph
                torch._derive(g, *outs)
        box["grads"] = grads
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
"""
from torch.autograd import _engine  # noqa: E402

exec(compile(_ENGINE_GRAD, _engine.__file__, "exec"), _engine.__dict__)

_AUTOGRAD_GRAD = """
def grad(outputs, inputs, grad_outputs=None, retain_graph=None, create_graph=False, only_inputs=True,
         allow_unused=None, is_grads_batched=False, materialize_grads=False):
    import _thread
    from torch.autograd import _engine
    outs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    ins = list(inputs) if isinstance(inputs, (list, tuple)) else [inputs]
    for i, r in enumerate(outs):
        if not r.requires_grad and r.grad_fn is None:
            raise RuntimeError("element %d of tensors does not require grad and does not have a grad_fn" % i)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_engine.run_grad, (outs, ins, bool(create_graph), box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]
    if not (retain_graph or create_graph):
        for t in box["walked"]:
            t._saved = None
    return tuple(box["grads"])
"""
import torch.autograd  # noqa: E402

exec(compile(_AUTOGRAD_GRAD, torch.autograd.__file__, "exec"), torch.autograd.__dict__)
# (3) torch.enable_grad (torch/autograd/grad_mode.py in PyTorch), and fancy indexing of a batch out of a tensor
# (Tensor.__getitem__ with an index tensor: a gathered copy on the same device).
_GRAD_MODE = """
class enable_grad(object):
    def __enter__(self):
        self._prev = is_grad_enabled()
        _grad.enabled = True

    def __exit__(self, *exc):
        _grad.enabled = self._prev
        return False


def _index_rows(self, rows, row_bytes):
    out = empty(len(rows) * row_bytes, device=self.device)
    out._dtype = self.dtype
    return out
"""
exec(compile(_GRAD_MODE, torch.__file__, "exec"), torch.__dict__)
# ----

GiB = float(1 << 30)
IMG = 3 * 224 * 224            # one ImageNet image, float32 elements


class Block(torch.nn.Module):
    """ConvNeXt block: 7x7 depthwise conv, LayerNorm, Linear(C, 4C), GELU, Linear(4C, C), layer scale, residual."""

    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.dim = dim
        self.weight = torch.nn.Parameter(torch.empty(dim * 49 + 2 * dim + 8 * dim * dim + 5 * dim + 4 * dim,
                                                     dtype=torch.float32, device="cuda"))

    def forward(self, x, n, hw, saved):
        c = self.dim
        for mult in (1, 1, 4, 4, 1, 1):        # dwconv, norm, pwconv1, act, pwconv2, gamma * x + shortcut
            y = torch.empty(n * mult * c * hw * hw, dtype=torch.float32, device=x.device)
            if torch.is_grad_enabled():
                y._act = True
                saved.append(y)
            x = y
        return x


class ConvNeXtB(torch.nn.Module):
    """timm convnext_base (depths 3-3-27-3, dims 128-256-512-1024) behind RobustBench's ImageNet normalization."""
    DEPTHS = (3, 3, 27, 3)
    DIMS = (128, 256, 512, 1024)

    def __init__(self, num_classes=1000):
        torch.nn.Module.__init__(self)
        self.stem = torch.nn.Parameter(torch.empty(3 * 128 * 16 + 3 * 128, dtype=torch.float32, device="cuda"))
        blocks = []
        for s, (d, c) in enumerate(zip(self.DEPTHS, self.DIMS)):
            for i in range(d):
                b = Block(c)
                setattr(self, "stage%d_block%d" % (s, i), b)
                blocks.append(b)
            if s < 3:
                setattr(self, "down%d" % s, torch.nn.Parameter(torch.empty(
                    2 * c + c * 2 * c * 4 + 2 * c, dtype=torch.float32, device="cuda")))
        self.blocks = blocks
        self.head = torch.nn.Parameter(torch.empty(2 * 1024 + 1024 * num_classes + num_classes,
                                                   dtype=torch.float32, device="cuda"))

    def forward(self, x):
        n = x.nbytes // (IMG * 4)
        saved = []
        hw = 56
        h = torch.empty(n * 128 * hw * hw, dtype=torch.float32, device=x.device)   # stem: 4x4/4 conv + LN
        if torch.is_grad_enabled():
            h._act = True
            saved.append(h)
        k = 0
        for s, (d, c) in enumerate(zip(self.DEPTHS, self.DIMS)):
            for i in range(d):
                h = self.blocks[k](h, n, hw, saved)
                k += 1
            if s < 3:
                hw //= 2
                h = torch.empty(n * self.DIMS[s + 1] * hw * hw, dtype=torch.float32, device=x.device)
                if torch.is_grad_enabled():
                    h._act = True
                    saved.append(h)
        logits = torch.empty(n * 1000, dtype=torch.float32, device=x.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (x,)
        return logits


def convnext_base_robust():
    """robustbench.utils.load_model("Liu2023Comprehensive_ConvNeXt-B", dataset="imagenet", threat_model="Linf")
    -- here the group's own checkpoint of the same recipe; built on the CPU, moved with .to(device)."""
    return ConvNeXtB()


def load_imagenet(n_examples, data_dir):
    """robustbench.data.load_imagenet: the first n_examples of the 5000-image subset, resized and center-cropped
    to 224, as CPU float tensors (x: [n, 3, 224, 224], y: [n])."""
    return ("cpu", n_examples), ("cpu", n_examples)


def to_device(host, device):
    """Tensor.to(device) of a host tensor: one device tensor of the same size."""
    kind, n = host
    return torch.empty(n * IMG, dtype=torch.float32, device=device) if kind == "cpu" else host


# ---- autoattack (fra31/auto-attack), as far as this run goes: AutoAttack.run_standard_evaluation and APGD.
class APGDAttack(object):
    def __init__(self, predict, n_iter=100, norm="Linf", n_restarts=1, eps=None, seed=0, loss="ce",
                 eot_iter=1, rho=.75, device=None):
        self.model = predict
        self.n_iter = n_iter
        self.eps = eps
        self.norm = norm
        self.n_restarts = n_restarts
        self.loss = loss
        self.eot_iter = eot_iter
        self.device = device

    def attack_single_run(self, x, y, x_init=None):
        t = torch.empty_like(x)                     # 2 * torch.rand(x.shape) - 1
        x_adv = torch.empty_like(x)                 # x + self.eps * t / t.abs().max(...)
        x_best = x_adv.clone()
        x_best_adv = x_adv.clone()
        del t
        x_adv.requires_grad_()
        grad = torch.empty_like(x)                  # torch.zeros_like(x)
        for _ in range(self.eot_iter):
            with torch.enable_grad():
                logits = self.model(x_adv)
                loss_indiv = torch.nn.functional.cross_entropy(logits, y, reduction="none")
                loss = loss_indiv                   # loss_indiv.sum()
            grad_curr = torch.autograd.grad(loss, [x_adv])[0].detach()
            del grad_curr
        # ... n_iter steps of momentum + step-size schedule (each: forward, grad, projection)
        return x_best, x_best_adv

    def perturb(self, x, y=None):
        adv = x.clone()
        for counter in range(self.n_restarts):
            best_curr, adv_curr = self.attack_single_run(x, y)
            adv = adv_curr
        return adv


class AutoAttack(object):
    def __init__(self, model, norm="Linf", eps=.3, seed=None, verbose=True, attacks_to_run=[], version="standard",
                 is_tf_model=False, device="cuda", log_path=None):
        self.model = model
        self.norm = norm
        self.eps = eps
        self.device = device
        self.attacks_to_run = ["apgd-ce", "apgd-t", "fab-t", "square"] if version == "standard" else attacks_to_run
        self.apgd = APGDAttack(self.model, n_restarts=1, n_iter=100, eps=self.eps, norm=self.norm, device=device)

    def get_logits(self, x):
        return self.model(x)

    def run_standard_evaluation(self, x_orig, y_orig, bs=250, return_labels=False, state_path=None):
        n_ex = x_orig.nbytes // (IMG * 4)
        print("using standard version including %s." % ", ".join(self.attacks_to_run))
        with torch.no_grad():
            # calculate accuracy
            n_batches = (n_ex + bs - 1) // bs
            robust_flags = torch.empty(n_ex, device=x_orig.device)          # torch.zeros(..., torch.bool)
            y_adv = torch.empty_like(y_orig)
            for batch_idx in range(n_batches):
                start_idx = batch_idx * bs
                end_idx = min((batch_idx + 1) * bs, n_ex)
                x = torch._index_rows(x_orig, range(start_idx, end_idx), IMG * 4).clone()   # .to(self.device)
                output = self.get_logits(x)
                del x, output
            print("initial accuracy: 71.96%")
            x_adv = x_orig.clone().detach()
            startt = time.time()
            for attack in self.attacks_to_run:
                num_robust = int(n_ex * 0.7196)
                n_batches = (num_robust + bs - 1) // bs
                robust_lin_idcs = torch.empty(num_robust * 8, device=x_orig.device)   # torch.nonzero(robust_flags)
                for batch_idx in range(n_batches):
                    start_idx = batch_idx * bs
                    end_idx = min((batch_idx + 1) * bs, num_robust)
                    x = torch._index_rows(x_orig, range(start_idx, end_idx), IMG * 4).clone()   # .to(self.device)
                    y = torch.empty((end_idx - start_idx) * 8, device=x_orig.device)
                    if attack == "apgd-ce":
                        self.apgd.loss = "ce"
                        adv_curr = self.apgd.perturb(x, y)
                    # ... apgd-t (9 target classes), fab-t, square; robust_flags / x_adv updated per batch
                print("robust accuracy after %s: ..." % attack.upper())
        return x_adv


def main():
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--n_ex", type=int, default=5000)
    parser.add_argument("--bs", type=int, default=50)
    parser.add_argument("--data_dir", default="/datasets/imagenet")
    parser.add_argument("--eps", type=float, default=4.0 / 255)
    args = parser.parse_args()
    device = "cuda"

    model = convnext_base_robust().to(device).eval()
    x_test, y_test = load_imagenet(n_examples=args.n_ex, data_dir=args.data_dir)
    x_test, y_test = to_device(x_test, device), torch.empty(args.n_ex * 8, device=device)   # .to(device)
    print("x_test on %s: %.2f GiB" % (device, x_test.nbytes / GiB))
    adversary = AutoAttack(model, norm="Linf", eps=args.eps, version="standard", device=device)
    x_adv = adversary.run_standard_evaluation(x_test, y_test, bs=args.bs)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
