"""explain_errors.py -- influence functions (Koh & Liang 2017) for the misclassified test images of a CIFAR-10
ResNet-18 (kuangliu's pytorch-cifar ResNet18, 11.2M parameters, 93.0% test accuracy), with the
pytorch_influence_functions package (nimarb) and its default config: recursion_depth 5000, r_averaging 1,
damp 0.01, scale 25.  The training loader has batch size 16 (the LiSSA estimate takes one training batch per
recursion step).  On a workstation's RTX A5000 (24 GB):

    config = ptif.get_default_config()
    config["gpu"], config["test_sample_num"], config["recursion_depth"] = 0, 1, 5000
    influences = ptif.calc_img_wise(config, model, trainloader, testloader)

which, per test image, estimates s_test = H^-1 grad L(z_test) with the package's LiSSA recursion:

    def s_test(z_test, t_test, model, z_loader, gpu=-1, damp=0.01, scale=25.0, recursion_depth=5000):
        v = grad_z(z_test, t_test, model, gpu)                    # grad(..., create_graph=True)
        h_estimate = v.copy()
        for i in range(recursion_depth):
            for x, t in z_loader:
                x, t = x.cuda(), t.cuda()
                y = model(x)
                loss = calc_loss(y, t)
                hv = hvp(loss, list(model.parameters()), h_estimate)
                h_estimate = [_v + (1 - damp) * _h_e - _hv / scale
                              for _v, _h_e, _hv in zip(v, h_estimate, hv)]
                break

    def hvp(y, w, v):
        first_grads = grad(y, w, retain_graph=True, create_graph=True)
        elemwise_products = 0
        for grad_elem, v_elem in zip(first_grads, v):
            elemwise_products += torch.sum(grad_elem * v_elem)
        return_grads = grad(elemwise_products, w, create_graph=True)
        return return_grads

The progress line slows down step by step and the job dies in the 6th recursion step of 5000, inside the second
torch.autograd.grad of hvp.  Before the loop the process holds under 0.1 GiB (the weights, the test gradient and
its graph); after steps 1..5 it holds 0.78, 1.89, 3.85, 7.51 and 14.6 GiB.

What holds the memory: `return_grads` is made with create_graph=True, so hv -- and h_estimate, built from it --
carries an autograd graph that reaches back through every earlier step (h_estimate_i depends on hv_{i-1}, which
depends on h_estimate_{i-1} ...).  Every step's forward activations and double-backward buffers stay alive, and
the next step's grad(elemwise_products, w, create_graph=True) differentiates through that whole history again,
recording an even larger graph: the memory roughly doubles per step.  A Hessian-vector product needs the graph
of the first grad only; the LiSSA state must be a plain tensor.

An expert: cut the graph every step -- the second grad without create_graph (hv = grad(elemwise_products, w)),
h_estimate = [h.detach() for h in ...], and v from grad_z detached (it needs no graph either).  Memory is then
flat: one batch's forward and double backward, under 0.5 GiB at the peak, for all 5000 steps.
Wrong first advice: a smaller training batch (the growth is per step, not per image: it buys one or two steps),
a bigger GPU (5000 steps of a doubling graph fit on no GPU), gradient checkpointing, mixed precision,
inference_mode / no_grad (the Hessian-vector product needs autograd), empty_cache / expandable_segments (the
memory is live graph), restarting the process.
"""
import sys

import torch
import torch.nn.functional as F

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
# (3) torch.sum of a tensor (a scalar; SumBackward saves no tensor, only the graph), and F.nll_loss /
# F.log_softmax with the graph kept as the stand-in's functions keep it.
_MORE = """
def _reduce(t, *args, **kw):
    out = empty(512, device=t.device)
    if is_grad_enabled() and (t.requires_grad or t._params):
        out._saved = _graph_of(t)
    return _derive(out, t)


sum = _reduce
"""
exec(compile(_MORE, torch.__file__, "exec"), torch.__dict__)
# ----

GiB = float(1 << 30)
IMG = 3 * 32 * 32
grad = torch.autograd.grad                     # from torch.autograd import grad


class ResNet18(torch.nn.Module):
    """kuangliu/pytorch-cifar ResNet18: 3x3 stem (64), four stages of two BasicBlocks (64/128/256/512 at
    32/16/8/4), 1x1 projection shortcuts, avg-pool, 10-way linear."""
    STAGES = ((64, 32), (128, 16), (256, 8), (512, 4))
    PARAMS = (1_856, 74_112, 74_112, 230_784, 295_680, 920_832, 1_181_184, 3_677_696, 4_720_640, 5_130 - 4_964 +
              (11_173_962 - 1_856 - 2 * 74_112 - 230_784 - 295_680 - 920_832 - 1_181_184 - 3_677_696 - 4_720_640
               - 166))

    def __init__(self):
        torch.nn.Module.__init__(self)
        for i, n in enumerate(self.PARAMS):
            setattr(self, "p%d" % i, torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda")))

    def forward(self, x):
        n = x.nbytes // (IMG * 4)
        saved = []
        # what each layer saves for backward, by BasicBlock: stem conv/BN (2 maps), then per block conv1, bn1,
        # relu, conv2, bn2, add+relu (6 maps), +1 for the projection shortcut of stages 2-4
        for c, hw, maps in ((64, 32, 2),) + tuple((c, hw, m) for c, hw in self.STAGES
                                                  for m in ((6, 6) if c == 64 else (8, 6))):
            y = torch.empty(n * maps * c * hw * hw, dtype=torch.float32, device=x.device)
            if torch.is_grad_enabled():
                y._act = True
                saved.append(y)
        logits = torch.empty(n * 10, dtype=torch.float32, device=x.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (x,) + tuple(self.parameters())
        return logits


def display_progress(text, current_step, last_step, enabled=True, fix_zero_start=True):
    print("%s[%d/%d] allocated %.2f GiB" % (text, current_step + 1, last_step,
                                            torch.cuda.memory_allocated() / GiB))


# ---- pytorch_influence_functions/influence_function.py
def s_test(z_test, t_test, model, z_loader, gpu=-1, damp=0.01, scale=25.0, recursion_depth=5000):
    v = grad_z(z_test, t_test, model, gpu)
    h_estimate = v.copy()
    for i in range(recursion_depth):
        for x, t in z_loader:
            if gpu >= 0:
                x, t = to_cuda(x, IMG * 4), to_cuda(t, 8)          # x.cuda(), t.cuda()
            y = model(x)
            loss = calc_loss(y, t)
            hv = hvp(loss, list(model.parameters()), h_estimate)
            # Recursively caclulate h_estimate
            h_estimate = [
                _v + (1 - damp) * _h_e - _hv / scale
                for _v, _h_e, _hv in zip(v, h_estimate, hv)]
            break
        display_progress("Calc. s_test recursions: ", i, recursion_depth)
    return h_estimate


def calc_loss(y, t):
    y = F.log_softmax(y)
    loss = F.nll_loss(y, t, reduction="mean")
    return loss


def grad_z(z, t, model, gpu=-1):
    model.eval()
    if gpu >= 0:
        z, t = to_cuda(z, IMG * 4), to_cuda(t, 8)
    y = model(z)
    loss = calc_loss(y, t)
    return list(grad(loss, list(model.parameters()), create_graph=True))


def hvp(y, w, v):
    if len(w) != len(v):
        raise (ValueError("w and v must have the same length."))
    # First backprop
    first_grads = grad(y, w, retain_graph=True, create_graph=True)
    # Elementwise products
    elemwise_products = 0
    for grad_elem, v_elem in zip(first_grads, v):
        elemwise_products += torch.sum(grad_elem * v_elem)
    # Second backprop
    return_grads = grad(elemwise_products, w, create_graph=True)
    return return_grads


# ---- pytorch_influence_functions/calc_influence_function.py (calc_img_wise -> calc_influence_single)
def calc_influence_single(model, train_loader, test_loader, test_id_num, gpu, recursion_depth, r, s_test_vec=None):
    z_test, t_test = test_loader.dataset[test_id_num]
    z_test, t_test = test_loader.collate_fn([z_test]), test_loader.collate_fn([t_test])
    if s_test_vec is None:
        s_test_vec = calc_s_test_single(model, z_test, t_test, train_loader, gpu, recursion_depth=recursion_depth,
                                        r=r)
    # ... then grad_z of every training image dotted with s_test_vec
    return s_test_vec


def calc_s_test_single(model, z_test, t_test, train_loader, gpu=-1, damp=0.01, scale=25, recursion_depth=5000,
                       r=1):
    s_test_vec_list = []
    for i in range(r):
        s_test_vec_list.append(s_test(z_test, t_test, model, train_loader, gpu=gpu, damp=damp, scale=scale,
                                      recursion_depth=recursion_depth))
    return s_test_vec_list[0]


def to_cuda(host, row_bytes):
    return torch.empty(host[1] * row_bytes, device="cuda")


class Loader(object):
    """torch.utils.data.DataLoader over CIFAR-10 (ToTensor + Normalize), shuffle=True."""

    def __init__(self, batch_size):
        self.batch_size = batch_size
        self.dataset = self
        self.collate_fn = lambda items: ("cpu", len(items))

    def __getitem__(self, i):
        return ("img", i)

    def __iter__(self):
        while True:
            yield ("cpu", self.batch_size), ("cpu", self.batch_size)


def main():
    config = {"outdir": "outdir", "seed": 42, "gpu": 0, "dataset": "CIFAR10", "num_classes": 10,
              "test_sample_num": 1, "test_start_index": 0, "recursion_depth": 5000, "r_averaging": 1,
              "scale": None, "damp": None, "calc_method": "img_wise", "log_filename": None}
    model = ResNet18().cuda()        # model.load_state_dict(torch.load("ckpt/resnet18_cifar10.pth")["net"])
    model.eval()
    trainloader, testloader = Loader(16), Loader(100)
    print("test image 0 (misclassified 'cat' -> 'dog'): estimating s_test, recursion_depth %d"
          % config["recursion_depth"])
    calc_influence_single(model, trainloader, testloader, test_id_num=0, gpu=config["gpu"],
                          recursion_depth=config["recursion_depth"], r=config["r_averaging"])


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
