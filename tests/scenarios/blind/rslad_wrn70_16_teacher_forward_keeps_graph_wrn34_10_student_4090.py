"""rslad_train.py -- robust distillation (RSLAD, Zi et al. 2021) on CIFAR-10 into a WideResNet-34-10 student
(46.2M parameters), batch 128, SGD momentum 0.9, 10-step PGD-KL inner attack, on the lab's RTX 4090 (24 GB).
The loop is the RSLAD repository's (rslad_train.py); the repository's setting (a TRADES WRN-34-10 teacher
distilled into ResNet-18) trained fine on this card.  For the paper's main table the student swapped in the
strongest RobustBench teacher, Gowal2021Improving_70_16_ddpm_100m (WRN-70-16 with Swish, 266.9M parameters,
0.99 GiB in float32), and a WRN-34-10 student:

    teacher = load_model("Gowal2021Improving_70_16_ddpm_100m", dataset="cifar10", threat_model="Linf").cuda()
    teacher.eval()
    for step, (train_batch_data, train_batch_labels) in enumerate(trainloader):
        student.train()
        train_batch_data, train_batch_labels = train_batch_data.cuda(), train_batch_labels.cuda()
        teacher_logits = teacher(train_batch_data)
        adv_logits = rslad_inner_loss(student, teacher_logits, train_batch_data, train_batch_labels,
                                      optimizer, step_size=2/255.0, epsilon=epsilon, perturb_steps=10)
        student.train()
        nat_logits = student(train_batch_data)                     # <- dies here, first batch
        kl_Loss1 = kl_loss(F.log_softmax(adv_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1))
        kl_Loss2 = kl_loss(F.log_softmax(nat_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1))
        loss = 5/6.0 * torch.mean(torch.sum(kl_Loss1, dim=1)) + 1/6.0 * torch.mean(torch.sum(kl_Loss2, dim=1))
        loss.backward()
        optimizer.step()

The first batch dies in the student's forward on the natural images, after the inner attack.  The teacher
forward runs with autograd on (eval() changes BatchNorm, not autograd; load_model's parameters require grad), so
it records its graph and saves every activation for a backward that never comes: 128 images through WRN-70-16
(33 pre-activation blocks, six saved maps each) keep 14.4 GiB alive, and `teacher_logits` holds that graph for
the whole step -- the .detach() in the loss only stops gradients into the teacher, and the attack's
torch.autograd.grad(loss_kl, [x_adv]) does not free the teacher branch either (it does not lead to x_adv).  On
top: the teacher and student weights (1.16 GiB), the student's adversarial forward (4.1 GiB, kept for the
loss), and the natural forward, which runs out of room in its last group of blocks.

An expert: compute the teacher's soft labels under torch.no_grad() (and teacher.requires_grad_(False)); the
teacher forward then needs only a few transient maps, the step peaks near 10.5 GiB and leaves 13 GiB spare.
Wrong first advice: a smaller batch (would fit, at half the throughput and a changed recipe, while 14 GiB go to
a graph nobody uses); gradient checkpointing or mixed precision for the student (the waste is not in the
student); inference_mode for the failing forward (it is the student's training forward); detaching or .item()
of the losses (they are needed); expandable_segments / empty_cache (live tensors, nothing cached); a bigger
GPU; quantizing the teacher (changes the soft labels the method distills).
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
# (3) torch.enable_grad (torch/autograd/grad_mode.py in PyTorch), torch.sum / torch.mean over a tensor (a
# scalar; its graph kept), torch.softmax-like elementwise functions (an output of the input's size), as
# PyTorch's C functions make them.
_MORE = """
class enable_grad(object):
    def __enter__(self):
        self._prev = is_grad_enabled()
        _grad.enabled = True

    def __exit__(self, *exc):
        _grad.enabled = self._prev
        return False


def _reduce(t, *args, **kw):
    out = empty(512, device=t.device)
    if is_grad_enabled() and (t.requires_grad or t._params):
        out._saved = _graph_of(t)
    return _derive(out, t)


sum = _reduce
mean = _reduce


def _like(t, saves):
    out = empty(t.nbytes, device=t.device)
    out._dtype = t.dtype
    if is_grad_enabled() and (t.requires_grad or t._params):
        out._saved = (t,) if saves else _graph_of(t)
    return _derive(out, t)
"""
exec(compile(_MORE, torch.__file__, "exec"), torch.__dict__)

_F_MORE = """
def softmax(input, dim=None, dtype=None):
    return torch._like(input, True)


def kl_div(input, target, size_average=None, reduce=None, reduction="mean", log_target=False):
    out = torch.empty(input.nbytes if reduction == "none" else 512, device=input.device)
    if torch.is_grad_enabled():
        out._saved = (input, target)
    return derive(out, input, target)
"""
exec(compile(_F_MORE, F.__file__, "exec"), F.__dict__)
# (4) Tensor.backward as PyTorch runs it: the engine makes the leaves' gradients (the stand-in's autograd), then,
# without retain_graph, the graph's saved tensors are freed.
_BACKWARD = """
def _backward_then_free(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    from torch import autograd
    autograd.backward(self, gradient, retain_graph, create_graph, inputs=inputs)
    if retain_graph or create_graph:
        return
    todo, seen = [self], set()
    while todo:
        t = todo.pop()
        if id(t) in seen:
            continue
        seen.add(id(t))
        s = getattr(t, "_saved", None)
        if s is None:
            continue
        for u in (s if isinstance(s, (list, tuple)) else (s,)):
            if isinstance(u, Tensor):
                todo.append(u)
        if not t.requires_grad:
            t._saved = None


Tensor.backward = _backward_then_free
"""
exec(compile(_BACKWARD, torch.__file__, "exec"), torch.__dict__)
# ----

GiB = float(1 << 30)
IMG = 3 * 32 * 32


class WideResNet(torch.nn.Module):
    """A CIFAR WideResNet-depth-width (pre-activation blocks: BN, activation, 3x3 conv, BN, activation, 3x3 conv;
    three groups at 32x32, 16x16, 8x8).  Each block saves `per_block` maps of its width for backward."""

    def __init__(self, depth, width, n_params, per_block):
        torch.nn.Module.__init__(self)
        self.n = (depth - 4) // 6
        self.widths = (16 * width, 32 * width, 64 * width)
        self.per_block = per_block
        self.groups = []
        left = n_params
        for g in range(3):
            n = left // (3 - g)
            p = torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
            setattr(self, "block%d" % (g + 1), p)
            self.groups.append(p)
            left -= n

    def forward(self, x):
        n = x.nbytes // (IMG * 4)
        saved = []
        h = torch.empty(n * 16 * 32 * 32, dtype=torch.float32, device=x.device)   # conv1
        for g, (c, hw) in enumerate(zip(self.widths, (32, 16, 8))):
            for b in range(self.n):
                for _ in range(self.per_block):
                    y = torch.empty(n * c * hw * hw, dtype=torch.float32, device=x.device)
                    if torch.is_grad_enabled():
                        y._act = True
                        saved.append(y)
                    h = y
        logits = torch.empty(n * 10, dtype=torch.float32, device=x.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (x,) + tuple(self.groups)
        return logits


def load_model(model_name, dataset="cifar10", threat_model="Linf"):
    """robustbench.utils.load_model: the DMWideResNet(depth=70, width=16, activation_fn=Swish) of Gowal et al.
    2021, 266.9M parameters, in eval mode, parameters requiring grad as nn.Module makes them."""
    m = WideResNet(70, 16, 266_872_394, per_block=6)
    return m.eval()


def cifar10_batches(batch_size):
    """torchvision CIFAR10 through a DataLoader (RandomCrop(32, 4), RandomHorizontalFlip, ToTensor)."""
    while True:
        yield ("cpu", batch_size), ("cpu", batch_size)


def to_cuda(host, elems, itemsize=4):
    return torch.empty(host[1] * elems * itemsize, device="cuda")


def rslad_inner_loss(model, teacher_logits, x_natural, y, optimizer, step_size=0.003, epsilon=0.031,
                     perturb_steps=10, beta=6.0):
    criterion_kl = lambda a, b: F.kl_div(a, b, reduction="none")     # nn.KLDivLoss(size_average=False, reduce=False)
    model.eval()
    x_adv = x_natural.detach() + 0.001 * torch.empty_like(x_natural)  # torch.randn(x_natural.shape).cuda().detach()
    for _ in range(perturb_steps):
        x_adv.requires_grad_()
        with torch.enable_grad():
            loss_kl = criterion_kl(F.log_softmax(model(x_adv), dim=1), F.softmax(teacher_logits, dim=1))
            loss_kl = torch.sum(loss_kl)
        grad = torch.autograd.grad(loss_kl, [x_adv])[0]
        x_adv = x_adv.detach() + step_size * grad.detach()            # torch.sign(grad.detach())
        x_adv = x_adv.detach()                                        # min/max projection, clamp(0, 1)
    model.train()
    x_adv = x_adv.detach()                                            # Variable(torch.clamp(x_adv, 0, 1))
    optimizer.zero_grad()
    logits = model(x_adv)
    return logits


def main():
    epochs, bs, epsilon = 300, 128, 8 / 255.0
    student = WideResNet(34, 10, 46_160_474, per_block=6).cuda()
    teacher = load_model("Gowal2021Improving_70_16_ddpm_100m", dataset="cifar10", threat_model="Linf").cuda()
    teacher.eval()
    optimizer = torch.optim.SGD(student.parameters(), lr=0.1, momentum=0.9, weight_decay=2e-4)
    kl_loss = lambda a, b: F.kl_div(a, b, reduction="none")
    trainloader = cifar10_batches(bs)
    for epoch in range(1, epochs + 1):
        for step, (train_batch_data, train_batch_labels) in enumerate(trainloader):
            student.train()
            train_batch_data = to_cuda(train_batch_data, IMG)
            train_batch_labels = to_cuda(train_batch_labels, 1, 8)
            teacher_logits = teacher(train_batch_data)
            print("epoch %d step %d: teacher forward done, allocated %.2f GiB" % (
                epoch, step, torch.cuda.memory_allocated() / GiB))
            adv_logits = rslad_inner_loss(student, teacher_logits, train_batch_data, train_batch_labels,
                                          optimizer, step_size=2 / 255.0, epsilon=epsilon, perturb_steps=10)
            student.train()
            nat_logits = student(train_batch_data)
            kl_Loss1 = kl_loss(F.log_softmax(adv_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1))
            kl_Loss2 = kl_loss(F.log_softmax(nat_logits, dim=1), F.softmax(teacher_logits.detach(), dim=1))
            loss = 5 / 6.0 * torch.mean(torch.sum(kl_Loss1, dim=1)) + 1 / 6.0 * torch.mean(torch.sum(kl_Loss2, dim=1))
            loss.backward()
            optimizer.step()
            print("epoch %d step %d: loss done, allocated %.2f GiB" % (epoch, step,
                                                                       torch.cuda.memory_allocated() / GiB))
            if step == 1:
                return


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
