"""The role and phase code (adapters/python/oomguard_roles.py, oomguard_phase.py) on real PyTorch
objects: nn.Module, nn.Parameter, register_buffer, views sharing storage, torch.optim.AdamW state
after a real step, lists and dicts of tensors held globally and on objects, gc; CPU tensors stand
in for the failing CUDA device (the device test is an argument of the role code).

  python3 test_roles_phase.py            the real torch (Debian's python3-torch, a CPU build)
  python3 test_roles_phase.py --stand-in the stand-in torch (tests/adapter/fake_torch, on the
                                         simulated GPU): its classes must pass the same checks,
                                         so it cannot drift from the real objects

The shared checks build the same objects through the API both have; the real torch adds what only
it can run (a real backward and AdamW step, torch.load, hooks inside PyTorch's own frames).
Ends with "N passed, N failed[, N skipped]"."""
import collections
import functools
import gc
import io
import os
import sys
import threading
import traceback
import _thread

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "adapters", "python"))
STAND_IN = "--stand-in" in sys.argv
if STAND_IN:
    sys.path.insert(0, os.path.join(ROOT, "tests", "adapter", "fake_torch"))

try:
    import torch
except ImportError as e:
    print("SKIP  no torch for %s: %s" % (sys.executable, e))
    print("0 passed, 0 failed, 1 skipped")
    sys.exit(0)

import oomguard_phase  # noqa: E402
import oomguard_roles  # noqa: E402

F32 = torch.float32
DEV = None if STAND_IN else "cpu"
results = {"pass": 0, "fail": 0}


def check(name, fn):
    try:
        fn()
        results["pass"] += 1
        print("PASS  %s" % name)
    except Exception:
        results["fail"] += 1
        print("FAIL  %s" % name)
        for line in traceback.format_exc().splitlines():
            print("      | " + line)


def on_device(t):
    """The failing device: CPU tensors for the real torch, the stand-in's device tensors."""
    return bool(t.is_cuda) if STAND_IN else t.device.type == "cpu"


def empty(n):
    """n float32 elements (4n bytes) on the device of the run."""
    return torch.empty(n, dtype=F32, device=DEV) if DEV else torch.empty(n, dtype=F32)


def nbytes(t):
    for name in ("untyped_storage", "_storage"):
        st = getattr(t, name, None)
        if st is not None:
            return int(st().nbytes())
    raise AssertionError("no storage")


def measure(allocated, **kw):
    r = oomguard_roles.measure(torch, 0, allocated, on_device=on_device, round_to=1, budget=5.0, **kw)
    assert r is not None and "error" not in r, r
    return r


# ------------------------------------------------------------------------------ the shared objects

def scaled(x, w):
    """x * w: an output of the parameter w that saves x for backward (PyTorch's mul saves both operands; the
    stand-in's programs set what an operation saves and derive its output from its inputs)."""
    if not STAND_IN:
        return x * w
    out = empty(x.nbytes // 4)
    out._saved = x
    return torch.autograd._graph.derive(out, x, w)


def t_phase_model_built():
    """A model built on the device: no loader's frame on the stack, its __init__ making its weights is phase loading
    (the outermost such __init__, the model's own, not a layer's); a plain class's __init__ says nothing."""
    got = {}

    class Layer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.w = torch.nn.Parameter(empty(64))
            got["model"] = oomguard_phase.detect(sys._getframe(), 0)

    class Tower(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.layer = Layer()

    class Table(object):
        def __init__(self):
            self.rows = empty(64)
            got["plain"] = oomguard_phase.detect(sys._getframe(), 0)

    class Pipeline(torch.nn.Module):      # a library's model class moving its own weights (diffusers' ModelMixin)
        def to(self, *args, **kwargs):
            got["moved"] = oomguard_phase.detect(sys._getframe(), 0)
            return self

    Tower()
    Table()
    Pipeline().to("cuda")
    assert got["model"][0] == "loading" and got["model"][1][2] == "__init__", got
    assert got["model"][1][1] == Tower.__init__.__code__.co_firstlineno + 2, got   # self.layer = Layer()
    assert got["plain"][0] is None, got
    assert got["moved"][0] == "loading" and got["moved"][1][2] == "to" and "to()" in got["moved"][2], got


def t_graph_chain():
    """roles.holders[].graphs on the graph's structure: outputs of a sampler's steps, each made from the last (a
    denoising loop with autograd on), share their nodes and count once; outputs of separate passes over the same
    weights share only the weights' and count each."""
    g = globals()
    w = torch.nn.Parameter(empty(4096))
    try:
        h, chain = empty(4096), []
        for _ in range(3):
            h = scaled(h, w)
            chain.append(h)
        g["chain"] = chain
        g["passes"] = [scaled(empty(4096), w) for _ in range(3)]
        r = measure(None)
        h = dict((v[1], v) for v in r["holders"])
        assert h["chain"][9] == 1 and h["passes"][9] == 3, (h["chain"], h["passes"])
    finally:
        g.pop("chain", None)
        g.pop("passes", None)


class Block(torch.nn.Module):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(empty(n))
        self.register_buffer("running_mean", empty(64))


class Net(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.a = Block(4096)
        self.b = Block(1024)
        self.head = torch.nn.Parameter(empty(256))


class Trainer(object):
    def __init__(self):
        self.cache = {}


def build():
    """The shared set-up; returns the truth: bytes by role and by holder."""
    g = globals()
    for k in ("model", "opt", "views", "losses", "trainer"):
        g.pop(k, None)
    gc.collect()
    g["model"] = Net()
    params = [model.a.weight, model.b.weight, model.head]
    for p in params:                                   # what backward() would have made
        p.grad = empty(p.nbytes // 4 if STAND_IN else p.numel())
    g["opt"] = torch.optim.AdamW(model.parameters(), lr=1e-3)
    opt.step()                                         # the state, made at the first step
    g["views"] = [model.a.weight.view(-1)]             # a view: the weight's storage, counted once
    g["losses"] = [empty(16) for _ in range(5)]
    g["trainer"] = Trainer()
    trainer.cache["x"] = empty(2048)
    trainer.cache["y"] = [empty(512), empty(512)]
    state = [t for st in opt.state.values() for t in st.values() if hasattr(t, "data_ptr") and on_device(t)]
    truth = {
        "parameters": sum(nbytes(p) for p in params),
        "buffers": nbytes(model.a.running_mean) + nbytes(model.b.running_mean),
        "gradients": sum(nbytes(p.grad) for p in params),
        "optimizer_state": sum(nbytes(t) for t in state),
        "graph_pools": 0,
        "held_by_python": 5 * 64 + 2048 * 4 + 2 * 512 * 4,
    }
    holders = {"losses (list, global in test_roles_phase.py)": 5 * 64,
               "self.cache (dict on Trainer)": 2048 * 4 + 2 * 512 * 4}
    # AdamW keeps two tensors the size of each parameter (plus a step count, a tensor in PyTorch)
    assert truth["optimizer_state"] >= 2 * truth["parameters"], truth
    return truth, holders


def t_roles():
    truth, holders = build()
    act = empty(1000)                   # a temporary of this frame: activations   # noqa: F841
    allocated = sum(truth.values()) + 4000
    r = measure(allocated)
    got = dict((k, v[0]) for k, v in r["roles"].items())
    for k, v in truth.items():
        assert got[k] == v, (k, got[k], v)
    assert got["activations"] == 4000, got
    assert r["complete"] is True and r["optimizers"]["AdamW"][0] == truth["optimizer_state"], r
    named = dict((h[0], h[4]) for h in r["holders"])
    assert named == holders, named
    enc = oomguard_roles.encode(r)
    assert "role\tparameters\t%d\t" % truth["parameters"] in enc and "holder\t" in enc, enc
    # the parameters by dtype, and the device's parameters the optimizer holds (an optimizer for this model)
    assert r["parameters_by_dtype"] == {"float32": [truth["parameters"], 3]}, r["parameters_by_dtype"]
    assert r["optimizers"]["AdamW"][2] == truth["parameters"], r["optimizers"]
    assert "dtype\tfloat32\t%d\t3" % truth["parameters"] in enc and "meta\tby_dtype\t1" in enc, enc
    assert "optimizer\tAdamW\t%d\t" % truth["optimizer_state"] in enc, enc
    # AdamW's moments are shaped like their parameters (its step count one value): none of its state is otherwise
    assert r["optimizers"]["AdamW"][3] == 0, r["optimizers"]
    assert enc.split("optimizer\tAdamW\t")[1].split("\n")[0].endswith("\t%d\t0" % truth["parameters"]), enc


def shaped(*dims, **kw):
    """A float32 tensor of that shape on the device of the run (requires_grad=True: a Parameter).  The stand-in's
    tensors are sized in bytes and have no shape of their own: it is set on them, as the programs that need one do."""
    if not STAND_IN:
        t = torch.zeros(*dims, dtype=F32)
        return torch.nn.Parameter(t) if kw.get("requires_grad") else t
    n = 1
    for d in dims:
        n *= d
    t = empty(n)
    if kw.get("requires_grad"):
        t = torch.nn.Parameter(t)
    t.shape = tuple(dims)
    return t


class Preconditioned(torch.optim.Optimizer):
    """Keeps what Shampoo and SOAP keep: a moment shaped like each parameter and a d x d matrix for each of its
    dimensions (a list of them, as SOAP's state["GG"]), and a step count."""

    def __init__(self, params):
        torch.optim.Optimizer.__init__(self, params, {"lr": 1e-3})

    def first_step(self):
        for group in self.param_groups:
            for p in group["params"]:
                dims = [int(n) for n in p.shape]
                self.state[p] = {"exp_avg": shaped(*dims), "step": 1, "GG": [shaped(n, n) for n in dims]}


def t_optimizer_matrices():
    """Of an optimizer's state, the bytes not shaped like their parameter (matrices, not one value per weight)."""
    g = globals()
    for k in ("model", "opt", "views", "losses", "trainer"):
        g.pop(k, None)
    gc.collect()
    w, b = shaped(96, 32, requires_grad=True), shaped(96, requires_grad=True)
    g["pre"] = Preconditioned([w, b])
    try:
        pre.first_step()
        moments = nbytes(pre.state[w]["exp_avg"]) + nbytes(pre.state[b]["exp_avg"])
        matrices = sum(nbytes(m) for st in pre.state.values() for m in st["GG"])
        assert matrices == (96 * 96 + 32 * 32 + 96 * 96) * 4, matrices
        r = measure(None)
        assert r["optimizers"]["Preconditioned"] == [moments + matrices, 5, nbytes(w) + nbytes(b), matrices], \
            r["optimizers"]
        assert "optimizer\tPreconditioned\t%d\t5\t%d\t%d\n" % (moments + matrices, nbytes(w) + nbytes(b), matrices) \
            in oomguard_roles.encode(r)
    finally:
        g.pop("pre", None)


class LoRALinear(torch.nn.Module):
    """loralib's Linear: the base weight and two adapter matrices named lora_A and lora_B."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = shaped(64, 32, requires_grad=True)
        self.lora_A = shaped(4, 32, requires_grad=True)
        self.lora_B = shaped(64, 4, requires_grad=True)


class PeftWrapped(torch.nn.Module):
    """PEFT's layout: the adapters are submodules named lora_A / lora_B holding a Linear-like module per adapter."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.base_layer = LoRALinear()
        self.lora_A = torch.nn.Module()
        self.lora_A.default = torch.nn.Module()
        self.lora_A.default.weight = shaped(8, 32, requires_grad=True)


def t_lora():
    """LoRA adapters' parameters: named lora_* (loralib) or under a submodule named so (PEFT); none: None, not 0."""
    g = globals()
    for k in ("model", "opt", "views", "losses", "trainer", "pre", "dp"):
        g.pop(k, None)
    gc.collect()
    g["lm"] = m = PeftWrapped()
    try:
        r = measure(None)
        want = nbytes(m.base_layer.lora_A) + nbytes(m.base_layer.lora_B) + nbytes(m.lora_A.default.weight)
        assert r["lora_bytes"] == want, (r["lora_bytes"], want)
        # the base weight requires grad (LoRA's base not frozen); a head under modules_to_save is PEFT's, asked for
        m.modules_to_save = torch.nn.Module()
        m.modules_to_save.weight = shaped(64, 64, requires_grad=True)
        r = measure(None)
        assert r["lora_base_bytes"] == nbytes(m.base_layer.weight), r["lora_base_bytes"]
        enc = oomguard_roles.encode(r)
        assert "meta\tlora_bytes\t%d\n" % want in enc and "meta\tlora_base_bytes\t%d\n" % nbytes(m.base_layer.weight) \
            in enc, enc
        m.base_layer.weight.requires_grad = False      # mark_only_lora_as_trainable: the base frozen
        assert measure(None)["lora_base_bytes"] == 0
        # another model beside it, trainable, no adapter (a base loading again): not the adapted model's base
        g["other"] = DPLinear()
        try:
            assert measure(None)["lora_base_bytes"] == 0
        finally:
            g.pop("other", None)
        m = None
        g["lm"] = DPLinear()
        gc.collect()
        r = measure(None)
        assert r["lora_bytes"] is None and r["lora_base_bytes"] is None and "lora_" not in oomguard_roles.encode(r), r
    finally:
        g.pop("lm", None)


class DPLinear(torch.nn.Module):
    """A layer whose parameters Opacus' hooks gave one gradient per example (grad_sample, (n, *p.shape))."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = shaped(64, 32, requires_grad=True)
        self.bias = shaped(64, requires_grad=True)


def t_per_sample():
    """Gradients a parameter carries one per example are per_sample_gradients, with their count; a tensor shaped like
    the parameter (Megatron's main_grad), a flat one of a flat parameter (FSDP's unsharded buffer) and one of another
    dtype are not."""
    g = globals()
    for k in ("model", "opt", "views", "losses", "trainer", "pre"):
        g.pop(k, None)
    gc.collect()
    g["dp"] = m = DPLinear()
    try:
        m.weight.grad_sample = shaped(16, 64, 32)
        m.bias.grad_sample = shaped(16, 64)
        m.weight.main_grad = shaped(64, 32)
        m.bias._full_param_padded = shaped(64 * 4)
        want = nbytes(m.weight.grad_sample) + nbytes(m.bias.grad_sample)
        bare = shaped(8, 8, requires_grad=True)      # no attribute of its own: the scan makes it no dictionary
        g["bare"] = bare
        before = [type(x) for x in gc.get_referents(bare)]
        r = measure(None)
        assert [type(x) for x in gc.get_referents(bare)] == before, (before, gc.get_referents(bare))
        assert r["roles"]["per_sample_gradients"] == [want, 2], r["roles"]
        assert r["per_sample_count"] == 16, r["per_sample_count"]
        enc = oomguard_roles.encode(r)
        assert "role\tper_sample_gradients\t%d\t2\n" % want in enc and "meta\tper_sample_count\t16\n" in enc, enc
        m.weight.grad_sample = [shaped(8, 64, 32)]        # a list kept on the parameter: its tensors are read
        m.bias.grad_sample = None
        r = measure(None)
        assert r["roles"]["per_sample_gradients"] == [nbytes(m.weight.grad_sample[0]), 1], r["roles"]
        assert r["per_sample_count"] == 8, r["per_sample_count"]
        if not STAND_IN:
            # shaped one per example, in autocast's dtype (per-example gradients computed under float16): one too
            m.bias.grad_sample = torch.zeros(8, 64, dtype=torch.float16)
            r = measure(None)
            assert r["roles"]["per_sample_gradients"] == [nbytes(m.weight.grad_sample[0]) + 8 * 64 * 2, 2], r["roles"]
        if STAND_IN:
            # the stand-in's tensors have no shape of their own: of the parameter's dtype and n times its bytes
            del m.weight.main_grad
            m.weight.grad_sample = empty(4 * 64 * 32)
            m.bias.grad_sample = empty(64)                 # the parameter's own size: not one per example
            r = measure(None)
            assert r["roles"]["per_sample_gradients"] == [4 * 64 * 32 * 4, 1], r["roles"]
            assert r["per_sample_count"] == 4, r["per_sample_count"]
        m.weight.grad_sample = m.bias.grad_sample = None
        r = measure(None)
        assert r["roles"]["per_sample_gradients"] == [0, 0] and r["per_sample_count"] is None, r
        assert "per_sample_count" not in oomguard_roles.encode(r)
    finally:
        g.pop("dp", None)
        g.pop("bare", None)


class PrefixCache(object):
    """transformers' DynamicCache: a key and a value tensor per layer, in two lists."""

    def __init__(self, n, owner=None):
        self.key_cache = [empty(n) for _ in range(3)]
        self.value_cache = [empty(n) for _ in range(3)]
        self.owner = owner                               # a reference back to the service: a cycle


class Layer(object):
    def __init__(self, n):
        self.keys, self.values = empty(n), empty(n)


class LayeredCache(object):
    """The newer transformers cache: a list of layer objects, each with its tensors (four levels down)."""

    def __init__(self, n):
        self.layers = [Layer(n), Layer(n)]


class Guarded(object):
    """An object whose attribute access runs code that raises: its own dictionary is read all the same."""

    def __init__(self, n):
        self.t = empty(n)

    def __getattribute__(self, k):
        raise RuntimeError("attribute access is not for the role scan")


class ChatService(object):
    def __init__(self):
        self.prefix_cache = {}


NESTED = ("service", "pairs", "by_user", "layered", "guarded", "too_deep", "kv_views")


def t_nested_holders():
    """Tensors two and more levels inside a holder (a dict of objects of lists, a list of tuples, a dict of
    dicts, a dict of objects of lists of objects) are the outermost named holder's, each storage once; a
    tensor both in the dict and in the object the running code holds now is the dict's; a holder deeper than
    the walk goes is not counted and says it was read in part."""
    truth, holders = build()
    g = globals()
    try:
        g["service"] = ChatService()
        for i, n in enumerate((100, 200, 300)):
            service.prefix_cache["tenant-%d" % i] = PrefixCache(n, service)
        g["pairs"] = [(empty(10), empty(20)), (empty(30), empty(40))]
        g["by_user"] = {"a": {"x": empty(50)}, "b": {"y": empty(60), "z": [empty(70)]}}
        g["layered"] = {"t": LayeredCache(80)}
        # a class exec() made without a module name says "builtins", as int does: an object of it is still read
        made = {"empty": empty}
        exec("class StaticCache(object):\n    def __init__(self, n):\n        self.key_cache = [empty(n)]\n", made)
        g["guarded"] = {"g": Guarded(90), "exec_made": made["StaticCache"](110)}
        del made
        g["too_deep"] = {"a": {"b": {"c": {"d": {"e": {"f": {"g": empty(1000)}}}}}}}   # beyond _DEPTH
        g["kv_views"] = [service.prefix_cache["tenant-0"].key_cache[0].view(-1)]    # the dict's storage: once
        current = PrefixCache(1)                          # the cache in use now: one tensor of the dict's, one new
        current.key_cache = [service.prefix_cache["tenant-1"].key_cache[0], empty(5)]
        current.value_cache = []
        r = measure(None)
        want = dict(holders)
        want.update({
            "self.prefix_cache (dict on ChatService)": 6 * (100 + 200 + 300) * 4,
            "pairs (list, global in test_roles_phase.py)": (10 + 20 + 30 + 40) * 4,
            "by_user (dict, global in test_roles_phase.py)": (50 + 60 + 70) * 4,
            "layered (dict, global in test_roles_phase.py)": 4 * 80 * 4,
            "guarded (dict, global in test_roles_phase.py)": (90 + 110) * 4,
            "self.key_cache (list on PrefixCache)": 5 * 4,
        })
        named = dict((h[0], h[4]) for h in r["holders"])
        assert named == want, named
        assert r["roles"]["held_by_python"][0] == truth["held_by_python"] + sum(want.values()) - sum(
            holders.values()), (r["roles"]["held_by_python"], want)
        assert r["complete"] is True and r["sampled"] >= 1, r          # too_deep: read in part, not counted
        assert [h[7] for h in r["holders"] if h[0].startswith("self.key_cache")] == ["kv_cache"], r["holders"]
        del current
    finally:
        for k in NESTED:
            g.pop(k, None)


class Camera(object):
    """A scene's view: its photo as a tensor, and numbers."""
    def __init__(self, n):
        self.original_image = empty(n)
        self.fov = 0.8


def t_holder_records():
    """roles.holders[].records: a list of like objects each holding as many tensors (a scene's cameras), a dict of
    batches (tuples of two tensors) is a collection of that many records; mixed elements, an element without a
    tensor, a single element or a set are not one."""
    build()
    g = globals()
    names = ("cameras", "batches", "mixed", "holey", "single")
    try:
        g["cameras"] = [Camera(40) for _ in range(130)]
        g["batches"] = dict((i, (empty(8), empty(8 + i))) for i in range(5))
        g["mixed"] = [Camera(4), Camera(4), (empty(4), empty(4))]
        g["holey"] = [empty(4), "label", empty(4)]
        g["single"] = [empty(4)]
        r = measure(None)
        rec = dict((h[1], h[12]) for h in r["holders"])
        assert rec.get("cameras") == 130 and rec.get("batches") == 5, rec
        assert rec.get("mixed") == 0 and rec.get("holey") == 0 and rec.get("single") == 0, rec
        line = [l for l in oomguard_roles.encode(r).splitlines() if l.startswith("holder\t") and "\tcameras\t" in l]
        assert line and line[0].split("\t")[17] == "130", line
    finally:
        for k in names:
            g.pop(k, None)


class ChunkStore(object):
    """An LRU of tensors kept to a byte budget its object names (budget_bytes), beside a counter that is no bound."""
    def __init__(self, budget_bytes):
        self.budget_bytes = budget_bytes
        self.bytes = 0
        self.entries = collections.OrderedDict()


class RecentQueries(object):
    """A count-bounded cache (capacity) and a deque with its own maxlen."""
    def __init__(self):
        self.capacity = 8
        self.entries = {}
        self.recent = collections.deque(maxlen=5)


def t_holder_bounds():
    """roles.holders[].bound_bytes and bound_records: the budget the owner object names for what it keeps (an int
    attribute named for a byte budget or a count of entries), a deque's maxlen; none for a list a global keeps"""
    build()
    g = globals()
    try:
        g["store"] = ChunkStore(4096)
        for i in range(3):
            g["store"].entries[i] = empty(100)
        g["queries"] = RecentQueries()
        for i in range(4):
            g["queries"].entries[i] = empty(10)
            g["queries"].recent.append(empty(3))
        g["kept"] = [empty(9), empty(9)]
        r = measure(None)
        bound = dict((h[1] + " " + h[3], (h[14], h[15])) for h in r["holders"])
        assert bound.get("self.entries on ChunkStore") == (4096, None), bound
        assert bound.get("self.entries on RecentQueries") == (None, 8), bound
        assert bound.get("self.recent on RecentQueries") == (None, 5), bound
        assert bound.get("kept global in test_roles_phase.py") == (None, None), bound
        line = [l for l in oomguard_roles.encode(r).splitlines() if l.startswith("holder\t") and "ChunkStore" in l]
        assert line and line[0].split("\t")[19:21] == ["4096", "-"], line
    finally:
        for k in ("store", "queries", "kept"):
            g.pop(k, None)


class ChatSession(object):
    """A cache declared in the class body: one dict every session shares, kept while the class lives."""
    image_features = {}
    greeting = "hello"

    def features(self, key):
        return self.image_features.get(key)

    @property
    def latest(self):
        return empty(7)                                   # made when read: a property holds nothing


def t_class_attribute_holders():
    """A container in a class body of the program (ChatSession.image_features) is a holder of its own, named
    Class.attribute, kept across calls; its methods and properties are not read (a property is not called)."""
    truth, holders = build()
    try:
        for i in range(3):
            ChatSession.image_features["shot-%d" % i] = empty(40)
        s = ChatSession()                                 # an instance adds nothing: the dict is the class's
        r = measure(None)
        named = dict((h[0], h[4]) for h in r["holders"])
        want = dict(holders)
        want["ChatSession.image_features (dict, class attribute in test_roles_phase.py)"] = 3 * 40 * 4
        assert named == want, named
        assert s.features("shot-1") is not None
    finally:
        ChatSession.image_features.clear()


def t_nested_bounded():
    """A dict of 100,000 objects none of which holds a tensor (a dataset of records) is read in part; one of
    20,000 objects each with a list of a tensor is read whole; a budget too small stops the walk and says so."""
    build()
    g = globals()
    try:
        g["records"] = dict((i, Layer.__new__(Layer)) for i in range(100000))
        for i, o in g["records"].items():
            o.keys = [i, str(i)]
        g["service"] = ChatService()
        for i in range(20000):
            c = PrefixCache.__new__(PrefixCache)
            c.key_cache, c.value_cache = [empty(1)], []
            service.prefix_cache[i] = c
        r = measure(None)
        named = dict((h[0], h[4]) for h in r["holders"])
        assert named["self.prefix_cache (dict on ChatService)"] == 20000 * 4, named
        assert r["complete"] is True and r["sampled"] >= 1 and r["elapsed_ms"] < 5000, r["elapsed_ms"]
        r = oomguard_roles.measure(torch, 0, 10 ** 9, on_device=on_device, round_to=1, budget=0.002)
        assert r["complete"] is True or (r["roles"]["activations"][0] is None and "budget" in r["why"]), r
    finally:
        for k in NESTED + ("records",):
            g.pop(k, None)


def t_dtypes_optimizer_before_step():
    """Parameters of two dtypes are told apart (float32 weights of a half-precision checkpoint); an optimizer
    made for the model holds its parameters before any step ran (no state, no gradient: the job trains)."""
    build()
    g = globals()
    half = torch.nn.Parameter(torch.empty(3000, dtype=torch.bfloat16, device=DEV) if DEV else
                              torch.empty(3000, dtype=torch.bfloat16))
    g["half_model"] = torch.nn.Module()
    half_model.w = half
    g["fresh_opt"] = torch.optim.AdamW([half], lr=1e-3)
    try:
        r = measure(None)
        by = r["parameters_by_dtype"]
        f32 = sum(nbytes(p) for p in (model.a.weight, model.b.weight, model.head))
        assert by == {"float32": [f32, 3], "bfloat16": [nbytes(half), 1]}, by
        assert r["optimizers"]["AdamW"][2] == f32 + nbytes(half), r["optimizers"]   # both optimizers, one class
        assert r["roles"]["gradients"][0] == sum(nbytes(p.grad) for p in (model.a.weight, model.b.weight, model.head))
        assert half.grad is None and not fresh_opt.state, fresh_opt.state
    finally:
        g.pop("half_model", None)
        g.pop("fresh_opt", None)


def t_local_holder():
    truth, _ = build()
    outs = [empty(300), empty(300)]     # a list a running function fills: a named holder  # noqa: F841
    r = measure(None)
    named = dict((h[0].split(" (")[0], h[4]) for h in r["holders"])
    assert named.get("outs") == 2 * 300 * 4, r["holders"]
    assert r["roles"]["activations"][0] is None and r["why"], r      # allocated unknown: rest unknown


def slice_of(t, n):
    """The first n float32 elements of t, a view of its storage."""
    if not STAND_IN:
        return t[:n]
    v = t.view()
    v.nbytes = 4 * n
    return v


def t_staged_local():
    """A bare tensor a running function holds, of which the call it makes gets a slice (a document's pages staged
    whole, a batch of them passed on): a named holder; the batch, which the call gets whole, is the pass's"""
    build()

    def run(x):
        return measure(None)

    def named(r):
        return dict((h[0].split(" (")[0], h[4]) for h in r["holders"])
    pages = empty(1000)
    batch = slice_of(pages, 100)
    got = named(run(batch))
    assert got.get("pages") == 1000 * 4 and "batch" not in got, got
    whole = empty(500)                  # a call given none of it: pages is not read as staged for it
    got = named(run(whole))
    assert "whole" not in got and "pages" not in got, got
    half = slice_of(pages, 500)         # half of it: not a slice of staged data
    del batch
    got = named(run(half))
    assert "pages" not in got and "half" not in got, got


def t_child_processes():
    """this process's multiprocessing children by pid, each with the name its starter gave it (None: the default
    name, as a DataLoader's workers keep); read without reaping; a finished child is no longer listed"""
    import multiprocessing
    import time
    ctx = multiprocessing.get_context("fork")
    named = ctx.Process(target=time.sleep, args=(30,), name="Dask Worker process (from Nanny)", daemon=True)
    plain = ctx.Process(target=time.sleep, args=(30,), daemon=True)
    try:
        named.start()
        plain.start()
        got = dict(oomguard_roles.child_processes())
        assert got.get(named.pid) == "Dask Worker process (from Nanny)" and plain.pid in got, got
        assert got[plain.pid] is None, got
        r = measure(None)
        r["child_processes"] = sorted(got.items())
        lines = oomguard_roles.encode(r)
        assert "meta\tchildren_read\t1" in lines and "child\t%d\t-" % plain.pid in lines, lines
    finally:
        for p in (named, plain):
            p.terminate()
            p.join()
    assert not [c for c in oomguard_roles.child_processes() if c[0] in (named.pid, plain.pid)]


def t_gc_only():
    """Modules and optimizers reached only through gc: no name of ours holds them."""
    truth, _ = build()
    g = globals()
    keep = [g.pop("model"), g.pop("opt")]
    holder = {"k": keep}              # not a container the scan names (a dict in a closure cell)

    def inner():
        return holder
    del keep
    r = measure(None)
    assert r["roles"]["parameters"][0] == truth["parameters"], r["roles"]
    assert r["roles"]["optimizer_state"][0] == truth["optimizer_state"], r["roles"]
    assert inner() is holder


def t_budget():
    build()
    r = oomguard_roles.measure(torch, 0, 10 ** 9, on_device=on_device, round_to=1, budget=1e-9)
    assert r["complete"] is False and r["roles"]["activations"][0] is None and "budget" in r["why"], r


def t_never_raises():
    def bad(t):
        raise RuntimeError("device test broken")
    build()
    r = oomguard_roles.measure(torch, 0, 100, on_device=bad, round_to=1, budget=5.0)
    assert r is not None and r["roles"]["parameters"][0] == 0, r


def t_purposes():
    """What the holders' names and classes say they keep: a KV cache, an EMA, a checkpoint, a teacher, a dataset
    (a dataset's own cache too, a data loader's tensors); an identifier that merely contains the letters (schema,
    temas) says nothing."""
    P = oomguard_roles.purpose_of
    assert P(("past_key_values",)) == "kv_cache" and P(("self.kv",)) == "kv_cache", P(("kv",))
    assert P(("layer_cache",), ("StaticCache",)) == "kv_cache"
    assert P(("ema_params",)) == "ema" and P(("model_ema",)) == "ema" and P(("x",), ("AveragedModel",)) == "ema"
    assert P(("ckpt_model",)) == "checkpoint" and P(("state_dict",)) == "checkpoint"
    assert P(("teacher",)) == "teacher" and P(("self.cache",)) == "cache"
    assert P(("train_images",)) == "dataset" and P(("self.x",), ("Tensor", "ShelfDataset")) == "dataset"
    # a data loader's own tensors are its data (nanoGPT's DataLoaderLite keeps its token shards as self.tokens)
    assert P(("self.tokens",), ("Tensor", "DataLoaderLite")) == "dataset"
    assert P(("self.tokens",), ("Tensor", "Tokenizer")) is None
    assert P(("self.vectors",), ("Tensor", "GpuFlatIndex")) == "index" and P(("faiss_index",)) == "index"
    assert P(("self.corpus_emb",), ("Tensor", "HardNegativeMiner")) == "index" and P(("emb",)) is None
    assert P(("X_tr",)) == "dataset" and P(("x_va",)) == "dataset" and P(("X_valid",)) == "dataset"
    # a dataset's own cache is the dataset on the device (MONAI's CacheDataset._cache); a cache class's is a cache
    assert P(("self._cache",), ("list", "CacheDataset")) == "dataset", P(("self._cache",), ("list", "CacheDataset"))
    assert P(("self._cache",), ("dict", "LRUCache")) == "cache"
    assert P(("data",)) is None and P(("image_size",)) is None
    assert P(("schema",)) is None and P(("temas",)) is None and P(("t_acts",)) is None and P(()) is None
    build()
    g = globals()
    g["ema_params"] = [empty(4096), empty(1024), empty(256), empty(64)]
    # a split copied from numpy as it was: float64, beside a float32 column; the holder's float64 bytes said
    f64 = torch.float64
    g["X_tr"] = [torch.empty(300, dtype=f64, device=DEV) if DEV else torch.empty(300, dtype=f64), empty(100)]
    try:
        r = measure(None)
        h = [h for h in r["holders"] if h[1] == "ema_params"][0]
        assert h[7] == "ema" and h[13] == 0, h
        h = [h for h in r["holders"] if h[1] == "X_tr"][0]
        assert h[7] == "dataset" and h[4] == 300 * 8 + 100 * 4 and h[13] == 300 * 8, h
        enc = oomguard_roles.encode(r)
        assert any(l.startswith("holder\t") and l.split("\t")[4] == "ema_params" and l.split("\t")[10] == "ema"
                   for l in enc.splitlines()), enc
        assert any(l.startswith("holder\t") and l.split("\t")[4] == "X_tr" and l.split("\t")[18] == str(300 * 8)
                   for l in enc.splitlines()), enc
    finally:
        g.pop("ema_params", None)
        g.pop("X_tr", None)
    # IPython's output history, by the exact globals its display hook binds (Out, _, _5), never a word of a name
    H = oomguard_roles.output_history
    assert H("Out", "global in nb.py") == "output_history" and H("_5", "global in nb.py") == "output_history"
    assert H("_", "global in nb.py") == "output_history" and H("___", "global in nb.py") == "output_history"
    assert H("out", "global in nb.py") is None and H("_x", "global in nb.py") is None
    assert H("Out", "local in main (nb.py:3)") is None and H("_5", "on Trainer") is None
    g["Out"] = {5: empty(2048)}
    try:
        r = measure(None)
        h = [h for h in r["holders"] if h[1] == "Out"][0]
        assert h[7] == "output_history", h
    finally:
        g.pop("Out", None)


class LowConfidence(Exception):
    pass


def _fold(n):
    """Makes an output on the device and raises: the frame that held it ends, its traceback keeps it."""
    output = {"positions": empty(n), "pair": empty(2 * n)}
    if output:
        raise LowConfidence("plddt below the cut")


def t_kept_exceptions():
    """Exceptions kept in a list keep their tracebacks' frames and every tensor those frames held: the list is
    their holder; a running frame's locals (this function's own) stay the running code's."""
    g = globals()
    g["failed"] = []
    mine = [empty(512)]                          # a list local of this running function: its own holder
    try:
        for n in (1024, 2048):
            try:
                _fold(n)
            except LowConfidence as err:
                failed.append(err)
        r = measure(None)
        got = dict((h[1], h[4]) for h in r["holders"])
        assert got.get("failed") == (1024 + 2048 + 2048 + 4096) * 4, got
        assert got.get("mine") == 512 * 4, got
        failed[:] = [err.__traceback__ for err in failed]  # tracebacks kept without their exceptions: the same
        r = measure(None)
        assert dict((h[1], h[4]) for h in r["holders"]).get("failed") == (1024 + 2048 + 2048 + 4096) * 4, r["holders"]
    finally:
        g.pop("failed", None)
        del mine


def t_copies():
    """A holder whose blocks are the sizes of the parameters' (a snapshot, an EMA, a loaded state dict)
    is a copy of them, also part way (a copy still being made); other tensors are not."""
    truth, _ = build()
    g = globals()
    params = [model.a.weight, model.b.weight, model.head]
    g["best"] = {"model": [empty(4096), empty(1024), empty(4096), empty(4096)]}  # a.weight's size 3 times
    g["snap"] = [empty(4096), empty(1024), empty(256)] * 1 + [empty(64)]         # a size no parameter has
    try:
        r = measure(None)
        by = dict((h[1], h) for h in r["holders"])
        assert by["best"][8] is None, by["best"]          # more often than the model and AdamW have it
        assert by["snap"][8] is None, by["snap"]
        g["best"] = [empty(p.nbytes // 4 if STAND_IN else p.numel()) for p in params] + [empty(2048)]
        g["snap"] = [empty(p.nbytes // 4 if STAND_IN else p.numel()) for p in params + params]
        r = measure(None)
        by = dict((h[1], h) for h in r["holders"])
        assert by["snap"][8] in ("parameters", "optimizer_state"), by["snap"]   # AdamW's moments: the sizes twice
        assert by["best"][8] is None, by["best"]          # 2048 floats: no parameter's size
        assert oomguard_roles.copy_of({16: 3}, {"parameters": {16: 9}}) is None      # under 4 blocks
        assert oomguard_roles.copy_of({16: 4}, {"parameters": {16: 4}}) == "parameters"
        assert oomguard_roles.copy_of({16: 4}, {"parameters": {16: 40}}) is None     # under a quarter
    finally:
        g.pop("best", None)
        g.pop("snap", None)


class Holder(object):
    """An object of the program's own class (a pipeline) that keeps models as attributes."""


def t_models():
    """Models are the modules no other module holds, grouped by class and size: a second copy of the same
    model (a notebook cell run again) is counted, a frozen one (a teacher) is said so."""
    build()
    g = globals()
    g["old_model"] = Net()
    g["teacher"] = Block(8192)
    for p in (teacher.weight,):
        p.requires_grad_(False) if hasattr(p, "requires_grad_") else None
    try:
        r = measure(None)
        ms = dict((m[0], m) for m in r["models"])
        net_bytes = sum(nbytes(p) for p in (model.a.weight, model.b.weight, model.head))
        assert ms["Net"][1] == net_bytes and ms["Net"][3] == 2 and not ms["Net"][4], ms
        assert ms["Block"][3] == 1 and ms["Block"][4] is True, ms     # Block(8192): frozen, not a child of a Net
        assert ms["Block"][8] == "teacher" and ms["Net"][8] is None, ms  # what the name `teacher` says
        enc = oomguard_roles.encode(r)
        assert "model\tNet\t%d\t3\t2\t0" % net_bytes in enc, enc
        # both copies are globals of the program: held by a name, neither running
        assert ms["Net"][5] == 2 and ms["Net"][6] == 0 and set(ms["Net"][7]) == {"model", "old_model"}, ms
        # one an object of the program holds is named by the way the running code reaches it: rebinding `pipe`
        # drops it
        g["pipe"] = Holder()
        g["pipe"].unet = g.pop("old_model")
        ms = dict((m[0], m) for m in measure(None)["models"])
        assert set(ms["Net"][7]) == {"model", "pipe.unet"}, ms
    finally:
        g.pop("old_model", None)
        g.pop("teacher", None)
        g.pop("pipe", None)


class Halfway(torch.nn.Module):
    """A model halfway through a move: one layer on the failing device, the other (held twice) still elsewhere."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.here = torch.nn.Linear(64, 64)
        self.rest = torch.nn.Linear(128, 128, device="meta")
        self.rest_again = self.rest


def t_models_elsewhere():
    """models[].parameters_elsewhere_bytes: the parameters of a model not on the failing device (the rest of a
    model a load is moving, here on the meta device), each once; 0 for a model all on the device"""
    if STAND_IN:
        return
    build()
    g = globals()
    g["halfway"] = Halfway()
    try:
        r = measure(None)
        ms = dict((m[0], m) for m in r["models"])
        assert ms["Halfway"][1] == 64 * 64 * 4 + 64 * 4, ms["Halfway"]
        assert ms["Halfway"][11] == 128 * 128 * 4 + 128 * 4, ms["Halfway"]
        assert ms["Net"][11] == 0, ms["Net"]
        assert any(l.startswith("model\t") and l.split("\t")[12] == str(128 * 128 * 4 + 128 * 4)
               for l in oomguard_roles.encode(r).splitlines())
    finally:
        g.pop("halfway", None)


def t_models_float32():
    """models[].parameters_float32_bytes: of one model's parameters on the device, those in float32; a model
    converted to bfloat16 has none, the float32 one all of its own"""
    if STAND_IN:
        return
    build()
    g = globals()
    g["draft"] = torch.nn.Linear(96, 96).to(torch.bfloat16)
    try:
        r = measure(None)
        ms = dict((m[0], m) for m in r["models"])
        assert ms["Linear"][13] == 0 and ms["Linear"][1] == 96 * 96 * 2 + 96 * 2, ms["Linear"]
        assert ms["Net"][13] == ms["Net"][1] > 0, ms["Net"]
        assert any(l.startswith("model\tNet\t") and l.split("\t")[14] == str(ms["Net"][1])
                   for l in oomguard_roles.encode(r).splitlines())
    finally:
        g.pop("draft", None)


def t_library_object_keeps_a_model():
    """A local of the program for an object of a library's class that keeps a model three levels down (an engine ->
    its worker -> the model, and the worker's KV cache in a list): the model is named after the local, the cache is
    held by it; a library object that keeps no model (a model's output) is no holder in a local, as before"""
    build()
    ns = {"__name__": "enginelib.engine"}
    exec(compile("class Worker(object):\n"
                 "    def __init__(self, model, cache):\n        self.model = model\n        self.gpu_cache = cache\n"
                 "class Engine(object):\n    def __init__(self, worker):\n        self.worker = worker\n"
                 "class Output(object):\n    def __init__(self, logits):\n        self.logits = logits\n",
                 "/srv/site-packages/enginelib/engine.py", "exec"), ns)
    llm = ns["Engine"](ns["Worker"](Block(256), [empty(4096), empty(4096)]))
    out = ns["Output"](empty(1024))
    r = measure(None)
    held = dict((h[0], h[4]) for h in r["holders"])
    mine = [k for k in held if k.startswith("llm (Engine, local in t_library_object_keeps_a_model")]
    assert mine and held[mine[0]] == 2 * 4096 * 4, held
    assert not any(k.startswith("out (") for k in held), held
    blocks = [m for m in r["models"] if m[0] == "Block" and "llm" in m[7]]
    assert blocks and blocks[0][1] == 256 * 4, r["models"]
    del llm, out


# a serving engine's classes as a library keeps them (vLLM's V0 layout: the worker's KV cache in a CacheEngine)
_ENGINE_LIB = """
class CacheEngine(object):
    def __init__(self, n):
        self.gpu_cache = [empty(n) for _ in range(4)]
class Worker(object):
    def __init__(self, model, n):
        self.model = model
        self.cache_engine = [CacheEngine(n)]
        self.gpu_cache = [self.cache_engine[0].gpu_cache]
class Executor(object):
    def __init__(self, worker):
        self.driver_worker = worker
class LLMEngine(object):
    def __init__(self, ex):
        self.model_executor = ex
class LLM(object):
    def __init__(self, engine):
        self.llm_engine = engine
class Plain(object):
    def __init__(self, model, n):
        self.model = model
        self.blobs = [empty(n) for _ in range(4)]
"""


def t_library_object_path_purpose():
    """What an engine held by a local keeps, when neither the local's name nor its class says, is what the attribute
    paths to its bytes say: vLLM's LLM -> llm_engine -> driver_worker -> cache_engine (a CacheEngine) -> gpu_cache is
    its KV cache, though the worker's own gpu_cache (a shorter path saying only "cache") reaches the same tensors
    first; paths that say nothing (an engine's `blobs`) give no purpose"""
    build()
    g = {"__name__": "enginelib.worker", "empty": empty}
    exec(compile(_ENGINE_LIB, "/srv/site-packages/enginelib/worker.py", "exec"), g)
    llm = g["LLM"](g["LLMEngine"](g["Executor"](g["Worker"](Block(256), 8192))))
    plain = g["Plain"](Block(128), 4096)
    r = measure(None)
    held = dict((h[0], h) for h in r["holders"])
    mine = [k for k in held if k.startswith("llm (LLM, local in t_library_object_path_purpose")]
    assert mine and held[mine[0]][4] == 4 * 8192 * 4 and held[mine[0]][7] == "kv_cache", held
    other = [k for k in held if k.startswith("plain (Plain, local in t_library_object_path_purpose")]
    assert other and held[other[0]][4] == 4 * 4096 * 4 and held[other[0]][7] is None, held
    del llm, plain


def t_models_quantized():
    """models[].parameters_quantized_bytes: of one model's parameters on the device, those of 8 bits or fewer (an
    int8 weight beside its bfloat16 bias); the float32 model has none"""
    if STAND_IN:
        return
    build()
    g = globals()
    q = torch.nn.Linear(96, 96).to(torch.bfloat16)
    q.weight = torch.nn.Parameter(torch.zeros(96, 96, dtype=torch.int8), requires_grad=False)
    g["quantized"] = q
    try:
        r = measure(None)
        ms = dict((m[0], m) for m in r["models"])
        assert ms["Linear"][14] == 96 * 96 and ms["Linear"][1] == 96 * 96 + 96 * 2, ms["Linear"]
        assert ms["Net"][14] == 0 and ms["Net"][1] > 0, ms["Net"]
        assert any(l.startswith("model\tLinear\t") and l.split("\t")[15] == str(96 * 96)
                   for l in oomguard_roles.encode(r).splitlines())
    finally:
        g.pop("quantized", None)


class Recommender(torch.nn.Module):
    """Two embedding tables (one shared by two names) and a small tower."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.users = torch.nn.Embedding(1000, 16)
        self.items = torch.nn.EmbeddingBag(500, 16)
        self.items_again = self.items
        self.tower = torch.nn.Linear(32, 1)


def t_embedding_tables():
    """roles.embedding_bytes: the models' embedding tables (Embedding, EmbeddingBag), each storage once; the tower's
    weights are not counted; roles.embedding_tables: two tables, the one two names share once"""
    if STAND_IN:
        return
    build()
    g = globals()
    g["recommender"] = Recommender()
    try:
        r = measure(None)
        assert r["embedding_bytes"] == (1000 + 500) * 16 * 4, r["embedding_bytes"]
        assert "meta\tembedding_bytes\t%d" % ((1000 + 500) * 16 * 4) in oomguard_roles.encode(r)
        assert r["embedding_tables"] == 2 and "meta\tembedding_tables\t2" in oomguard_roles.encode(r), r
    finally:
        g.pop("recommender", None)


class CausalSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.proj = Block(256)


class Projections(torch.nn.Module):                   # named for nothing; holds the q/k/v projections
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj, self.k_proj, self.v_proj = Block(64), Block(64), Block(64)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = Block(128)                         # held under an attention name
        self.mlp = Block(128)


class Decoder(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.a, self.b, self.c = CausalSelfAttention(), Projections(), DecoderLayer()


def t_attention_modules():
    """roles.attention_modules: the layers the walk of the models takes for attention by their names (class,
    the parent's name for them, the q/k/v projections they hold); 0 when it met none (a graph network, an MLP)."""
    build()
    r = measure(None)
    assert r["attention_modules"] == 0, r["attention_modules"]         # Net: Blocks and a head, no attention
    assert "meta\tattention_modules\t0" in oomguard_roles.encode(r)
    g = globals()
    g["gpt"] = Decoder()
    try:
        r = measure(None)
        assert r["attention_modules"] == 3, r["attention_modules"]     # by class, by projections, self.attn
        assert oomguard_roles.is_attention(Block(4), "self_attn") and not oomguard_roles.is_attention(Block(4), "mlp")
        fused = Block(4)
        fused.self_attn = torch.nn.Parameter(empty(16))                 # one tensor for a whole attention layer
        assert oomguard_roles.is_attention(fused)
        del fused
        assert not oomguard_roles.is_attention(object())               # never raises on what is not a module
    finally:
        g.pop("gpt", None)
    for k in ("model", "opt", "views", "losses", "trainer"):
        g.pop(k, None)
    gc.collect()
    r = measure(None)
    assert r["models"] == [] and r["attention_modules"] is None, r            # no model: nothing said


def t_attention_real_mha():
    """torch.nn.MultiheadAttention (its class and its in_proj_weight) inside a real transformer layer."""
    build()
    g = globals()
    g["enc"] = torch.nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32)
    try:
        r = measure(None)
        assert r["attention_modules"] >= 1, r["attention_modules"]
        assert oomguard_roles.is_attention(enc.self_attn)
    finally:
        g.pop("enc", None)


def t_models_named():
    """A model only a list holds (a previous run's, kept by something else) is not held by a name; a model whose
    method runs (`self` of a running frame) is running."""
    build()
    g = globals()
    g["kept"] = [Net()]

    class Runner(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.w = torch.nn.Parameter(empty(8192))

        def run(self):
            return measure(None)
    try:
        r = Runner().run()
        ms = dict((m[0], m) for m in r["models"])
        assert ms["Net"][3] == 2 and ms["Net"][5] == 1 and ms["Net"][7] == ["model"], ms
        assert ms["Runner"][6] == 1 and ms["Runner"][5] == 0, ms
    finally:
        g.pop("kept", None)

    def rebuild():                                   # the new copy being built measures the old one's names
        got.append(measure(None))
        return Net()

    def cell():                                      # a cell run again: `net` still holds the first copy
        net = Net()
        net = rebuild()
        return net
    got = []
    cell()
    ms = dict((m[0], m) for m in got[0]["models"])
    assert ms["Net"][5] == 1 and "net" in ms["Net"][7], ms      # `model` names one; `net` is being rebound

    def from_pretrained(name):                       # a loader (the phase table's) building the model it returns:
        model = Net()                                # no method of the model runs, its weights are arriving
        return got.append(measure(None)) or model

    def prepare(name):                               # any other function holding a model as a local: not running
        model = Net()
        return got.append(measure(None)) or model
    for build_it, running in ((from_pretrained, 1), (prepare, 0)):
        got.clear()
        build_it("net")
        ms = [m for m in got[0]["models"] if m[0] == "Net"]
        assert max(m[6] for m in ms) == running, (build_it.__name__, ms)


def t_models_frozen_copy_apart():
    """A trained model and a frozen copy of it (a preference-tuning reference, an EMA) are separate groups, each with
    its own names and what they say; a second trainable copy stays in the trained model's group."""
    build()
    g = globals()
    g["ref_model"] = Net()
    for p in ref_model.parameters():
        p.requires_grad_(False)
    g["eval_model"] = Net()
    try:
        r = measure(None)
        nets = [m for m in r["models"] if m[0] == "Net"]
        assert len(nets) == 2, r["models"]
        trained = [m for m in nets if not m[4]][0]
        ref = [m for m in nets if m[4]][0]
        assert trained[3] == 2 and set(trained[7]) == {"model", "eval_model"} and trained[8] is None, nets
        assert ref[3] == 1 and ref[7] == ["ref_model"] and ref[8] == "reference", nets
        assert "\tref_model\treference" in oomguard_roles.encode(r), oomguard_roles.encode(r)
        # trained: of the two trainable copies the optimizer of build() holds one's parameters; none of the frozen
        assert trained[9] == 1 and ref[9] == 0, nets
        # stepped: build()'s optimizer has stepped (its state holds the model's parameters); none of the frozen's
        assert trained[10] == 1 and ref[10] == 0, nets
        g["opt2"] = torch.optim.AdamW(eval_model.parameters(), lr=1e-3)   # made, not stepped: no state yet
        nets = [m for m in measure(None)["models"] if m[0] == "Net" and not m[4]]
        assert nets[0][9] == 2 and nets[0][10] == 1, nets
        g.pop("opt2")
        g.pop("eval_model")
        g["teacher"] = Net()                     # a copy that still requires grad, which no optimizer trains
        r = measure(None)
        nets = dict((m[8], m) for m in r["models"] if m[0] == "Net")
        assert nets["teacher"][9] == 0 and not nets["teacher"][4] and nets[None][9] == 1, nets
        assert oomguard_roles.encode(r).count("\tteacher\t0") == 1, oomguard_roles.encode(r)
        g.pop("opt")                             # no optimizer holds a parameter: not known
        gc.collect()
        r = measure(None)
        assert all(m[9] is None for m in r["models"]), r["models"]
    finally:
        g.pop("ref_model", None)
        g.pop("eval_model", None)
        g.pop("teacher", None)


def t_lru_cache_results():
    """A module-level function under functools.lru_cache keeps every result it returned in the C wrapper's own
    cache, which no attribute reaches: the wrapper is a holder (kind lru_cache, purpose cache) of those results,
    all of them when unbounded, the last maxsize when bounded."""
    import functools
    build()
    g = globals()
    g["encode_doc"] = functools.lru_cache(maxsize=None)(lambda i: empty(1000 + i))
    g["embed_query"] = functools.lru_cache(maxsize=2)(lambda i: [empty(500)])
    try:
        for i in range(3):
            encode_doc(i)
            embed_query(i)
        r = measure(None)
        got = dict((h[0], (h[4], h[7])) for h in r["holders"])
        assert got["encode_doc (lru_cache, global in test_roles_phase.py)"] == ((1000 + 1001 + 1002) * 4, "cache"), got
        assert got["embed_query (lru_cache, global in test_roles_phase.py)"] == (2 * 500 * 4, "cache"), got
    finally:
        g.pop("encode_doc", None)
        g.pop("embed_query", None)


def t_models_in_a_map():
    """Models a dict of the program keeps by key (a registry of fine-tunes) are held by the running code, named
    NAME[key]; IPython's output history (Out) is not a name for a model."""
    build()
    g = globals()
    g["registry"] = {"tenant-a": Net(), "tenant-b": Net()}
    g["Out"] = {3: Net()}
    try:
        r = measure(None)
        nets = [m for m in r["models"] if m[0] == "Net"]
        keyed = [m for m in nets if m[7] == ["registry[key]"]]
        other = [m for m in nets if m[7] != ["registry[key]"]]
        # the entries only the map holds are a group of their own; `model` and Out's (no name) another
        assert len(keyed) == 1 and keyed[0][3] == 2 and keyed[0][5] == 2, nets
        assert len(other) == 1 and other[0][3] == 2 and other[0][5] == 1 and other[0][7] == ["model"], nets
    finally:
        g.pop("registry", None)
        g.pop("Out", None)


def t_restored_by_torch_load():
    """The adapter's restore hook, first in torch.serialization's registry: a storage torch.load restores onto a GPU
    is restored by the other entries, in the registry's order, and noted with the program's line; one restored to the
    host passes untouched; the roles give a holder of such tensors its restored bytes and that line.  (The real torch
    here has no GPU: an entry of the test restores a made-up "cuda:7" in host memory, as PyTorch's does on a GPU.)"""
    import tempfile
    import oomguard_torch
    build()
    oomguard_torch._watch_loads(torch)
    ser = sys.modules["torch.serialization"]
    assert ser._package_registry[0][2] is oomguard_torch._on_restore, ser._package_registry
    oomguard_torch._watch_loads(torch)                                     # once
    assert sum(1 for e in ser._package_registry if e[2] is oomguard_torch._on_restore) == 1

    def gpu7(obj, location):
        return obj if location == "cuda:7" else None
    entry = (15, lambda obj: None, gpu7)
    if not STAND_IN:
        ser._package_registry.append(entry)
        ser._package_registry.sort(key=lambda e: e[0])
    path = tempfile.mktemp(prefix="oomguard-restore-")
    g = globals()
    try:
        torch.save({"feats": empty(5000), "labels": empty(100)}, path)
        host = torch.load(path, map_location="cpu" if STAND_IN else None)  # to the host: nothing noted
        for t in host.values():
            if not STAND_IN:
                st = getattr(t, "untyped_storage", None) or getattr(t, "_storage")
                st = st()
                assert oomguard_torch.restored_storage(int(st.data_ptr()), int(st.nbytes())) is None
        line = sys._getframe().f_lineno + 1
        shard = torch.load(path, map_location=None if STAND_IN else {"cpu": "cuda:7"})
        g["shards"] = [shard]
        r = measure(None, restored=oomguard_torch.restored_storage)
        h = [h for h in r["holders"] if h[1] == "shards"]
        assert len(h) == 1 and h[0][10] == h[0][4] == nbytes(shard["feats"]) + nbytes(shard["labels"]), h
        assert h[0][11][1] == line and h[0][11][0].endswith("test_roles_phase.py"), h
        others = [x for x in r["holders"] if x[1] != "shards"]
        assert others and all(x[10] == 0 and x[11] is None for x in others), others
        assert all(len(x) == 16 and x[10] is None for x in measure(None)["holders"])   # not watched: unknown
    finally:
        g.pop("shards", None)
        if entry in ser._package_registry:
            ser._package_registry.remove(entry)
        if os.path.exists(path):
            os.unlink(path)


def t_logging_handler_records():
    """A logging.handlers.MemoryHandler keeps its records until it flushes: the tensors a record's arguments hold
    (a batch dict passed to log.debug) are the handler's, five levels below it (buffer, LogRecord, args, dict)."""
    import logging
    import logging.handlers
    build()
    g = globals()
    log = logging.getLogger("oomguard-test-records")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    g["recorder"] = logging.handlers.MemoryHandler(capacity=100, flushLevel=logging.CRITICAL)
    log.addHandler(recorder)
    try:
        batches = [{"video": empty(3000), "label": 1} for _ in range(3)]
        for b in batches:
            log.debug("batch %s", b)
        want = sum(nbytes(b["video"]) for b in batches)
        del batches, b
        r = measure(None)
        got = dict((h[0], h[4]) for h in r["holders"])
        assert got.get("recorder (MemoryHandler, global in test_roles_phase.py)") == want, got
    finally:
        log.removeHandler(recorder)
        recorder.buffer.clear()
        g.pop("recorder", None)


def t_models_in_an_lru_cache():
    """Models a functools.lru_cache function of the program returned and keeps are its entries by key, named
    after the function (get_net[key]), bounded or not; the one the running code also holds by a name (the entry
    it took out to run) is a group apart from the idle ones."""
    build()
    g = globals()
    for size in (None, 8):
        g["get_net"] = functools.lru_cache(maxsize=size)(lambda version: Net())
        try:
            for v in ("v1", "v2", "v3"):
                get_net(v)
            running = get_net("v3")                                        # noqa: F841 (held by a name)
            r = measure(None)
            nets = [m for m in r["models"] if m[0] == "Net"]
            idle = [m for m in nets if m[7] == ["get_net[key]"]]
            taken = [m for m in nets if "running" in m[7]]
            assert len(idle) == 1 and idle[0][3] == 2 and idle[0][5] == 2, (size, nets)
            # with the built `model`: both held by names of the running code
            assert len(taken) == 1 and taken[0][3] == 2 and "get_net[key]" in taken[0][7], (size, nets)
            running = None
        finally:
            g.pop("get_net", None)


def t_statement():
    """The failing statement: the name its result goes to and what that name says (an EMA made, a
    checkpoint restored), read from the frames' bytecode; the phase from it when no frame matches."""
    def helper(*args):
        return oomguard_phase.statement(sys._getframe())
    ema = helper()
    assert ema[3] == "ema" and ema[5] == "ema" and ema[2] == "t_statement", ema

    def update(ema_params):
        scaled = helper(ema_params, 0.999)
        return scaled
    got = update([1])
    assert got[3] == "scaled" and got[5] == "ema" and "ema_params" in got[4], got
    plain = helper()
    assert plain[3] == "plain" and plain[5] is None, plain

    def allocate_kv_cache(layers):
        blocks = []
        for _ in range(layers):
            v = helper(layers)
            blocks.append(v)
        return blocks
    kv = allocate_kv_cache(1)[0]                          # a function named for a KV cache names its tensors
    assert kv[3] == "v" and kv[5] == "kv_cache" and kv[2] == "allocate_kv_cache", kv

    def allocate_buffers(layers):
        b = helper(layers)
        return [b]
    other_fn = allocate_buffers(1)[0]                     # any other function's name says nothing
    assert other_fn[3] == "b" and other_fn[5] is None, other_fn

    def phase():
        return oomguard_phase.detect(sys._getframe(), 1, stmt=oomguard_phase.statement(sys._getframe()))
    ckpt_opt = phase()
    assert ckpt_opt[0] == "loading" and "ckpt_opt" in ckpt_opt[2], ckpt_opt
    model_ema = phase()
    assert model_ema[0] == "ema_update", model_ema
    other = phase()
    assert other[0] is None, other
    assert oomguard_phase.statement(None) is None
    users, seq = 8192, 4096
    scores = helper(users * N_ITEMS * 2)
    assert scores[6] == [8192, 2000000], scores          # the sizes it multiplied: a product
    att = helper(8 * seq * seq)
    assert att[6] == [4096, 4096], att                   # one length twice: quadratic in it
    spread = helper(users,
                    seq)                                 # a call over two lines, as a formatter lays it out
    assert spread[3] == "spread" and "users" in spread[4] and "seq" in spread[4], spread
    enc = oomguard_roles.encode({"roles": {}, "optimizers": {}, "holders": [], "allocated": 0, "complete": True,
                                 "elapsed_ms": 0, "objects": 0, "statement": att})
    assert enc.splitlines()[-6].endswith("\t4096,4096") or any(l.endswith("\t4096,4096") for l in enc.splitlines()), enc


N_ITEMS = 2000000


def t_framework_frames():
    """is_framework_frame reads the one table (common/framework_code.def): a module of a listed package
    wherever its file lies, or a file under a directory so named; site() skips them to the program's."""
    assert {"torch", "transformers", "accelerate", "jax", "diffusers"} <= oomguard_phase.FRAMEWORK_PACKAGES
    def frame_of(name, filename):
        g = {"__name__": name, "sys": sys}
        exec(compile("def f(inner=None):\n    return inner() if inner else sys._getframe()\n", filename, "exec"), g)
        return g["f"]
    assert oomguard_phase.is_framework_frame(frame_of("torch.autograd._engine", "/srv/x/engine.py")())
    assert oomguard_phase.is_framework_frame(frame_of("glue", "/opt/venv/lib/transformers/trainer.py")())
    assert not oomguard_phase.is_framework_frame(frame_of("mylib.train", "/srv/x/train_torchlike.py")())
    assert not oomguard_phase.is_framework_frame(sys._getframe())
    torch_f = frame_of("torch._glue", "/srv/y/glue.py")

    def callback():
        return sys._getframe()
    inner = torch_f(callback)                           # the framework calls back into the program: its own line
    assert oomguard_phase.site(inner) is inner
    f = torch_f()                                       # the framework's own frame: the line that called it
    assert oomguard_phase.site(f).f_code.co_name == "t_framework_frames", oomguard_phase.site(f)
    enc = oomguard_phase.encode("backward", ("/t/torch/a.py", 3, "backward"), "stack", ("/w/train.py", 9, "main"))
    assert enc[1] == "/t/torch/a.py\t3\tbackward\n/w/train.py\t9\tmain\n", enc


def t_standard_library_frames():
    """The standard library is not the program's either, by the one table's rows (OG_STANDARD_LIBRARY,
    OG_INSTALLED_PACKAGES): site() skips copy.deepcopy's frame to the line that called it, whatever
    interpreter's lib directory holds it; a package installed below it and a program's own copy.py are
    not the standard library; the operation table still reads the `copy` frame."""
    std = oomguard_phase.is_standard_library
    for f in ("/usr/lib/python3.11/copy.py", "/opt/conda/lib/python3.10/multiprocessing/pool.py",
              "/usr/lib64/python3.9/copy.py", "/usr/local/lib/python3.13t/threading.py", "<frozen runpy>"):
        assert std(f), f
    for f in ("/usr/local/lib/python3.11/dist-packages/numpy/core/a.py",
              "/w/.venv/lib/python3.11/site-packages/mylib/copy.py", "/usr/lib/python3/dist-packages/yaml/a.py",
              "/w/copy.py", "/w/lib/pythonX.Y/train.py", "<stdin>", "", None):
        assert not std(f), f

    def frame_of(name, filename):
        g = {"__name__": name, "sys": sys}
        exec(compile("def deepcopy(inner=None):\n    return inner() if inner else sys._getframe()\n",
                     filename, "exec"), g)
        return g["deepcopy"]
    # another interpreter's standard library (not under this one's prefix): still not the program's line
    other = frame_of("copy", "/opt/python3.11/lib/python3.11/copy.py")()
    assert oomguard_phase.site(other).f_code.co_name == "t_standard_library_frames", oomguard_phase.site(other)
    assert oomguard_phase.operation(other)[0] == "copy", oomguard_phase.operation(other)
    mine = frame_of("copy", "/srv/w/copy.py")()                 # the program's own copy.py is its own line
    assert oomguard_phase.site(mine) is mine


def t_backward_without_graph():
    """backward() on a tensor with no graph (it does not require grad, no grad_fn) raises PyTorch's RuntimeError
    and message, and makes no gradient: a plain tensor, a module's output under torch.no_grad or
    inference_mode, a detached output, the output of frozen parameters; the index of the offending element
    of a list, refused before any other element's gradient is made.  With a graph it runs."""
    class Lin(torch.nn.Module):
        def __init__(self, requires_grad=True):
            torch.nn.Module.__init__(self)
            self.weight = torch.nn.Parameter(empty(1), requires_grad=requires_grad)

        def forward(self):
            return self.weight.view(-1)

    def refused(fn, i=0):
        try:
            fn()
        except RuntimeError as e:
            want = "element %d of tensors does not require grad and does not have a grad_fn" % i
            assert str(e) == want, str(e)
            return
        raise AssertionError("backward() did not raise")
    m = Lin()
    refused(lambda: empty(1).backward())
    with torch.no_grad():
        out = m()
    refused(out.backward)
    with torch.inference_mode():
        out = m()
    refused(lambda: out.backward())
    refused(lambda: m().detach().backward())
    refused(lambda: Lin(False)().backward())
    refused(lambda: torch.autograd.backward([m(), empty(1)]), 1)
    assert m.weight.grad is None
    m().backward()                                       # a graph: the gradient is made
    assert m.weight.grad is not None
    out = m()
    with torch.no_grad():                                # backward itself under no_grad: the graph was made before
        out.backward()


def t_copy_made():
    """A copy.deepcopy under way: the operation `copy` from its frames, and what it made so far from the memo of its
    outermost frame (the copies made before the probe, not the originals); nothing outside a deepcopy."""
    import copy
    got = {}

    class Probe(object):
        def __deepcopy__(self, memo):
            got["op"] = oomguard_phase.operation(sys._getframe())
            got["r"] = measure(None)
            return Probe()
    src = {"a": empty(4096), "inner": {"b": empty(1024)}, "z": Probe()}
    dup = copy.deepcopy(src)
    assert got["op"] and got["op"][0] == "copy", got["op"]
    want = nbytes(src["a"]) + nbytes(src["inner"]["b"])
    assert got["r"]["copy_made"] == want, (got["r"]["copy_made"], want)
    assert "meta\tcopy_made\t%d" % want in oomguard_roles.encode(got["r"])
    del dup
    r = measure(None)
    assert r["copy_made"] is None, r["copy_made"]
    assert "meta\tcopy_made" not in oomguard_roles.encode(r)


check("roles of a model, its gradients, AdamW state, a view, global lists and an object's dict", t_roles)
check("an optimizer's state not shaped like its parameters (preconditioner matrices) is counted apart", t_optimizer_matrices)
check("gradients kept one per example (grad_sample) are counted apart, with the examples they hold", t_per_sample)
check("LoRA adapters' parameters, loralib's and PEFT's layouts", t_lora)
check("what a holder's name or class says it keeps (kv_cache, ema, checkpoint, teacher, cache)", t_purposes)
check("exceptions kept in a list hold what their tracebacks' frames held", t_kept_exceptions)
check("a holder whose blocks are the parameters' sizes is a copy of them (in part too)", t_copies)
check("models: roots by class and size, a second copy counted, a frozen one said", t_models)
check("models: held by a name of the running code, or only by a list; running when a method of theirs runs or "
      "a loader builds them",
      t_models_named)
check("models: a frozen copy (a reference) apart from the trained model, a trainable copy with it",
      t_models_frozen_copy_apart)
check("models a dict keeps by key are named after it; IPython's output history is not", t_models_in_a_map)
check("models an lru_cache function keeps are its entries by key, the idle ones a group apart", t_models_in_an_lru_cache)
check("torch.load's restore hook: what it restored onto a GPU, from which line, in a holder's bytes; the host untouched",
      t_restored_by_torch_load)
check("a logging MemoryHandler's buffered records: the tensors their arguments hold are the handler's",
      t_logging_handler_records)
check("attention layers of the models by their names; none in a model without them", t_attention_modules)
check("a function's lru_cache is a holder of the results it keeps (unbounded: all; bounded: the last maxsize)",
      t_lru_cache_results)
check("parameters by dtype; an optimizer holds the device's parameters before its first step",
      t_dtypes_optimizer_before_step)
check("the failing statement: its target, the names it reads, their purpose, the phase from it", t_statement)
check("a framework's frame by its module's package (the stand-in torch too), else by a directory; the program's line",
      t_framework_frames)
check("a holder that is a collection of like records says how many (a scene's cameras, a dict of batches)",
      t_holder_records)
check("a list local of a running function is a named holder; unknown allocated leaves activations unknown",
      t_local_holder)
check("a tensor staged whole by a running function, the call given a slice of it: a named holder", t_staged_local)
check("this process's multiprocessing children, by the name their starter gave them", t_child_processes)
check("modules and optimizers found through gc alone", t_gc_only)
check("the time budget stops the scan: incomplete, activations unknown", t_budget)
check("the standard library's frames are not the program's line; the operation table still reads them",
      t_standard_library_frames)
check("backward() on a tensor with no graph raises PyTorch's RuntimeError, no gradient made", t_backward_without_graph)
check("a deep copy under way: the operation copy, and the bytes its memo holds so far", t_copy_made)
check("a device test that raises never raises out of the role code", t_never_raises)
check("graphs a holder's outputs keep: a chain of steps each made from the last is one, separate passes each one",
      t_graph_chain)
check("phase loading: a model's __init__ making its weights, no loader on the stack; a plain class's, none",
      t_phase_model_built)
check("tensors inside a holder's objects and nested containers: the outermost named holder's, once", t_nested_holders)
check("nested holders within bounds: 100,000 records read in part, 20,000 cached objects whole, the budget said",
      t_nested_bounded)


# ------------------------------------------------------------------------------ the phase, real torch only

def expect_phase(got, phase, file_part=None, function=None, site=None):
    """site: (line, function) of the program's own line (this file) at or outside the frame that
    decided; None: that frame itself when it is this file's, else not checked."""
    ph, where, source, at = got
    assert ph == phase, got
    if file_part is not None:
        assert where is not None and file_part in where[0].replace(os.sep, "/"), got
    if function is not None:
        assert where[2] == function, got
    if site is not None:
        assert at is not None and at[0] == os.path.abspath(__file__) and (at[1], at[2]) == site, (got, site)
    elif where is not None and where[0] == os.path.abspath(__file__):
        assert at == where, got


def t_real_step():
    """A real forward, backward and AdamW step: the state the role code finds is PyTorch's."""
    lin = torch.nn.Linear(64, 32)
    o = torch.optim.AdamW(lin.parameters(), lr=1e-3)
    lin(torch.randn(8, 64)).sum().backward()
    o.step()
    st = [t for s in o.state.values() for t in s.values() if torch.is_tensor(t)]
    mine = set(t._storage().data_ptr() if not hasattr(t, "untyped_storage") else t.untyped_storage().data_ptr()
               for t in st + [p.grad for p in lin.parameters()] + list(lin.parameters()))
    r = oomguard_roles.measure(torch, 0, None, round_to=1, budget=5.0,
                               on_device=lambda t: t.device.type == "cpu" and (
                                   t._storage() if not hasattr(t, "untyped_storage") else t.untyped_storage()
                               ).data_ptr() in mine)
    pb = sum(nbytes(p) for p in lin.parameters())
    assert r["roles"]["parameters"][0] == pb, r["roles"]
    assert r["roles"]["gradients"][0] == pb, r["roles"]
    assert r["roles"]["optimizer_state"][0] == sum(nbytes(t) for t in st) >= 2 * pb, r["roles"]


def t_accumulation():
    """Losses of several passes summed with their graphs alive (backward once on the sum) are found in the
    running loop's frame; not after a backward per micro-batch (the graphs freed), not for a sum of numbers,
    not for a residual inside a module's forward (one pass), but in a module's forward that calls backward itself
    (a meta-learner's outer loop over tasks)."""
    lin = torch.nn.Linear(8, 8)

    def probe():
        return oomguard_phase.accumulation(sys._getframe(), None)

    def summed():
        total = None
        for i in range(3):
            loss = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            total = loss if total is None else total + loss
    got = summed()
    assert got is not None and got[2:] == ("summed", "total", "loss"), got

    def summed_inplace():
        acc = 0
        for i in range(3):
            out = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            acc += out
    got = summed_inplace()
    assert got is not None and got[3:] == ("acc", "out"), got

    class Out(object):                               # a model's output: the loss an attribute (out.loss)
        def __init__(self, loss):
            self.loss = loss

    def summed_attr():
        accum_loss = 0.0
        for i in range(3):
            out = Out(lin(torch.randn(4, 8)).tanh().sum())
            if i == 2:
                return probe()
            accum_loss += out.loss / 3
    got = summed_attr()
    assert got is not None and got[3:] == ("accum_loss", "out.loss"), got

    def each():
        total = None
        for i in range(3):
            loss = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            loss.backward()                              # frees this micro-batch's graph
            total = loss if total is None else total + loss
    assert each() is None

    def numbers():
        running = 0.0
        for i in range(3):
            loss = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            running = running + loss.item()
    assert numbers() is None

    class Residual(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.l = torch.nn.Linear(8, 8)

        def forward(self, x):
            h = self.l(x).tanh()
            r = self.l(h).tanh()
            h = h + r
            return probe()
    assert Residual()(torch.randn(4, 8)) is None

    class MetaLearner(torch.nn.Module):              # a training step written as forward: the outer loop over tasks
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.net = torch.nn.Linear(8, 8)

        def forward(self, tasks):
            loss_q_sum = 0
            for i in range(tasks):
                logits_q = self.net(torch.randn(4, 8)).tanh()
                if i == 2:
                    return probe()
                loss_q_sum = loss_q_sum + logits_q.sum()
            loss_q_sum.backward()
    got = MetaLearner()(3)
    assert got is not None and got[2:] == ("forward", "loss_q_sum", "logits_q"), got

    def listed():                                    # losses kept in a list for one backward on their mean
        losses = []
        for i in range(3):
            loss = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            losses.append(loss)
        torch.stack(losses).mean().backward()
    got = listed()
    assert got is not None and got[2:] == ("listed", "losses", None), got

    def listed_after_backward():                     # outputs kept after each backward (metrics): graphs freed
        outs = []
        for i in range(3):
            out = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            out.backward()
            outs.append(out)
    assert listed_after_backward() is None

    def listed_no_backward():                        # outputs collected with autograd on, no backward here
        outs = []
        for i in range(3):
            out = lin(torch.randn(4, 8)).tanh().sum()
            if i == 2:
                return probe()
            outs.append(out)
    assert listed_no_backward() is None
    assert oomguard_phase.graph_alive(torch.randn(3)) is False
    enc = oomguard_roles.encode({"roles": {}, "optimizers": {}, "holders": [], "allocated": 0, "complete": True,
                                 "elapsed_ms": 0, "objects": 0, "accumulating": ("/w/t.py", 7, "main", "total", "loss")})
    assert "accumulating\t/w/t.py\t7\tmain\ttotal\tloss" in enc, enc
    enc = oomguard_roles.encode({"roles": {}, "optimizers": {}, "holders": [], "allocated": 0, "complete": True,
                                 "elapsed_ms": 0, "objects": 0, "accumulating": ("/w/t.py", 7, "main", "losses", None)})
    assert "accumulating\t/w/t.py\t7\tmain\tlosses\t-" in enc, enc


def t_phase_forward():
    got = []

    class M(torch.nn.Module):
        def forward(self, x):
            got.append(oomguard_phase.detect(sys._getframe(), 1))
            return x
    m = M()
    m.register_forward_pre_hook(lambda mod, inp: got.append(oomguard_phase.detect(sys._getframe(), 1)))
    m(torch.zeros(1))
    expect_phase(got[0], "forward", "torch/nn/modules/module.py")      # the pre-hook: PyTorch's _call_impl
    expect_phase(got[1], "forward", "test_roles_phase.py", "forward")
    got2 = oomguard_phase.detect(sys._getframe(), 1)
    assert got2[0] is None and got2[1] is None, got2   # outside the module: no frame of a phase


def t_phase_generation_names():
    """A program's own generation loop (`generate_with_logprobs`) is generation; the causal mask torch's
    Transformer makes in `generate_square_subsequent_mask` during a training forward is not"""
    def generate_with_logprobs():
        return oomguard_phase.detect(sys._getframe(), 1)
    expect_phase(generate_with_logprobs(), "generation", "test_roles_phase.py", "generate_with_logprobs")
    got = []

    def profile(frame, event, arg):          # a C call made by the mask's own frame (torch.triu, torch.full)
        if event == "c_call" and frame.f_code.co_name == "generate_square_subsequent_mask" and not got:
            got.append(oomguard_phase.detect(frame, 1))

    class M(torch.nn.Module):
        def forward(self, x):
            sys.setprofile(profile)
            try:
                return torch.nn.Transformer.generate_square_subsequent_mask(4)
            finally:
                sys.setprofile(None)
    M()(torch.zeros(1))
    assert got, "the mask's frame was not seen"
    expect_phase(got[0], "forward", "test_roles_phase.py", "forward")


def t_phase_dequantize():
    """A model's dequantize() (quantized weights made full precision, transformers' model.dequantize()) is a load;
    bitsandbytes' dequantize_4bit, which every QLoRA forward calls, decides nothing: the module's forward does"""
    class M(torch.nn.Module):
        def dequantize(self):
            return oomguard_phase.detect(sys._getframe(), 0)

        def forward(self, x):
            def dequantize_4bit(w):
                return oomguard_phase.detect(sys._getframe(), 1)
            return dequantize_4bit(x)
    expect_phase(M().dequantize(), "loading", "test_roles_phase.py", "dequantize")
    expect_phase(M()(torch.zeros(1)), "forward", "test_roles_phase.py", "forward")


def t_phase_kbit_preparation():
    """PEFT's prepare_model_for_kbit_training casts a k-bit model's 16-bit parameters to float32 before any batch:
    weights arriving in a new dtype, a load"""
    def prepare_model_for_kbit_training(model):
        for m in model.modules():
            for name, p in list(m._parameters.items()):
                if p is not None and p.dtype == torch.bfloat16:
                    m._parameters[name] = torch.nn.Parameter(p.data.float(), requires_grad=False)
                    return oomguard_phase.detect(sys._getframe(), 0)
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    expect_phase(prepare_model_for_kbit_training(model), "loading", "test_roles_phase.py",
                 "prepare_model_for_kbit_training")


def t_checkpointing():
    """roles.gradient_checkpointing on real modules and torch.utils.checkpoint: off inside a layer run
    plainly, on inside checkpoint(), on with Hugging Face's flag, unknown in the model's own head"""
    import oomguard_torch
    import torch.utils.checkpoint as ckpt
    tdir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
    got = {}

    class Layer(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.lin = torch.nn.Linear(2, 2)

        def forward(self, x):
            got.setdefault("layer", []).append(oomguard_torch._checkpointing(sys._getframe(), "forward", 1, tdir))
            return self.lin(x)

    class Model(torch.nn.Module):
        def __init__(self, use_ckpt):
            torch.nn.Module.__init__(self)
            self.layer = Layer()
            self.use_ckpt = use_ckpt

        def forward(self, x):
            h = ckpt.checkpoint(self.layer, x) if self.use_ckpt else self.layer(x)
            got["head"] = oomguard_torch._checkpointing(sys._getframe(), "forward", 1, tdir)
            return h.sum()

    x = torch.zeros(1, 2, requires_grad=True)
    Model(False)(x)
    assert got["layer"] == [False], got
    assert got["head"] is None, got               # outside the layers: not told
    got.clear()
    Model(True)(x).backward()
    assert got["layer"][0] is True, got           # under checkpoint() (its recomputation in backward too)
    got.clear()
    m = Model(False)
    m.gradient_checkpointing = True               # Hugging Face's flag on the model
    m(x)
    assert got["layer"] == [True], got
    got.clear()
    with torch.no_grad():                         # autograd off: unknown
        got["off"] = oomguard_torch._checkpointing(sys._getframe(), "forward", -1, tdir)
    assert got["off"] is None, got


def t_failing_layer():
    """roles.failing_layer on real modules: the layer of an nn.ModuleList a model's forward loops over, named by its
    attribute, and of an nn.Sequential of like blocks running its own children (by its class); none in the model's
    head, in a Sequential of unlike modules (Linear, ReLU, Linear) or a run of fewer than four layers; a run of
    children named one stem and numbered (layer_1 .. layer_8) by its stem"""
    import oomguard_torch
    got = []

    class Block(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.mlp = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU(), torch.nn.Linear(2, 2),
                                           torch.nn.ReLU())

        def forward(self, x):
            return self.mlp(x)

    class Probe(torch.nn.Linear):
        def forward(self, x):
            got.append(oomguard_torch._failing_layer(sys._getframe()))
            return torch.nn.Linear.forward(self, x)

    class Model(torch.nn.Module):
        def __init__(self, n):
            torch.nn.Module.__init__(self)
            self.layers = torch.nn.ModuleList([Block() for _ in range(n)])
            self.head = Probe(2, 2)

        def forward(self, x):
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    m = Model(6)
    m.layers[4].mlp[2] = Probe(2, 2)              # the pass fails in the fifth block's second Linear
    x = torch.zeros(1, 2)
    m(x)
    assert got == [("layers", 4, 6, True), None], got   # in the head: no layer of the run
    got.clear()
    seq = torch.nn.Sequential(*[Block() for _ in range(5)])
    seq[1].mlp[0] = Probe(2, 2)
    seq(x)
    assert got == [("Sequential", 1, 5, True)], got
    got.clear()

    class Numbered(torch.nn.Module):             # setattr(self, "layer_%d" % i, Block()): a run by its stem
        def __init__(self):
            torch.nn.Module.__init__(self)
            for i in range(1, 9):
                setattr(self, "layer_%d" % i, Block())
            self.head_0 = Probe(2, 2)             # a numbered child alone is no run

        def forward(self, x):
            for i in range(1, 9):
                x = getattr(self, "layer_%d" % i)(x)
            return self.head_0(x)

    num = Numbered()
    num.layer_7.mlp[0] = Probe(2, 2)
    num(x)
    assert got == [("layer", 6, 8, True), None], got
    got.clear()

    class Stage(torch.nn.Module):                # stages of blocks (a Swin): the outer run, where the pass is overall
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.blocks = torch.nn.ModuleList([Block() for _ in range(4)])

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return x

    class Staged(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.stages = torch.nn.ModuleList([Stage() for _ in range(4)])

        def forward(self, x):
            for s in self.stages:
                x = s(x)
            return x

    st = Staged()
    st.stages[2].blocks[1].mlp[0] = Probe(2, 2)
    st(x)
    assert got == [("stages", 2, 4, True)], got
    got.clear()

    class Down(torch.nn.Module):                 # a U-Net's encoder: one class, channels doubling with depth
        def __init__(self, c_in, c_out):
            torch.nn.Module.__init__(self)
            self.conv = torch.nn.Linear(c_in, c_out)

        def forward(self, x):
            return self.conv(x)

    class Encoder(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.down = torch.nn.ModuleList([Down(2 * 2 ** i, 2 * 2 ** (i + 1)) for i in range(5)])

        def forward(self, x):
            for d in self.down:
                x = d(x)
            return x

    enc = Encoder()
    enc.down[1].conv = Probe(4, 8)
    enc(x.new_zeros(1, 2))
    assert got == [("down", 1, 5, False)], got
    got.clear()
    t5ish = Model(6)                              # the first layer's extra bias, under a tenth of a layer: alike
    t5ish.layers[0].mlp[0] = torch.nn.Linear(2, 2)
    t5ish.layers[0].mlp[0].extra = torch.nn.Parameter(torch.zeros(1))
    t5ish.layers[3].mlp[2] = Probe(2, 2)
    t5ish(x)
    assert got[0] == ("layers", 3, 6, True), got
    got.clear()
    short = Model(3)                              # three layers: no run to place it in
    short.layers[1].mlp[0] = Probe(2, 2)
    short(x)
    assert got == [None, None], got


def t_generation_input():
    """roles.generation_input from real tensors given to a module's generate(): a positional input, a keyword input
    among **kwargs, Hugging Face's inputs_tensor named by model_input_name; none for a one-dimension input, a plain
    function named generate, or no generate on the stack"""
    import oomguard_torch
    got = []

    class Captioner(torch.nn.Module):
        def __init__(self):
            torch.nn.Module.__init__(self)
            self.lin = torch.nn.Linear(2, 2)

        def step(self):
            got.append(oomguard_torch._generation_input(sys._getframe(), torch))

        def generate(self, pixel_values=None, num_beams=1, **kwargs):
            self.step()

    class HFStyle(Captioner):
        def generate(self, inputs=None, generation_config=None, **kwargs):
            inputs_tensor, model_input_name = kwargs.pop("input_ids"), "input_ids"
            self.step()

    m = Captioner()
    m.generate(torch.zeros(7, 3, 4, 4), num_beams=4)
    m.generate(input_features=torch.zeros(5, 8, 30))            # a keyword input of **kwargs
    HFStyle().generate(input_ids=torch.zeros(3, 11, dtype=torch.long))
    m.generate(torch.zeros(9))                                   # one dimension: no batch axis
    m.step()                                                     # no generate on the stack

    def generate(x):                                             # not a module's method
        got.append(oomguard_torch._generation_input(sys._getframe(), torch))
    generate(torch.zeros(2, 2))
    assert got == [("pixel_values", (7, 3, 4, 4)), ("input_features", (5, 8, 30)), ("input_ids", (3, 11)),
                   None, None, None], got
    r = measure(None)
    r["generation_input"] = got[0]
    enc = oomguard_roles.encode(r)
    assert "generation_input\tpixel_values\t7,3,4,4" in enc.split("\n"), enc


def t_batch_size():
    """roles.batch_size from the program's names: a local, a module constant, a config dict or object; not a
    loop's `batch` index, a global or accumulation count"""
    import types
    import oomguard_torch
    tdir = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep

    def probe():
        return oomguard_torch._batch_size(sys._getframe(1), tdir)

    def with_local():
        per_device_train_batch_size = 4  # noqa: F841
        return probe()

    def with_cfg():
        cfg = {"micro_batch_size": 1, "grad_accum": 16}  # noqa: F841
        return probe()

    def with_args():
        args = types.SimpleNamespace(global_batch_size=512, per_device_train_batch_size=2)  # noqa: F841
        return probe()

    def with_mmcv():  # MMCV's config: the loader's section holds the batch per GPU
        cfg = types.SimpleNamespace(data=types.SimpleNamespace(samples_per_gpu=1, workers_per_gpu=4),  # noqa: F841
                                    total_epochs=24)
        return probe()

    def with_mmengine():
        cfg = {"train_dataloader": {"batch_size": 2, "num_workers": 8}, "max_epochs": 12}  # noqa: F841
        return probe()

    def deeper_elsewhere():  # a batch name two levels down outside a loader's section is not read
        trainer = types.SimpleNamespace(state=types.SimpleNamespace(batch_size=3))  # noqa: F841
        return probe()

    def with_index():
        for batch in range(3):  # noqa: B007
            pass
        gradient_accumulation_steps, global_batch_size = 8, 512  # noqa: F841
        return probe()

    assert with_local() == 4
    assert with_cfg() == 1
    assert with_args() == 2
    assert with_index() is None, with_index()
    assert with_mmcv() == 1 and with_mmengine() == 2 and deeper_elsewhere() is None, \
        (with_mmcv(), with_mmengine(), deeper_elsewhere())
    # a module's constant counts where the running code reads it; one read only by a function not running (the
    # training loop's, while a validation pass runs) does not
    ns = {"BATCH": 8, "__name__": "prog", "probe": probe}
    exec(compile("def f():\n    n = BATCH\n    return probe()\ndef g():\n    return probe()\n",
                 "/tmp/prog.py", "exec"), ns)
    assert ns["f"]() == 8 and ns["g"]() is None, (ns["f"](), ns["g"]())
    ns = {"__name__": "prog", "probe": probe}
    exec(compile("BATCH_SIZE = 8\ndef train():\n    return [BATCH_SIZE]\ndef validate():\n    return probe()\n"
                 "got = validate()\n", "/tmp/prog.py", "exec"), ns)
    assert ns["got"] is None, ns["got"]
    # a constant no function of the program reads is the program's word for its batch
    ns = {"__name__": "prog", "probe": probe}
    exec(compile("batch_size = 1\ndef generate():\n    return probe()\ngot = generate()\n", "/tmp/prog.py", "exec"),
         ns)
    assert ns["got"] == 1, ns["got"]
    ns = {"__name__": "prog", "probe": probe}
    exec(compile("BATCH_SIZE = 8\ndef train():\n    return [probe() for _ in range(BATCH_SIZE)][0]\n"
                 "got = train()\n", "/tmp/prog.py", "exec"), ns)
    assert ns["got"] == 8, ns["got"]
    # a generator the running loop iterates is the loop's: the batch size it reads is the pass's
    ns = {"__name__": "prog", "probe": probe}
    src = ("per_device_train_batch_size = 1\ndef batches(n):\n    for _ in range(n):\n"
           "        yield [0] * per_device_train_batch_size\n"
           "def train():\n    for b in batches(2):\n        return probe()\n"
           "def other():\n    return [per_device_train_batch_size]\ngot = train()\n")
    exec(compile(src, "/tmp/prog.py", "exec"), ns)
    assert ns["got"] == 1, ns["got"]
    ns = {"__name__": "prog", "probe": probe}     # a plain function the loop calls is not its batches' source
    exec(compile(src.replace("    for _ in range(n):\n        yield", "    return").replace(
        "for b in batches(2):\n        return probe()", "batches(2)\n    return probe()"), "/tmp/prog.py", "exec"), ns)
    assert ns["got"] is None, ns["got"]
    # a notebook's globals name both passes' batches: each pass reads its own
    ns = {"train_batch": 8, "eval_batch_size": 64, "__name__": "prog", "tdir": tdir, "sys": sys,
          "oomguard_torch": oomguard_torch}
    exec(compile("def f(phase):\n    sizes = (train_batch, eval_batch_size)\n"
                 "    return oomguard_torch._batch_size(sys._getframe(0), tdir, phase=phase)\n",
                 "/tmp/notebook.py", "exec"), ns)
    assert ns["f"]("forward") == 8 and ns["f"]("backward") == 8, (ns["f"]("forward"), ns["f"]("backward"))
    assert ns["f"]("evaluation") == 64 and ns["f"]("generation") == 64, ns["f"]("evaluation")
    # a module deep in the model names its own batch (a window attention's: the inputs times their windows): the
    # program's word comes first, the module's only where the program names none
    ns = {"__name__": "prog", "tdir": tdir, "sys": sys, "oomguard_torch": oomguard_torch, "nn": torch.nn}
    exec(compile("class WindowAttention(nn.Module):\n"
                 "    def forward(self, x):\n"
                 "        batch_size = 12288\n"
                 "        return oomguard_torch._batch_size(sys._getframe(0), tdir, module_type=nn.Module)\n"
                 "BATCH_SIZE = 4\n"
                 "def split(m):\n    return m(BATCH_SIZE)\n"
                 "def bare(m):\n    return m(None)\n",
                 "/tmp/prog.py", "exec"), ns)
    m = ns["WindowAttention"]()
    assert ns["split"](m) == 4, ns["split"](m)
    del ns["BATCH_SIZE"]
    assert ns["bare"](m) == 12288, ns["bare"](m)


def t_input_batch():
    """a batch of one read from the model's input where no name says: the outermost module's first tensor argument
    with a leading 1; a leading 8 (maybe a time-major length) or no module on the stack says nothing"""
    import oomguard_torch
    got = []

    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            got.append(oomguard_torch._input_batch(sys._getframe(), torch))
            return x

    class Separator(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = Layer()

        def forward(self, mix, lengths=None):
            return self.layer(mix.reshape(8, -1))      # the layer's own input: 8 rows of one track

    sep = Separator()
    sep(torch.zeros(1, 2, 16))
    sep(torch.zeros(8, 2, 2))
    sep.layer(torch.zeros(1, 4))
    assert got == [1, None, 1], got
    assert oomguard_torch._input_batch(sys._getframe(), torch) is None


def t_input_requires_grad():
    """roles.input_requires_grad: the outermost module's tensor argument requires grad (a saliency map's input), not a
    parameter passed in, nor an input that does not; no module on the stack says nothing.  The models' training
    mode: how many roots of a group are in training mode"""
    import oomguard_torch
    got = []

    class SaliencyNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            got.append(oomguard_torch._input_requires_grad(sys._getframe(), torch))
            return self.lin(x)

    net = SaliencyNet().eval()
    net(torch.zeros(2, 4, requires_grad=True))
    net(torch.zeros(2, 4))
    net(torch.nn.Parameter(torch.zeros(2, 4)))
    assert got == [True, None, None], got
    assert oomguard_torch._input_requires_grad(sys._getframe(), torch) is None
    g = globals()
    g["probe_net"] = net
    try:
        r = measure(None)
        m = [m for m in r["models"] if m[0] == "SaliencyNet"]
        assert m and m[0][12] == 0, r["models"]                    # eval(): none in training mode
        net.train()
        m = [m for m in measure(None)["models"] if m[0] == "SaliencyNet"]
        assert m and m[0][12] == 1, m
        enc = oomguard_roles.encode(measure(None))
        assert any(l.startswith("model\tSaliencyNet\t") and l.split("\t")[13] == "1" for l in enc.splitlines()), enc
    finally:
        g.pop("probe_net", None)


def t_steps_over_the_run():
    """The step hook keeps the latest 32 steps and a series over the whole run: after 96 steps, every 4th
    step's allocated bytes (24 points, oldest first), so an iteration of 16 steps that keeps memory is a
    staircase there while the latest steps show one rise."""
    import oomguard_torch
    st = oomguard_torch._state
    saved = (oomguard_torch._allocated_now, dict(oomguard_torch._step_series), dict(oomguard_torch._device_steps),
             st["steps_from_start"], st["step_hook"])
    oomguard_torch._step_series.clear()
    oomguard_torch._device_steps.clear()
    step = [0]
    oomguard_torch._allocated_now = lambda torch: (0, 1000 + step[0] // 16)
    try:
        st["steps_from_start"], st["step_hook"] = True, st["step_hook"] or object()
        opt = object()
        for step[0] in range(96):
            oomguard_torch._on_optimizer_step(opt, (), {})
        made, latest, every, run, on_device = oomguard_torch._steps_of(0)
        assert made == 96 and len(latest) == 32 and latest[0] == 1004 and latest[-1] == 1005, (made, latest)
        assert every == 4 and len(run) == 24, (every, run)
        assert run == [1000 + (4 * (i + 1) - 1) // 16 for i in range(24)], run
        # every optimizer's steps on the device: this one's alone, then a second's (a new one per client) as well
        assert on_device == 96, on_device
        opt2 = object()
        for _ in range(5):
            oomguard_torch._on_optimizer_step(opt2, (), {})
        assert oomguard_torch._steps_of(0)[0] == 96 and oomguard_torch._steps_of(0)[4] == 101, \
            oomguard_torch._steps_of(0)
        assert oomguard_torch._steps_of(1) == (0, [], 1, [], 0)  # every step watched, none on device 1
        st["steps_from_start"] = False  # steps before the hook may have been missed: the device's count is unknown
        assert oomguard_torch._steps_of(0)[4] is None and oomguard_torch._steps_of(1) is None
    finally:
        oomguard_torch._allocated_now = saved[0]
        oomguard_torch._step_series.clear()
        oomguard_torch._step_series.update(saved[1])
        oomguard_torch._device_steps.clear()
        oomguard_torch._device_steps.update(saved[2])
        st["steps_from_start"], st["step_hook"] = saved[3], saved[4]


def t_autocast_in_code():
    """roles.autocast_in_code: a function of the program on the stack that enters torch.autocast (its code names
    it), though autocast is off at the probe; a function that does not: None"""
    import oomguard_phase

    def probe():
        return oomguard_phase.autocast_in_code(sys._getframe(1))

    ns = {"__name__": "prog", "torch": torch, "probe": probe}
    # f: the autocast block, then the probe after it (where a loss computed after the block would fail)
    exec(compile("def f():\n    with torch.autocast('cpu'):\n        pass\n    return probe()\n"
                 "def g():\n    return probe()\n", "/tmp/prog_amp.py", "exec"), ns)
    assert ns["f"]() is True
    assert ns["g"]() is None, ns["g"]()


def t_backward_in_code():
    """roles.backward_in_code: a running function of the program that calls backward (a closure an optimizer outside
    torch calls, Lightning's manual_backward); one that only runs the model: None"""
    import oomguard_phase
    got = []

    class Loss(object):
        def backward(self):
            pass

    def probe():
        got.append(oomguard_phase.backward_in_code(sys._getframe(1)))
        return Loss()

    class Module(object):
        def manual_backward(self, loss):
            pass

    ns = {"__name__": "prog", "probe": probe}
    exec(compile("def closure():\n    loss = probe()\n    loss.backward()\n    return loss\n"
                 "def step(self):\n    out = probe()\n    self.manual_backward(out)\n    return out\n"
                 "def evaluate():\n    return probe()\n", "/tmp/prog_fit.py", "exec"), ns)
    ns["closure"](), ns["step"](Module()), ns["evaluate"]()
    assert got == [True, True, None], got


def t_backward_on_stack():
    """roles.backward_on_stack: a frame that calls backward (loss.backward(), manual_backward, Lightning's closure's
    _backward_fn, autograd.grad) says True; a frame that only runs the model says False; a script's module code
    that defines a function named backward and calls the model calls nothing: False"""
    import oomguard_phase
    got = []

    class Loss(object):
        def backward(self):
            pass

    def probe():
        got.append(oomguard_phase.backward_on_stack(sys._getframe(1), limit=1))
        return Loss()

    class Module(object):
        def manual_backward(self, loss):
            pass

        def _backward_fn(self, loss):
            pass

    ns = {"__name__": "prog", "probe": probe, "torch": torch}
    exec(compile("def closure():\n    loss = probe()\n    loss.backward()\n    return loss\n"
                 "def step(self):\n    out = probe()\n    self.manual_backward(out)\n    return out\n"
                 "def lightning(self):\n    self._backward_fn(probe())\n"
                 "def penalty(x):\n    return torch.autograd.grad(probe(), x)\n"
                 "def evaluate():\n    return probe()\n", "/tmp/prog_fit.py", "exec"), ns)
    ns["closure"](), ns["step"](Module()), ns["lightning"](Module()), ns["evaluate"]()
    try:
        ns["penalty"](None)
    except Exception:
        pass
    exec(compile("def backward(loss):\n    pass\nresult = probe()\n", "/tmp/prog_script.py", "exec"),
         {"__name__": "__main__", "probe": probe})
    assert got == [True, True, True, False, True, False], got
    assert oomguard_phase.backward_on_stack(None) is None
    # a pipeline schedule's step: every micro-batch's forward, then each one's backward through the stage
    got.clear()

    class Stage(object):
        def backward_one_chunk(self, i, grad):
            pass

    exec(compile("def step_microbatches(stage, n):\n    outs = []\n    for _ in range(n):\n"
                 "        outs.append(probe())\n    for i in range(n):\n"
                 "        stage.backward_one_chunk(i, None)\n",
                 "/tmp/prog_pipe.py", "exec"), ns)
    ns["step_microbatches"](Stage(), 1)
    assert got == [True], got


def t_scaler_without_autocast():
    """roles.scaler_without_autocast: the running loop names a GradScaler and the program's file names autocast
    nowhere (a comment or a string saying it does not count); autocast in a helper of the same file that is not
    running: None (the program does enter it)"""
    import tempfile
    import oomguard_phase

    def probe():
        return oomguard_phase.scaler_without_autocast(sys._getframe(1))

    def run(src):
        path = os.path.join(tempfile.mkdtemp(prefix="oomguard-scaler-"), "train_seg.py")
        with open(path, "w") as f:
            f.write(src)
        ns = {"__name__": "prog", "probe": probe, "torch": torch}
        exec(compile(src, path, "exec"), ns)
        return ns["train"]()

    loop = ("def train():\n    scaler = torch.cuda.amp.GradScaler()   # fp16 with autocast, said a comment\n"
            "    return probe()\n")
    assert run(loop) is True
    assert run(loop + "s = 'autocast'\n") is True
    assert run(loop + "def fwd(m, x):\n    with torch.autocast('cuda'):\n        return m(x)\n") is None
    assert run("def train():\n    return probe()\n") is None


def t_code_settings():
    """roles.padding_to_max_length and roles.extra_outputs: a line of the program's own source (a file of a function
    on the failing stack) whose code sets one, found though the function that sets it is not running; the same
    words in a docstring or a comment, or padding=True, are not it; the facts are common/code_settings.def's"""
    import re
    import tempfile
    import oomguard_phase
    import oomguard_roles

    def probe():
        return oomguard_phase.code_settings(sys._getframe(1))

    def run(src):
        d = tempfile.mkdtemp(prefix="oomguard-settings-")
        path = os.path.join(d, "train_cls.py")
        with open(path, "w") as f:
            f.write(src)
        ns = {"__name__": "prog", "probe": probe}
        exec(compile(src, path, "exec"), ns)
        return path, ns["train"]()

    tokenize_fn = ("def tokenize(tok, texts):\n"
                   "    return tok(texts, truncation=True,\n"
                   "               padding='max_length', max_length=512)\n")
    path, got = run('"""Pads with padding="max_length" (a docstring)."""\n' + tokenize_fn +
                    "def embed(model, b):\n    return model(**b, output_hidden_states=True)\n"
                    "def train():\n    return probe()\n")
    assert got == {"padding_to_max_length": (path, 4, "tokenize", "padding"),
                   "extra_outputs": (path, 6, "embed", "output_hidden_states")}, got
    _, got = run('"""padding="max_length" in a docstring"""\n# padding="max_length"\n'
                 "def train():\n    enc = dict(padding=True, output_scores=False)\n    return probe()\n")
    assert got == {}, got
    _, got = run("CFG = {'padding': 'max_length'}\ndef train():\n    return probe()\n")
    assert got["padding_to_max_length"][1:] == (1, "<module>", "padding"), got
    enc = oomguard_roles.encode({"roles": {}, "optimizers": {}, "holders": [], "allocated": 0, "complete": True,
                                 "elapsed_ms": 0, "objects": 0,
                                 "code_settings": {"padding_to_max_length": ("/w/t.py", 4, "tokenize", "padding")}})
    assert "setting\tpadding_to_max_length\t/w/t.py\t4\ttokenize\tpadding" in enc, enc
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, os.pardir, os.pardir, os.pardir, "common", "code_settings.def")) as f:
        listed = re.findall(r"^OG_CODE_SETTING\((\w+),", f.read(), re.M)
    assert sorted(listed) == sorted(set(fact for fact, _, _ in oomguard_phase.CODE_SETTINGS)), listed


def t_phase_eval_flag():
    got = []

    class M(torch.nn.Module):
        def forward(self, x):
            got.append(oomguard_phase.detect(sys._getframe(), -1 if not torch.is_grad_enabled() else 1))
            return x
    with torch.no_grad():
        M()(torch.zeros(1))
    assert got[0][0] == "evaluation" and got[0][2] == "stack and autograd off", got


def t_phase_eval_mode():
    """model.eval() with autograd on: an evaluation that forgot no_grad; a frozen submodule in eval mode
    inside a training model's forward is still a forward."""
    got = []

    class Inner(torch.nn.Module):
        def forward(self, x):
            got.append(oomguard_phase.detect(sys._getframe(), 1))
            return x

    class Outer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = Inner()

        def forward(self, x):
            return self.inner(x)
    m = Outer()
    m.eval()
    m(torch.zeros(1))
    assert got[0][0] == "evaluation" and got[0][2] == "stack and the model in eval mode", got
    m.train()
    m.inner.eval()
    m(torch.zeros(1))
    assert got[1][0] == "forward" and got[1][2] == "stack", got


def t_phase_backward():
    got, other = [], []
    x = torch.ones(3, requires_grad=True)
    y = (x * 2).sum()

    def hook(g):
        got.append(oomguard_phase.detect(sys._getframe(), 1))
        # an engine thread of PyTorch's has no Python frame: the caller thread tells the phase
        done = _thread.allocate_lock()
        done.acquire()

        def engine():
            other.append(oomguard_phase.detect(None, 0))
            done.release()
        _thread.start_new_thread(engine, ())
        done.acquire()
        return g
    x.register_hook(hook)
    line = sys._getframe().f_lineno + 1
    y.backward()
    # the framework's frame decides; the program's line shown is the call to backward()
    expect_phase(got[0], "backward", "torch/autograd/", site=(line, "t_phase_backward"))
    expect_phase(other[0], "backward", "torch/autograd/", site=(line, "t_phase_backward"))
    assert other[0][2] == "thread that called backward()", other


def t_phase_backward_through_a_library():
    """loss.backward() called by a library of the framework table (accelerate's backward(loss), by its
    module's name wherever its file lies): the program's line is the one that called the library."""
    got = []
    x = torch.ones(3, requires_grad=True)
    x.register_hook(lambda g: got.append(oomguard_phase.detect(sys._getframe(), 1)) or g)
    lib = {"__name__": "accelerate.accelerator"}
    exec(compile("def backward(loss):\n    loss.backward()\n", "/srv/vendored/accel_backward.py", "exec"), lib)
    line = sys._getframe().f_lineno + 1
    lib["backward"]((x * 2).sum())
    expect_phase(got[0], "backward", "torch/autograd/", site=(line, "t_phase_backward_through_a_library"))


def t_phase_step():
    got = []
    lin = torch.nn.Linear(4, 2)
    o = torch.optim.AdamW(lin.parameters())

    def closure():
        got.append(oomguard_phase.detect(sys._getframe(), 1))
        loss = lin(torch.ones(1, 4)).sum()
        loss.backward()
        return loss
    line = sys._getframe().f_lineno + 1
    o.step(closure)
    expect_phase(got[0], "optimizer_step", "torch/optim/", site=(line, "t_phase_step"))


def t_phase_loading():
    got = []
    buf = io.BytesIO()
    torch.save({"w": torch.ones(4)}, buf)
    buf.seek(0)

    def where(storage, location):
        got.append(oomguard_phase.detect(sys._getframe(), 1))
        return storage
    torch.load(buf, map_location=where)
    expect_phase(got[0], "loading", "torch/serialization.py")
    lin = torch.nn.Linear(2, 2)
    lin._register_load_state_dict_pre_hook(lambda *a, **k: got.append(oomguard_phase.detect(sys._getframe(), 1)))
    lin.load_state_dict(torch.nn.Linear(2, 2).state_dict())
    expect_phase(got[1], "loading", "torch/nn/modules/module.py")

    class Moved(torch.nn.Linear):
        def _apply(self, fn, *a, **k):
            got.append(oomguard_phase.detect(sys._getframe(), 1))
            return torch.nn.Linear._apply(self, fn, *a, **k)
    Moved(2, 2).to(torch.float64)
    expect_phase(got[2], "loading", "torch/nn/modules/module.py", "to")


def t_phase_handler():
    def work():
        try:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        except torch.cuda.OutOfMemoryError:
            return oomguard_phase.detect(sys._getframe(), 1), sys._getframe().f_lineno
    got, line = work()
    expect_phase(got, "oom_handler", "test_roles_phase.py", "work")
    assert got[1][1] == line, (got, line)
    # after the handler: not in it any more
    assert oomguard_phase.detect(sys._getframe(), 1)[0] != "oom_handler"


def t_operation_real_frames():
    """The failing operation from PyTorch's own frames: F.cross_entropy, F.interpolate and Conv2d, each seen from inside
    (a Tensor subclass's __torch_function__ runs in their frame)."""
    seen = {}

    class Probe(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func.__name__ not in seen:
                seen[func.__name__] = oomguard_phase.operation(sys._getframe(1))
            return super().__torch_function__(func, types, args, kwargs or {})
    logits = torch.zeros(4, 10).as_subclass(Probe)
    torch.nn.functional.cross_entropy(logits, torch.zeros(4, dtype=torch.long))
    img = torch.zeros(1, 3, 8, 8).as_subclass(Probe)
    torch.nn.functional.interpolate(img, scale_factor=2.0)
    torch.nn.Conv2d(3, 4, 3)(img)  # conv2d is a builtin: its caller, Conv2d._conv_forward in nn/modules/conv.py
    ce, up, cv = seen.get("cross_entropy"), seen.get("interpolate"), seen.get("conv2d")
    assert ce and ce[0] == "cross_entropy" and ce[1][0].endswith("torch/nn/functional.py"), seen
    assert up and up[0] == "image_decode" and up[1][2] == "interpolate", seen
    assert cv and cv[0] == "conv" and cv[1][0].endswith("torch/nn/modules/conv.py"), seen
    assert oomguard_phase.operation(sys._getframe()) is None
    # attention computed eagerly, as a model file of transformers defines it (a function of that name), with the
    # score matrix a matmul makes inside it; sdpa's function is not it
    ns = {"torch": torch, "probe": lambda: oomguard_phase.operation(sys._getframe(1))}
    exec(compile("def eager_attention_forward(q, k):\n    w = torch.matmul(q, k.transpose(2, 3))\n"
                 "    return probe()\n"
                 "def sdpa_attention_forward(q, k):\n    return probe()\n",
                 "/srv/site-packages/transformers/models/mistral/modeling_mistral.py", "exec"), ns)
    q = torch.zeros(1, 2, 4, 8)
    got = ns["eager_attention_forward"](q, q)
    assert got and got[0] == "attention" and got[1][2] == "eager_attention_forward", got
    assert ns["sdpa_attention_forward"](q, q) is None
    # a dense 4D mask made whole by transformers' mask utilities (a packed batch's block-causal mask), inside a model's
    # _update_causal_mask: the operation attention_mask, the innermost frame
    exec(compile("def _unmask_unattended(m):\n    return probe()\n"
                 "def _update_causal_mask(m):\n    return _unmask_unattended(m)\n",
                 "/srv/site-packages/transformers/modeling_attn_mask_utils.py", "exec"), ns)
    got = ns["_update_causal_mask"](q)
    assert got and got[0] == "attention_mask" and got[1][2] == "_unmask_unattended", got
    # the table's operations are the analysis's list, no more and no fewer (common/operations.def)
    import re
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, os.pardir, os.pardir, os.pardir, "common", "operations.def")) as f:
        listed = re.findall(r"^OG_OPERATION\((\w+)\)", f.read(), re.M)
    assert listed and sorted(listed) == sorted(set(row[0] for row in oomguard_phase.OPERATIONS)), listed


def t_operation_conv_block():
    """A block of any name whose layers with weights are all real convolutions and normalizations (ResNet's
    BasicBlock, ESRGAN's dense block): what fails in its forward, a torch.cat of feature maps, is the operation conv;
    a block with a Linear layer is not one, nor a network of more modules than a block has."""
    seen = {}

    def probe(key):
        seen[key] = oomguard_phase.operation(sys._getframe(1))

    class DenseBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = torch.nn.Conv2d(4, 4, 3, padding=1)
            self.norm = torch.nn.BatchNorm2d(4)
            self.act = torch.nn.ReLU()
            self.conv2 = torch.nn.Conv2d(8, 4, 3, padding=1)

        def forward(self, x):
            x1 = self.act(self.norm(self.conv1(x)))
            probe("dense")
            return self.conv2(torch.cat((x, x1), 1))

    class MixedBlock(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(4, 4, 1)
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x):
            probe("mixed")
            return self.conv(x)

    class Network(torch.nn.Module):
        def __init__(self, n):
            super().__init__()
            self.blocks = torch.nn.ModuleList(torch.nn.Conv2d(4, 4, 1) for _ in range(n))

        def forward(self, x):
            probe("network")
            return x

    img = torch.zeros(1, 4, 8, 8)
    DenseBlock()(img)
    MixedBlock()(img)
    Network(8)(img)
    Network(80)(img)
    assert seen["dense"] and seen["dense"][0] == "conv" and seen["dense"][1][2] == "forward", seen
    assert seen["mixed"] is None, seen
    assert seen["network"] is None, seen          # the 80-layer one, read last
    assert oomguard_phase.conv_block(Network(8)) and not oomguard_phase.conv_block(Network(80))
    assert not oomguard_phase.conv_block(torch.nn.Sequential(torch.nn.BatchNorm2d(4), torch.nn.ReLU()))
    assert not oomguard_phase.conv_block(object())


def t_operation_graph_messages():
    """A graph convolution's forward (a module class named GATConv or SAGEConv, as PyTorch Geometric names them) is
    the operation graph_messages, not an image convolution; a class merely named *Conv* stays conv."""
    seen = {}

    def probe(key):
        seen[key] = oomguard_phase.operation(sys._getframe(1))

    class GATConv(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x, edge_index):
            probe("gat")
            return self.lin(x)

    class SAGEConv(GATConv):
        def forward(self, x, edge_index):
            probe("sage")
            return self.lin(x)

    class ConvHead(GATConv):
        def forward(self, x, edge_index):
            probe("head")
            return self.lin(x)

    x, ei = torch.zeros(3, 4), torch.zeros(2, 5, dtype=torch.long)
    GATConv()(x, ei)
    SAGEConv()(x, ei)
    ConvHead()(x, ei)
    assert seen["gat"] and seen["gat"][0] == "graph_messages" and seen["gat"][1][2] == "forward", seen
    assert seen["sage"] and seen["sage"][0] == "graph_messages", seen
    assert seen["head"] and seen["head"][0] == "conv", seen


def t_holder_graphs():
    """roles.holders[].graphs: outputs of separate real forwards kept in a list with autograd on keep their graphs
    (their saved tensors readable); outputs of one pass count once; detached, or after a backward freed them, none."""
    build()
    g = globals()
    lin = torch.nn.Linear(16, 16)
    x = torch.randn(4, 16)
    try:
        g["kept"] = [lin(x).sum() for _ in range(3)]
        r = measure(None)
        h = dict((v[1], v) for v in r["holders"])
        assert h["kept"][9] == 3, h["kept"]
        g["kept"] = [lin(x).sum().detach() for _ in range(3)]
        r = measure(None)
        assert dict((v[1], v) for v in r["holders"])["kept"][9] == 0
        out = lin(x)
        g["kept"] = [out[0], out[1], out[2]]             # three views of one pass's output: one graph
        r = measure(None)
        assert dict((v[1], v) for v in r["holders"])["kept"][9] == 1
        g["kept"] = [lin(x).sum() for _ in range(3)]
        for t in kept:
            t.backward()                                 # frees each graph's saved tensors
        r = measure(None)
        assert dict((v[1], v) for v in r["holders"])["kept"][9] == 0
    finally:
        g.pop("kept", None)


def t_ddp_buckets():
    """DistributedDataParallel (gloo, one rank, CPU): without gradient_as_bucket_view its buckets copy the gradients
    of the parameters that require grad; with it, nothing is reported."""
    import tempfile
    import torch.distributed as dist
    path = tempfile.mktemp(prefix="oomguard-ddp-")
    dist.init_process_group("gloo", init_method="file://" + path, rank=0, world_size=1)
    g = globals()
    try:
        net = Net()
        net.b.weight.requires_grad_(False)
        g["ddp"] = torch.nn.parallel.DistributedDataParallel(net)
        r = measure(None)
        want = nbytes(net.a.weight) + nbytes(net.head)
        assert r["ddp"] == (1, want), (r["ddp"], want)
        assert "ddp\t1\t%d" % want in oomguard_roles.encode(r)
        g["ddp"] = torch.nn.parallel.DistributedDataParallel(Net(), gradient_as_bucket_view=True)
        gc.collect()
        r = measure(None)
        assert r["ddp"] is None, r["ddp"]
    finally:
        g.pop("ddp", None)
        dist.destroy_process_group()
        if os.path.exists(path):
            os.unlink(path)


def t_operation_mha_weights():
    """nn.MultiheadAttention asked for its weights (need_weights=True, its default) makes its score matrices in
    torch's multi_head_attention_forward: the operation attention, the argument its row read need_weights=True;
    asked for none, no eager attention is read (PyTorch 2 runs its fused kernel then)."""
    seen, real = [], torch.bmm

    def probe(*a, **k):
        seen.append(oomguard_phase.operation(sys._getframe(1)))
        return real(*a, **k)
    mha = torch.nn.MultiheadAttention(8, 2)
    x = torch.zeros(4, 1, 8)
    torch.bmm = probe
    try:
        mha(x, x, x)
        weights = list(seen)
        del seen[:]
        mha(x, x, x, need_weights=False)
    finally:
        torch.bmm = real
    assert weights and weights[0][0] == "attention", weights
    assert weights[0][1][2] == "multi_head_attention_forward" and weights[0][2] == "need_weights=True", weights
    r = measure(None)
    r["operation"] = weights[0]
    assert "\tmulti_head_attention_forward\tneed_weights=True" in oomguard_roles.encode(r)
    assert seen and all(s is None for s in seen), seen


def t_phase_patterns_real_files():
    """The table's PyTorch file patterns name files this torch has (the layout has not drifted)."""
    base = os.path.dirname(os.path.abspath(torch.__file__))
    checked = 0
    for phase, prio, fpat, npat in oomguard_phase.PATTERNS:
        if not fpat.startswith("*/torch/") or "*" in fpat[len("*/torch/"):]:
            continue
        rel = fpat[len("*/torch/"):]
        if rel in ("autograd/graph.py", "distributed/_functional_collectives*.py"):
            continue                                     # newer than 1.13
        assert os.path.exists(os.path.join(base, rel)), fpat
        checked += 1
    assert checked >= 5, checked


if not STAND_IN:
    check("a real Linear, backward and AdamW step: parameters, gradients, state as PyTorch made them",
          t_real_step)
    check("losses summed with their graphs alive; not after a backward each, numbers or a residual", t_accumulation)
    check("phase forward: PyTorch's _call_impl (a pre-hook) and the module's forward", t_phase_forward)
    check("phase generation: a program's generate_* loop; not torch's generate_square_subsequent_mask",
          t_phase_generation_names)
    check("phase evaluation: a forward pass with autograd off", t_phase_eval_flag)
    check("phase evaluation: model.eval() with autograd on; a frozen submodule in a training forward is not",
          t_phase_eval_mode)
    check("phase backward: a hook inside PyTorch's backward; a frameless thread finds the caller; the program's line",
          t_phase_backward)
    check("phase backward through a library of the table (by module name): the program's line called it",
          t_phase_backward_through_a_library)
    check("phase optimizer_step: inside AdamW.step (a closure)", t_phase_step)
    check("phase loading: torch.load (map_location), load_state_dict, Module.to", t_phase_loading)
    check("phase oom_handler: inside the except block of torch.cuda.OutOfMemoryError", t_phase_handler)
    check("the phase table's PyTorch files exist in this torch", t_phase_patterns_real_files)
    check("nn.MultiheadAttention asked for its weights is the operation attention, its argument read",
          t_operation_mha_weights)
    check("phase loading: a model's dequantize(); not bitsandbytes' dequantize_4bit in a forward", t_phase_dequantize)
    check("phase loading: PEFT's prepare_model_for_kbit_training casting weights to float32", t_phase_kbit_preparation)
    check("holders: the bound an LRU's object names (budget_bytes, capacity) and a deque's maxlen", t_holder_bounds)
    check("gradient checkpointing: off in a plain layer, on under torch.utils.checkpoint or the flag", t_checkpointing)
    check("failing layer: its place in a ModuleList or Sequential of like layers", t_failing_layer)
    check("the generate() call's input: positional, keyword or inputs_tensor, batch first; none without one",
          t_generation_input)
    check("the model's input requires grad; the models' training mode", t_input_requires_grad)
    check("a model halfway through a move: its parameters off the failing device, once", t_models_elsewhere)
    check("a model in bfloat16 beside one in float32: each model's float32 bytes", t_models_float32)
    check("an int8 model beside one in float32: each model's quantized bytes", t_models_quantized)
    check("a library's engine held by a local: its model named after it, its cache held by it",
          t_library_object_keeps_a_model)
    check("a library's engine held by a local: the purpose its attribute paths say (a CacheEngine's gpu_cache)",
          t_library_object_path_purpose)
    check("embedding tables among the models' parameters, each once", t_embedding_tables)
    check("the batch size from the program's names, not a loop index or a global count", t_batch_size)
    check("a batch of one from the outermost module's input, where no name says the batch", t_input_batch)
    check("the optimizer steps: the latest 32 and a series over the whole run", t_steps_over_the_run)
    check("autocast in the running program's code, off at the failing line", t_autocast_in_code)
    check("a GradScaler in the running loop, autocast nowhere in the program's file", t_scaler_without_autocast)
    check("backward called by the running program's code: a training step before any optimizer of torch's",
          t_backward_in_code)
    check("backward on the failing stack: called by a frame, or by none (a scoring pass with autograd on)",
          t_backward_on_stack)
    check("settings of the program's own code: padding to the maximum, extra outputs", t_code_settings)
    check("the failing operation from PyTorch's own frames; the table names common/operations.def's list",
          t_operation_real_frames)
    check("the forward of a block whose layers with weights are convolutions and norms is the operation conv",
          t_operation_conv_block)
    check("a graph convolution's forward (GATConv, SAGEConv) is the operation graph_messages, not conv",
          t_operation_graph_messages)
    check("DistributedDataParallel's buckets copy the gradients unless gradient_as_bucket_view", t_ddp_buckets)
    check("attention: nn.MultiheadAttention inside a real TransformerEncoderLayer", t_attention_real_mha)
    check("a holder's outputs keep their graphs with autograd on; detached or after backward, not", t_holder_graphs)
    check("a container in a class body of the program is a holder of its own (Class.attribute)", t_class_attribute_holders)

gc.collect()
print("%d passed, %d failed" % (results["pass"], results["fail"]))
sys.exit(1 if results["fail"] else 0)
