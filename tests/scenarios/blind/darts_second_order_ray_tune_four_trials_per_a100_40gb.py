"""tune_darts.py -- a hyperparameter sweep over second-order DARTS search (quark0/darts train_search.py
--unrolled: 8 cells, 16 initial channels, batch 64, CIFAR-10 split 50/50 into train and search halves) with Ray
Tune on one A100-PCIE-40GB: 16 samples of (learning_rate, arch_learning_rate, weight_decay), the ASHA scheduler,
and a quarter of the GPU per trial "because one search only uses ~10 GB":

    tuner = tune.Tuner(
        tune.with_resources(train_darts, {"cpu": 4, "gpu": 0.25}),
        tune_config=tune.TuneConfig(num_samples=16, scheduler=ASHAScheduler(metric="valid_acc", mode="max")),
        param_space={"learning_rate": tune.loguniform(5e-3, 5e-2), "arch_learning_rate": tune.loguniform(1e-4, 1e-3),
                     "weight_decay": tune.loguniform(1e-4, 1e-3), "unrolled": True, "batch_size": 64})
    results = tuner.fit()

Ray places four trial processes on the one GPU (CUDA_VISIBLE_DEVICES=0 in each) and does not limit their memory:
a fractional GPU is only a scheduling label.  Each search peaks at about 10 GiB (the supernet's forward keeps
every candidate operation's output on all 14 edges of all 8 cells: 9.4 GiB of activations for 64 images) and
PyTorch's caching allocator keeps that peak reserved between steps, so nvidia-smi shows each trial (a python3
process) at about 10.6 GiB all the time.  Four of them need 42 GiB on a 40 GiB card.  Ray starts the first four
samples together; three reach their first architect step a little earlier and keep their peak reserved; the
fourth (this process) dies in its first architect step, in the supernet's first forward pass, with 7.7 GiB of
its own activations live and the three other trials holding 31.8 GiB of the GPU.  (With gpu=0.34 the same
sweep had run for a week; the fraction was lowered to finish it sooner.)

An expert: this trial's own memory (about 10 GiB at its peak) is fine; the GPU is oversubscribed by the sweep.
Go back to three trials per GPU (gpu=0.34, 32 GiB) or two, or cap max_concurrent_trials -- the trials on one
GPU must fit their peaks, not their averages.
Wrong first advice: a smaller batch or first-order DARTS for this trial (it changes the searched
hyperparameters and architecture of one sample of the sweep, and the next trial to start dies the same way);
killing "the other processes" (they are the sweep's own trials); expandable_segments / empty_cache (this
process holds live activations, nothing cached, and the rest of the card is the other three's); gradient
checkpointing, mixed precision, restarting the process, a bigger GPU.
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
# (3) Tensor.data / .sub as the architect uses them: a detached tensor of the same size.
_MORE = """
def _sub(self, eta, other):
    out = empty(self.nbytes, device=self.device)
    out._dtype = self.dtype
    return out


Tensor.sub = _sub
"""
exec(compile(_MORE, torch.__file__, "exec"), torch.__dict__)
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
PRIMITIVES = ["none", "max_pool_3x3", "avg_pool_3x3", "skip_connect", "sep_conv_3x3", "sep_conv_5x5",
              "dil_conv_3x3", "dil_conv_5x5"]
MAPS_PER_EDGE = 40       # the 8 candidates' outputs and their internals (sep_conv: 2x ReLU, dw, pw, BN), saved


class MixedOp(torch.nn.Module):
    def __init__(self, C, stride):
        torch.nn.Module.__init__(self)
        self.C, self.stride = C, stride
        # sep_conv_3x3/5x5 (2 x (dw + pw + BN)), dil_conv_3x3/5x5 (dw + pw + BN); affine=False BN
        self.weight = torch.nn.Parameter(torch.empty(2 * (9 * C + C * C) + 2 * (25 * C + C * C) + 9 * C + C * C
                                                     + 25 * C + C * C, dtype=torch.float32, device="cuda"))

    def forward(self, x, weights, n, hw, saved):
        out = None
        for _ in range(MAPS_PER_EDGE):       # sum(w * op(x) for w, op in zip(weights, self._ops))
            y = torch.empty(n * self.C * hw * hw, dtype=torch.float32, device=x.device)
            if torch.is_grad_enabled():
                y._act = True
                saved.append(y)
            out = y
        return out


class Cell(torch.nn.Module):
    def __init__(self, steps, multiplier, C, reduction):
        torch.nn.Module.__init__(self)
        self.reduction = reduction
        self.C = C
        self.ops = []
        for i in range(steps):
            for j in range(2 + i):
                op = MixedOp(C, 2 if reduction and j < 2 else 1)
                setattr(self, "op%d" % len(self.ops), op)
                self.ops.append(op)

    def forward(self, s0, s1, weights, n, hw, saved):
        states = [s0, s1]
        offset = 0
        for i in range(4):
            s = None
            for j, h in enumerate(states):
                s = self.ops[offset + j](h, weights, n, hw, saved)
            offset += len(states)
            states.append(s)
        out = torch.empty(n * 4 * self.C * hw * hw, dtype=torch.float32, device=s0.device)   # torch.cat
        if torch.is_grad_enabled():
            out._act = True
            saved.append(out)
        return out


class Network(torch.nn.Module):
    def __init__(self, C=16, num_classes=10, layers=8, criterion=None, steps=4, multiplier=4, stem_multiplier=3):
        torch.nn.Module.__init__(self)
        self._C, self._num_classes, self._layers = C, num_classes, layers
        self.stem = torch.nn.Parameter(torch.empty(3 * 48 * 9 + 2 * 48, dtype=torch.float32, device="cuda"))
        self.cells = []
        C_curr = C
        hw = 32
        self.plan = []
        for i in range(layers):
            reduction = i in [layers // 3, 2 * layers // 3]
            if reduction:
                C_curr *= 2
                hw //= 2
            cell = Cell(steps, multiplier, C_curr, reduction)
            setattr(self, "cell%d" % i, cell)
            self.cells.append(cell)
            self.plan.append((C_curr, hw))
        self.classifier = torch.nn.Parameter(torch.empty(C_curr * 4 * num_classes + num_classes,
                                                         dtype=torch.float32, device="cuda"))
        k = sum(1 for i in range(steps) for n in range(2 + i))
        self.alphas_normal = torch.empty(k * len(PRIMITIVES), dtype=torch.float32, device="cuda").requires_grad_()
        self.alphas_reduce = torch.empty(k * len(PRIMITIVES), dtype=torch.float32, device="cuda").requires_grad_()

    def new(self):
        model_new = Network(self._C, self._num_classes, self._layers)
        return model_new

    def arch_parameters(self):
        return [self.alphas_normal, self.alphas_reduce]

    def forward(self, input):
        n = input.nbytes // (3 * 32 * 32 * 4)
        saved = []
        s0 = s1 = torch.empty(n * 48 * 32 * 32, dtype=torch.float32, device=input.device)     # stem
        for cell, (c, hw) in zip(self.cells, self.plan):
            weights = self.alphas_reduce if cell.reduction else self.alphas_normal      # F.softmax(alphas, -1)
            s0, s1 = s1, cell(s0, s1, weights, n, hw, saved)
        logits = torch.empty(n * 10, dtype=torch.float32, device=input.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (input,) + tuple(self.parameters()) + tuple(self.arch_parameters())
        return torch._derive(logits, *self.arch_parameters())

    def _loss(self, input, target):
        logits = self(input)
        return F.cross_entropy(logits, target)


def _concat(xs):
    n = 0
    for x in xs:
        n += x.nbytes
    return torch.empty(n, device="cuda")


class Architect(object):
    def __init__(self, model, args):
        self.network_momentum = args["momentum"]
        self.network_weight_decay = args["weight_decay"]
        self.model = model
        self.optimizer = torch.optim.AdamW(self.model.arch_parameters(), lr=args["arch_learning_rate"],
                                           betas=(0.5, 0.999), weight_decay=args["arch_weight_decay"])

    def _compute_unrolled_model(self, input, target, eta, network_optimizer):
        loss = self.model._loss(input, target)
        theta = _concat(self.model.parameters())
        moment = torch.empty_like(theta)     # _concat(network_optimizer.state[v]['momentum_buffer'] ...)
        dtheta = _concat(torch.autograd.grad(loss, self.model.parameters()))
        unrolled_model = self._construct_model_from(theta.sub(eta, dtheta))
        return unrolled_model

    def step(self, input_train, target_train, input_valid, target_valid, eta, network_optimizer, unrolled):
        self.optimizer.zero_grad()
        if unrolled:
            self._backward_step_unrolled(input_train, target_train, input_valid, target_valid, eta,
                                         network_optimizer)
        self.optimizer.step()

    def _backward_step_unrolled(self, input_train, target_train, input_valid, target_valid, eta,
                                network_optimizer):
        unrolled_model = self._compute_unrolled_model(input_train, target_train, eta, network_optimizer)
        unrolled_loss = unrolled_model._loss(input_valid, target_valid)
        unrolled_loss.backward()
        # dalpha, vector = ...; implicit_grads = self._hessian_vector_product(vector, input_train, target_train)

    def _construct_model_from(self, theta):
        model_new = self.model.new()
        return model_new


def train_darts(config):
    """The Ray Tune trainable: train_search.py's main() with the sampled hyperparameters."""
    args = {"batch_size": config["batch_size"], "learning_rate": config["learning_rate"], "momentum": 0.9,
            "weight_decay": config["weight_decay"], "arch_learning_rate": config["arch_learning_rate"],
            "arch_weight_decay": 1e-3, "epochs": 50, "init_channels": 16, "layers": 8, "unrolled": config["unrolled"]}
    torch.cuda.set_device(0)
    model = Network(args["init_channels"], 10, args["layers"]).cuda()
    print("param size = %.6fMB" % (sum(p.nbytes for p in model.parameters()) / 4 / 1e6))
    optimizer = torch.optim.SGD(model.parameters(), args["learning_rate"], momentum=args["momentum"],
                                weight_decay=args["weight_decay"])
    architect = Architect(model, args)
    free, total = torch.cuda.mem_get_info()
    print("trial start: GPU free %.1f GiB of %.1f GiB" % (free / GiB, total / GiB))
    for epoch in range(args["epochs"]):
        for step in range(391):
            input = torch.empty(args["batch_size"] * 3 * 32 * 32 * 4, device="cuda")
            target = torch.empty(args["batch_size"] * 8, device="cuda")
            input_search = torch.empty(args["batch_size"] * 3 * 32 * 32 * 4, device="cuda")
            target_search = torch.empty(args["batch_size"] * 8, device="cuda")
            architect.step(input, target, input_search, target_search, args["learning_rate"], optimizer,
                           unrolled=args["unrolled"])
            optimizer.zero_grad()
            logits = model(input)
            loss = F.cross_entropy(logits, target)
            loss.backward()
            optimizer.step()
            if step == 1:
                return


def main():
    # Ray's worker for trial train_darts_7c1e4_00004 runs the trainable with the sampled config
    config = {"learning_rate": 0.0183, "arch_learning_rate": 3.7e-4, "weight_decay": 4.2e-4, "unrolled": True,
              "batch_size": 64}
    train_darts(config)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
