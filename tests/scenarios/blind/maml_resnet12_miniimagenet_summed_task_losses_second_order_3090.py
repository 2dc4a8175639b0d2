"""meta_train.py -- a lab's second-order MAML on miniImageNet, 5-way 5-shot (25 support and 75 query images of
84x84 per task), meta-batch of 4 tasks, 5 inner SGD steps (inner lr 0.01), Adam as the meta-optimizer.  The
code started as dragen1860/MAML-Pytorch's meta.py (Meta.forward, with its Learner that takes a list of fast
weights); the student made two changes for the thesis: the 4-conv Learner became the ResNet-12 of MetaOptNet /
TADAM (64-160-320-640 channels, 12.4M parameters, 47 MiB in float32), and create_graph=True was added to the
inner torch.autograd.grad, because without it the meta-gradient is first-order (the repository's own open
issue).  It runs on the lab's RTX 3090 (24 GB):

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        task_num = x_spt.size(0)
        loss_q_sum = 0
        for i in range(task_num):
            fast_weights = list(self.net.parameters())
            for k in range(self.update_step):                      # 5 inner steps
                logits = self.net(x_spt[i], fast_weights, bn_training=True)
                loss = F.cross_entropy(logits, y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights, create_graph=True)
                fast_weights = [w - self.update_lr * g for g, w in zip(grad, fast_weights)]
            logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
            loss_q_sum = loss_q_sum + F.cross_entropy(logits_q, y_qry[i])
        loss_q = loss_q_sum / task_num
        self.meta_optim.zero_grad()
        loss_q.backward()                                          # one outer backward for all 4 tasks
        self.meta_optim.step()

With the 4-conv Learner it trained at 1.3 GB.  With ResNet-12 and second order, the very first meta-batch dies
inside the second task's inner loop, in torch.autograd.grad: the first task's unrolled graph is still alive,
and nothing has been freed since the meta-batch began.

What holds the memory: for second-order MAML every inner step keeps its support forward's saved activations
(about 1 GiB for 25 images through ResNet-12) AND the graph of its own backward (create_graph: another 1 GiB),
plus the fast weights (2.1 GiB per inner step); the query forward keeps 2.9 GiB.  One task is about 13.7 GiB of
graph.  Because the four query losses are summed and backward() is called once at the end, task 1's 13.7 GiB
stays alive while task 2 builds its own -- and 4 tasks would need about 55 GiB.

An expert: call backward per task.  The meta-gradient is a sum over tasks, so
(F.cross_entropy(logits_q, y_qry[i]) / task_num).backward() inside the task loop accumulates exactly the same
gradient into the meta-parameters' .grad (this is what learn2learn's MAML example does), and then only one
task's graph (about 13.7 GiB) is ever alive; zero_grad before the loop, step after it.  Alternatives with a cost:
first-order MAML / ANIL (drops the second-order term), fewer inner steps.
Wrong first advice: expandable_segments or empty_cache (nothing is fragmented or cached; the graph is live);
inference_mode or no_grad (the inner loop needs autograd, and the outer gradient needs the create_graph graph;
detaching or .item()-ing the summed loss to "release references" silently kills the meta-gradient); a smaller
support/query set per task (changes the 5-way 5-shot / 15-query protocol of the benchmark); quantization,
ZeRO/FSDP, an 8-bit optimizer (12.4M parameters; the optimizer state is 95 MiB); a bigger GPU (55 GiB for 4
tasks, and growing with the meta-batch).
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
# ----

MiB = 1 << 20
Parameter = torch.nn.Parameter


class Learner(torch.nn.Module):
    """MAML-Pytorch's Learner, with the ResNet-12 of MetaOptNet: 4 residual blocks (three 3x3 conv + BN +
    LeakyReLU(0.1), a 1x1 conv + BN shortcut, 2x2 max-pool), 64-160-320-640 channels, then a 5-way linear head.
    forward(x, vars) runs with the given (fast) weights; self.vars are the meta-parameters."""
    CH = (64, 160, 320, 640)

    def __init__(self, n_way=5):
        torch.nn.Module.__init__(self)
        self.vars = []
        c_in = 3
        for b, c in enumerate(self.CH):
            for name, n in (("conv1", c * c_in * 9), ("conv2", c * c * 9), ("conv3", c * c * 9),
                            ("shortcut", c * c_in), ("bn", 8 * c)):
                p = Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))
                setattr(self, "b%d_%s" % (b, name), p)
                self.vars.append(p)
            c_in = c
        self.fc_w = Parameter(torch.empty(n_way * 640 + n_way, dtype=torch.float32, device="cuda"))
        self.vars.append(self.fc_w)

    def parameters(self):
        return list(self.vars)

    def forward(self, x, vars=None, bn_training=True):
        if vars is None:
            vars = self.vars
        n = x.nbytes // (3 * 84 * 84 * 4)           # images in the batch
        saved = []
        h = x
        size = 84
        for b, c in enumerate(self.CH):
            # conv1/bn1/lrelu, conv2/bn2/lrelu, conv3/bn3, shortcut conv/bn, add + lrelu: 11 maps of c x size^2
            for _ in range(11):
                y = torch.empty(n * c * size * size, dtype=torch.float32, device=x.device)
                if torch.is_grad_enabled():
                    y._act = True
                    saved.append(y)
                h = y
            size //= 2                               # max-pool 2x2 (84 -> 42 -> 21 -> 10 -> 5)
            h = torch.empty(n * c * size * size, dtype=torch.float32, device=x.device)
            if torch.is_grad_enabled():
                h._act = True
                saved.append(h)
        logits = torch.empty(n * 5, dtype=torch.float32, device=x.device)
        if torch.is_grad_enabled():
            logits._saved = tuple(saved) + (x,) + tuple(vars)
        return logits


class Meta(torch.nn.Module):
    def __init__(self, args):
        torch.nn.Module.__init__(self)
        self.update_lr = args["update_lr"]
        self.meta_lr = args["meta_lr"]
        self.n_way = args["n_way"]
        self.k_spt = args["k_spt"]
        self.k_qry = args["k_qry"]
        self.task_num = args["task_num"]
        self.update_step = args["update_step"]
        self.net = Learner(self.n_way)
        self.meta_optim = torch.optim.AdamW(self.net.parameters(), lr=self.meta_lr, weight_decay=0.0)

    def forward(self, x_spt, y_spt, x_qry, y_qry):
        task_num = len(x_spt)
        loss_q_sum = 0
        for i in range(task_num):
            fast_weights = list(self.net.parameters())
            for k in range(self.update_step):
                logits = self.net(x_spt[i], fast_weights, bn_training=True)
                loss = F.cross_entropy(logits, y_spt[i])
                grad = torch.autograd.grad(loss, fast_weights, create_graph=True)
                fast_weights = [w - self.update_lr * g for g, w in zip(grad, fast_weights)]
                print("  task %d inner step %d: allocated %.2f GiB" % (
                    i, k, torch.cuda.memory_allocated() / 2.0 ** 30))
            logits_q = self.net(x_qry[i], fast_weights, bn_training=True)
            loss_q_sum = loss_q_sum + F.cross_entropy(logits_q, y_qry[i])
        loss_q = loss_q_sum / task_num
        self.meta_optim.zero_grad()
        loss_q.backward()
        self.meta_optim.step()
        return loss_q


def miniimagenet_batch(task_num, n_way, k_spt, k_qry):
    """MiniImagenet(mode='train', n_way, k_shot, k_query, resize=84) through a DataLoader: four tasks'
    [setsz, 3, 84, 84] support and [querysz, 3, 84, 84] query images, moved to the GPU."""
    img = 3 * 84 * 84
    x_spt = [torch.empty(n_way * k_spt * img, dtype=torch.float32, device="cuda") for _ in range(task_num)]
    y_spt = [torch.empty(n_way * k_spt * 8, device="cuda") for _ in range(task_num)]   # int64 labels
    x_qry = [torch.empty(n_way * k_qry * img, dtype=torch.float32, device="cuda") for _ in range(task_num)]
    y_qry = [torch.empty(n_way * k_qry * 8, device="cuda") for _ in range(task_num)]   # int64 labels
    return x_spt, y_spt, x_qry, y_qry


def main():
    args = {"epoch": 60000, "n_way": 5, "k_spt": 5, "k_qry": 15, "imgsz": 84, "imgc": 3, "task_num": 4,
            "meta_lr": 1e-3, "update_lr": 0.01, "update_step": 5, "update_step_test": 10}
    maml = Meta(args)
    print("Learner: ResNet-12, %.1fM parameters" % (sum(p.nbytes for p in maml.net.parameters()) / 4 / 1e6))
    for step in range(args["epoch"]):
        x_spt, y_spt, x_qry, y_qry = miniimagenet_batch(args["task_num"], args["n_way"], args["k_spt"],
                                                        args["k_qry"])
        loss_q = maml(x_spt, y_spt, x_qry, y_qry)
        if step % 30 == 0:
            print("step:", step)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
