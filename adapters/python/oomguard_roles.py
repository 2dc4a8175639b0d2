"""What the failing device's memory is for: oomguard's adapters split a framework's allocated bytes
by role at an out-of-memory failure (memory.framework.roles in the dump; docs/dump-format.md).

  parameters        tensors of nn.Module._parameters and of the optimizers' param_groups
  buffers           nn.Module._buffers (running statistics, masks registered as buffers)
  gradients         .grad of those parameters
  per_sample_gradients  tensors those parameters carry as attributes shaped as one gradient per example:
                    (n, *parameter.shape), or n times a flat parameter's elements (Opacus' grad_sample,
                    BackPACK's grad_batch); per_sample_count is the largest n (the physical batch)
  optimizer_state   torch.optim.Optimizer.state, also by optimizer class
  graph_pools       live blocks in CUDA-graph private pools (from the allocator snapshot)
  held_by_python    other tensors reachable from a named Python object: an attribute of an object
                    (self.cache), a module global (losses), a list/dict local of a running function;
                    through its containers and the attributes of the objects it keeps, _DEPTH levels
                    down (a dict of DynamicCache objects of lists of tensors is the dict's);
                    the largest holders are named, with the line that created their largest tensor
                    when the allocation history is on
  activations       the rest: allocated minus all the above (never negative); tensors autograd
                    saved, temporaries, locals of running functions.  Unknown (None) when the scan
                    ran out of time or a role above is unknown.

The parameters are also split by dtype (parameters_by_dtype: float32 weights of a half-precision
checkpoint), and each optimizer says how many bytes of parameters on the failing device its
param_groups hold (an optimizer made for this device's model: the job trains, before its first step
too).  Each holder also says what its name or class says it keeps (purpose, PURPOSES) and whether its blocks
are a copy of the parameters or the optimizer state (copy_of); `models` groups the modules no other
module holds by class and size (a second copy of a model, a frozen one), each group saying how many of its
models the running code holds by a name (a local of a running function of the program, a global, an
attribute of the program's object) and how many it is running (`self` of a running frame); `ddp` says what
DistributedDataParallel's reducer keeps as a flat bucket copy of the gradients (gradient_as_bucket_view off).

A storage is counted once, under the first role that reaches it in that order (views share their
storage: counted by its data pointer).  Modules and optimizers are found with gc; the scan has a
time budget (OOMGUARD_ROLES_BUDGET_MS), reads only Python attributes (no device memory is
allocated, no framework allocator is called), and never raises: measure() returns None when it
cannot answer at all.  The budget and elapsed_ms are the scanning thread's CPU time.

The framework-specific parts are arguments, so the same code runs on real PyTorch objects with
CPU tensors standing in for the failing device (tests/adapter/test_roles_real_torch.py):
  on_device(t)  is this tensor's storage on the failing device?
  sizes         {storage data pointer: allocator block size} (PyTorch's snapshot) or None;
  round_to      without sizes: a storage's bytes rounded up to this (PyTorch's blocks: 512).
Python 3.9+, standard library only.
"""
import collections
import functools
import gc
import itertools
import os
import re
import sys
import threading
import time
import types

ROLES = ("parameters", "buffers", "gradients", "per_sample_gradients", "optimizer_state", "graph_pools",
         "held_by_python", "activations")
TOP_HOLDERS = 8
TOP_MODELS = 6
_HEAPTYPE = 1 << 9              # Py_TPFLAGS_HEAPTYPE: a class a `class` statement made
_DEPTH = 6                     # containers and objects followed below a named holder: a dict of objects
                               # of lists of tensors (tenant -> DynamicCache -> key_cache -> tensor), one more;
                               # a logging handler's buffered records (handler -> buffer -> LogRecord -> args ->
                               # a dict of the batch -> tensor)
_CHECK_EVERY = 2048            # objects between two looks at the clock
_SAMPLE_OVER = 256             # a larger container is read whole only if one of its first
_SAMPLE = 32                   # _SAMPLE elements holds a tensor; the same for a class's instances
_ATOMS = frozenset((int, float, str, bytes, bool, type(None), complex))
_MODULE_INTERNALS = frozenset(("_parameters", "_buffers", "_modules", "_non_persistent_buffers_set",
                               "_forward_hooks", "_forward_pre_hooks", "_backward_hooks",
                               "_backward_pre_hooks", "_state_dict_hooks", "_load_state_dict_pre_hooks",
                               "_load_state_dict_post_hooks", "_state_dict_pre_hooks",
                               "_forward_hooks_with_kwargs", "_forward_pre_hooks_with_kwargs",
                               "_forward_hooks_always_called", "_is_full_backward_hook"))
_CONTAINERS = (list, tuple, set, frozenset, collections.deque)
# what a kept exception keeps alive (see _Scan.kept_by_error): the exception, its traceback, the traceback's frames
_ERROR_TYPES = (types.TracebackType, types.FrameType)
_MAPPINGS = (dict, collections.OrderedDict, collections.defaultdict)
# a running function's local that holds tensors for longer than a statement: a list, dict, set or
# deque it fills (a bare tensor local, an argument tuple are temporaries: activations)
_LOCAL_HOLDERS = (list, dict, set, collections.deque, collections.OrderedDict, collections.defaultdict)
# functools.lru_cache's wrapper (the C one): it keeps every result it returned in a cache of its own that no
# attribute reaches; the garbage collector's referents of the wrapper are that cache (its dict, or its entries'
# keys and results when bounded)
_LRU_WRAPPER = getattr(functools, "_lru_cache_wrapper", None)
_HERE = os.path.dirname(os.path.abspath(__file__))
# the roles a holder can hold a second copy of (a snapshot, an EMA, a checkpoint loaded beside them)
_COPIED = ("parameters", "optimizer_state")
_COPY_MIN_TENSORS = 4
_COPY_MIN_SHARE = 0.25
# a holder that is a collection of like records (the photos of a scene, the batches of an epoch): its elements
# read to tell (the first _RECORDS_READ), each holding tensors of the device, all of one type and as many tensors
_RECORDS_READ = 64


def copy_among(sizes, sources):
    """(role, bytes) when the blocks of `sizes` ({size: count}) that a role of `sources` has sizes of (at
    most as many of each size as the role has) are a copy of it by copy_of's measure, or None: a copy being
    made that no named object holds yet (a comprehension's dict, copy.deepcopy's state) among the rest of
    the allocated blocks, whatever else is there (the last batch's loss, a logits tensor)."""
    try:
        best = None
        for role in _COPIED:
            src = sources.get(role) or {}
            part = dict((sz, min(k, src[sz])) for sz, k in sizes.items() if sz in src)
            if copy_of(part, {role: src}) == role:
                b = sum(sz * k for sz, k in part.items())
                if best is None or b > best[1]:
                    best = (role, b)
        return best
    except Exception:
        return None


def copy_of(sizes, sources):
    """Which role (of `sources`: {role: {block size: count}}) a holder whose blocks have `sizes`
    ({size: count}) copies, or None: at least _COPY_MIN_TENSORS blocks, every one of a size that
    role has, no size more often than the role has it, together at least _COPY_MIN_SHARE of the
    role's bytes (a copy still being made counts).  The role it covers the largest share of wins
    (an EMA of the weights is all of the parameters' sizes and half of AdamW's state)."""
    try:
        n = sum(sizes.values())
        if n < _COPY_MIN_TENSORS:
            return None
        mine = sum(s * k for s, k in sizes.items())
        best = None
        for role in _COPIED:
            src = sources.get(role) or {}
            total = sum(s * k for s, k in src.items())
            if not total or any(src.get(s, 0) < k for s, k in sizes.items()):
                continue
            share = mine / float(total)
            if share >= _COPY_MIN_SHARE and (best is None or share > best[1]):
                best = (role, share)
        return best[0] if best else None
    except Exception:
        return None

# What the program calls a holder (its variable, attribute or class name) says what the memory is kept
# for: (purpose, name tokens, class-name patterns).  A name is split into lower-case tokens at "_",
# ".", digits and camelCase ("ema_params" -> ema, params; "KVCache" -> kv, cache); a holder has the
# first purpose one of whose tokens it carries, or whose class matches.  Data, not code per name.
PURPOSES = (
    ("kv_cache", ("kv", "kvcache", "past_key_values", "key_cache", "value_cache", "key_states",
                  "value_states", "kv_caches"), ("*KVCache*", "*KvCache*", "StaticCache", "DynamicCache",
                                                 "HybridCache", "SlidingWindowCache", "OffloadedCache",
                                                 "CacheEngine")),
    ("ema", ("ema", "swa", "shadow", "averaged", "polyak"), ("*ModelEma*", "*EMA*", "*Ema", "AveragedModel",
                                                            "ExponentialMovingAverage")),
    ("checkpoint", ("ckpt", "checkpoint", "state_dict", "statedict", "checkpoints"), ()),
    ("teacher", ("teacher",), ()),
    # a dataset kept whole on the device (train_images = torch.from_numpy(...).cuda(); a Dataset's tensors, a data
    # loader's: nanoGPT's DataLoaderLite keeping its token shards as self.tokens)
    # (a reinforcement learner's replay buffer is its dataset: episodes or transitions it samples batches from)
    ("dataset", ("dataset", "datasets", "images", "imgs", "samples", "x_train", "train_x", "x_val", "x_test",
                 "x_tr", "x_va", "x_valid", "x_te", "x_trn", "x_tst", "val_x", "valid_x", "test_x",
                 "replay", "replay_buffer", "episodes", "transitions"),
     ("*Dataset*", "*DataLoader*", "*Dataloader*", "*ReplayBuffer*", "*Replay*", "*RolloutBuffer*")),
    # after the dataset: a dataset's own cache (MONAI's CacheDataset keeps its preprocessed items in self._cache)
    # is the dataset kept on the device, not a cache beside it
    ("cache", ("cache", "cached", "memo", "lru", "memoized"), ("*Cache*", "*cache*")),
    # a search index kept on the device: the vectors a retriever searches (a flat index's matrix, FAISS's GPU
    # index, a vector store), named so or held by an index's class
    ("index", ("index", "faiss", "vector_index", "flat_index", "ann_index", "search_index", "vector_store",
               "vectorstore", "corpus_embeddings", "doc_embeddings", "passage_embeddings",
               # the same matrices under the usual short names (self.corpus_emb of a hard-negative miner)
               "corpus_emb", "corpus_embs", "doc_emb", "doc_embs", "passage_emb", "passage_embs"),
     ("*Index*", "*VectorStore*", "*Faiss*", "*Retriever*")),
    # a frozen model kept beside the trained one to compare against it: a preference-tuning (DPO, PPO, KTO)
    # reference policy, named so (ref_model, reference_model, ref_policy)
    ("reference", ("ref", "reference", "ref_model", "reference_model", "ref_policy", "reference_policy"), ()),
    # IPython's output history: the results of cells kept by the display hook (Out[5], _5, _), not by the program;
    # named by the exact globals IPython binds, no word of a name (output_history)
    ("output_history", (), ()),
)


def name_tokens(name):
    """The lower-case words of an identifier, plus the joined pairs ("state_dict" -> state, dict,
    state_dict): "self.ema_model" -> self, ema, model, ...; "pastKeyValues" -> past, key, values."""
    out = []
    word = ""
    prev = ""
    for ch in str(name or "")[:96]:
        if ch.isalpha():
            if word and ch.isupper() and not prev.isupper():
                out.append(word)
                word = ""
            word += ch
        else:
            if word:
                out.append(word)
            word = ""
        prev = ch
    if word:
        out.append(word)
    low = [w.lower() for w in out]
    joined = ["_".join(low[i:i + n]) for n in (2, 3) for i in range(len(low) - n + 1)]
    return set(low) | set(joined)


def purpose_of(names=(), kinds=()):
    """The purpose (PURPOSES) of a holder named by `names` (variable, attribute) of classes `kinds`,
    or None.  Never raises."""
    try:
        import fnmatch
        toks = set()
        for n in names:
            toks |= name_tokens(n)
        for purpose, words, classes in PURPOSES:
            if toks.intersection(words):
                return purpose
            for k in kinds:
                if any(fnmatch.fnmatchcase(str(k), c) for c in classes):
                    return purpose
    except Exception:
        pass
    return None


def budget_s():
    """OOMGUARD_ROLES_BUDGET_MS (default 200; 0 turns the roles off) in seconds."""
    try:
        return max(0.0, float(os.environ.get("OOMGUARD_ROLES_BUDGET_MS", "200"))) / 1000.0
    except ValueError:
        return 0.2


def _clock():
    """The scanning thread's CPU time: what the scan costs, whatever else the machine runs (on a
    loaded host the wall clock would stop it at a different point each time)."""
    return time.thread_time()


class _OutOfTime(Exception):
    pass


_LIB_MARKERS = (os.sep + "site-packages" + os.sep, os.sep + "dist-packages" + os.sep)


def _lib_dirs():
    out = set()
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix):
        if p:
            out.add(os.path.join(os.path.abspath(p), "lib") + os.sep)
    return tuple(out)


def is_user_file(path, exclude=(), _libs=[]):
    """The program's own source: not the standard library, an installed package, the framework
    (exclude: its directories) or the adapters."""
    if not path or path.startswith("<"):
        return False
    if not _libs:
        _libs.append(_lib_dirs())
    p = os.path.abspath(path)
    if any(m in p for m in _LIB_MARKERS) or p.startswith(_libs[0]) or os.path.dirname(p) == _HERE:
        return False
    return not any(p.startswith(x) for x in exclude)


class _Scan(object):
    """One measurement: the state shared by its steps."""

    def __init__(self, torch, on_device, sizes, round_to, private, sites, deadline, restored=None):
        self.torch = torch
        # restored(data pointer, bytes) -> the program's (file, line, function) of the torch.load that restored that
        # storage onto a GPU, or None (oomguard_torch.restored_storage); None: not watched
        self.restored = restored
        self.on_device = on_device
        self.sizes = sizes
        self.round_to = max(1, int(round_to or 1))
        self.private = private or {}      # data pointer -> block size, blocks in CUDA-graph pools
        self.sites = sites or {}          # data pointer -> (file, line, function) that created it
        self.deadline = deadline
        self.seen = {}                    # data pointer -> role that has it
        self.totals = dict((r, [0, 0]) for r in ROLES)
        self.optimizers = {}              # class name -> [bytes, tensors, parameter bytes on the device, bytes of
                                          # state not shaped like its parameter]
        self.dtypes = {}                  # dtype name -> [bytes, tensors] of the parameters role
        self.holders = {}                 # (name, kind, where) -> [bytes, tensors, largest ptr, largest bytes, graphs]
        self.path_purposes = {}           # (name, kind, where) -> the purpose the attribute paths below it say
        self.sizes_of = {}                # role or holder key -> {block size: count} (copies, see copy_of)
        self.tensor_type = getattr(torch, "Tensor", None)
        st = None
        for name in ("untyped_storage", "_storage", "storage"):
            st = getattr(self.tensor_type, name, None)
            if st is not None:
                break
        self.storage_of = st
        self.kinds = {}                   # type -> "tensor" | "module" | "optimizer" | "user" | ""
        self.ticks = 0
        self.objects = 0
        self.sampled = 0                  # containers and classes read in part (see tensors_in)
        self.claimed = set()              # ids of the tensor objects already looked at
        self.stage = "the heap"           # what the scan reads now (said when the budget stops it)
        self.models = []                  # see _models
        self.model_roots = {}             # (class, bytes, tensors) -> the root modules of that group
        self.root_frozen = {}             # id(root module) -> no parameter of it requires grad
        self.root_trained = {}            # id(root module) -> an optimizer's param_groups hold a parameter of it
        self.running_ids = None           # ids of the running threads' frames (running_frames)
        self.lora = None                  # bytes of LoRA adapters' parameters (_lora_bytes); None: no adapter
        self.lora_base = None             # ... and of the other parameters that require grad (_lora_bytes)
        self.per_sample = 0               # the most examples a per-sample gradient holds (see _per_sample)
        self.optimized = set()            # the storages of the failing device the optimizers' param_groups hold
        self.root_stepped = {}            # id(root module) -> an optimizer has state for a parameter of it
        self.root_away = {}               # id(root module) -> bytes of its parameters not on the failing device
        self.root_fp32 = {}               # id(root module) -> bytes of its parameters on the device in float32
        self.root_quant = {}              # id(root module) -> bytes of them in a dtype of 8 bits or fewer
        self.embedding = 0                # bytes of embedding tables' parameters (modules of an *Embedding* class)
        self.embedding_seen = set()
        self.stepped = set()              # the storages of the parameters an optimizer has state for (it stepped)
        self.parent = {}                  # id(module) -> the module that holds it
        self.model_names = {}             # id(module) -> names of the running code holding it (see _name_module)
        self.running = []                 # modules that are `self` of a running frame
        self.rebound = {}                 # id(module) -> names a running statement is about to rebind
        self.ddp = None                   # see _ddp
        self.attention = None             # attention modules in the models (see is_attention); None: not read
        try:
            self.exclude = (os.path.dirname(os.path.abspath(torch.__file__)) + os.sep,)
        except Exception:
            self.exclude = ()

    def tick(self):
        self.ticks += 1
        if self.ticks >= _CHECK_EVERY:
            self.ticks = 0
            if _clock() > self.deadline:
                raise _OutOfTime()

    def attrs_of(self, objs, holder_of):
        """Named holders among the attributes of objs (instances); after _SAMPLE instances of a
        class none of which holds a tensor, the class's other instances are not read."""
        empty = {}
        for o in objs:
            tp = type(o)
            n = empty.get(tp, 0)
            if n < 0 or n >= _SAMPLE:
                if n >= _SAMPLE:
                    empty[tp] = -1
                    self.sampled += 1
                continue
            d = getattr(o, "__dict__", None)
            if not isinstance(d, dict):
                continue
            found = False
            for k, v in list(d.items()):
                if type(v) in _ATOMS:
                    continue
                if holder_of(o, k, v):
                    found = True
            empty[tp] = -2 if found else n + 1

    def storage(self, t):
        """(data pointer, bytes the allocator holds for it) of a tensor on the failing device, or None."""
        try:
            if not self.on_device(t):
                return None
            s = self.storage_of(t)
            ptr = int(s.data_ptr())
            if not ptr:
                return None
            if self.sizes is not None:
                size = self.sizes.get(ptr)
                if size is None:
                    size = self.private.get(ptr)
                return (ptr, size) if size is not None else None    # not the allocator's memory
            n = int(s.nbytes())
            r = self.round_to
            return ptr, (n + r - 1) // r * r if n else r
        except Exception:
            return None

    def claim(self, t, role):
        """Counts t's storage under role unless a role has it already; returns its bytes (0 if not)."""
        i = id(t)                         # the objects stay alive during the scan: ids are theirs
        if i in self.claimed:
            return 0
        self.claimed.add(i)
        st = self.storage(t)
        if st is None or st[0] in self.seen:
            return 0
        ptr, size = st
        if role == "held_by_python" and ptr in self.private:
            return 0                      # graph pools are their own role
        self.seen[ptr] = role
        tot = self.totals[role]
        tot[0] += size
        tot[1] += 1
        if role in _COPIED:
            c = self.sizes_of.setdefault(role, {})
            c[size] = c.get(size, 0) + 1
        return size

    def kind(self, tp):
        k = self.kinds.get(tp)
        if k is None:
            k = self.kinds[tp] = _classify(self.torch, tp, self.exclude)
        return k

    def tensors_in(self, v, depth=_DEPTH, seen=None, modules=None):
        """The tensors in v and in what it holds, `depth` levels down: the elements of lists, tuples,
        sets and deques, the values of dicts, and the attributes (instance __dict__) of objects that are
        neither tensors, modules nor optimizers (a DynamicCache kept as a dict's value: dict -> object ->
        list -> tensor).  A container of more than _SAMPLE_OVER elements is read whole only when one of
        its first _SAMPLE elements holds a tensor (a dataset of a million records is not walked); a
        container or object below the depth is not read; both count in `sampled` (read in part).  Each
        container and object is read once per call, at its shallowest (`seen`: shared references, cycles).
        modules: a list, to which the modules met are added (they are not read: their tensors are the roles')."""
        out = []
        stack = [(v, depth)]
        kinds = self.kinds
        if seen is None:
            seen = {}                     # id -> the most levels left when it was read
        while stack:
            x, d = stack.pop()
            self.ticks += 1
            if self.ticks >= _CHECK_EVERY:
                self.tick()
            tp = type(x)
            if tp in _ATOMS:
                continue
            # by the type: isinstance would read x.__class__ through the class's own __getattribute__
            if tp in _CONTAINERS or tp in _MAPPINGS or issubclass(tp, (list, tuple, dict)):
                if not len(x):
                    continue
                if d <= 0:
                    self.sampled += 1
                    continue
                if seen.get(id(x), -1) >= d:
                    continue
                seen[id(x)] = d
                items = x.values() if issubclass(tp, dict) else x
                if len(x) > _SAMPLE_OVER:
                    got = []
                    for y in list(itertools.islice(items, _SAMPLE)):
                        got.extend(self.tensors_in(y, d - 1, seen))
                    if not got:
                        self.sampled += 1
                        continue
                    out.extend(got)
                    items = itertools.islice(items, _SAMPLE, None)
                stack.extend((y, d - 1) for y in items)
                continue
            # what no attribute reaches: an lru_cache's results (the collector's referents of its wrapper); a kept
            # exception's traceback and the locals of its frames (kept_by_error)
            follow = None
            if tp is _LRU_WRAPPER and _LRU_WRAPPER is not None:
                follow = gc.get_referents
            elif tp in _ERROR_TYPES or issubclass(tp, BaseException):
                follow = self.kept_by_error
            if follow is not None:
                if d <= 0:
                    self.sampled += 1
                    continue
                if seen.get(id(x), -1) >= d:
                    continue
                seen[id(x)] = d
                try:
                    stack.extend((y, d - 1) for y in follow(x))
                except Exception:
                    pass
                continue
            k = kinds.get(tp)
            if k is None:
                k = self.kind(tp)
            if k == "tensor" or k == "parameter":
                out.append(x)
            elif k == "module":
                if modules is not None and seen.get(id(x), -1) < 0:
                    seen[id(x)] = 0
                    modules.append(x)
            elif k == "user" or (k == "" and _not_builtin(tp)):
                attrs = self.attributes(x)
                if not attrs:
                    continue
                if d <= 0:
                    self.sampled += 1
                    continue
                if seen.get(id(x), -1) >= d:
                    continue
                seen[id(x)] = d
                stack.extend((y, d - 1) for y in attrs)
        return out

    def kept_by_error(self, x):
        """What a kept exception keeps alive: its attributes and arguments, its traceback and the exceptions
        chained to it; a traceback, the frames of its chain; a frame that is not running, its local variables
        (a traceback keeps them after the function ended: `errors.append(e)` keeps every tensor the failed
        call's frames held).  A running frame's locals are its own code's (read as the running functions')."""
        out = []
        try:
            if isinstance(x, BaseException):
                out.extend(self.attributes(x))
                out.extend(a for a in x.args if type(a) not in _ATOMS)
                out.extend(v for v in (x.__traceback__, x.__context__, x.__cause__) if v is not None)
            elif type(x) is types.TracebackType:
                tb, n = x, 0
                while tb is not None and n < 64:
                    out.append(tb.tb_frame)
                    tb, n = tb.tb_next, n + 1
            elif type(x) is types.FrameType and id(x) not in self.running_frames():
                out.extend(v for _, v in _frame_locals(x) if type(v) not in _ATOMS)
        except Exception:
            pass
        return out

    def running_frames(self):
        """The ids of the frames on the running threads' stacks (read once a scan)."""
        if self.running_ids is None:
            self.running_ids = set()
            for top in list(sys._current_frames().values()):
                n = 0
                while top is not None and n < 1024:
                    self.running_ids.add(id(top))
                    top, n = top.f_back, n + 1
            top = None
        return self.running_ids

    def attributes(self, x):
        """The values of an object's instance dictionary (its own attributes; no property, __getattr__
        or __getattribute__ of its class is run), those that are not plain values; () for an object
        without one (a function, a C object) or whose dictionary is not a dict."""
        try:
            if issubclass(type(x), (type, types.ModuleType)):   # a class, a (lazy) module: not a holder's content
                return ()
            d = object.__getattribute__(x, "__dict__")
            if type(d) is not dict or not d:
                return ()
            return [y for y in list(d.values()) if type(y) not in _ATOMS]
        except Exception:
            return ()


def _classify(torch, tp, exclude):
    try:
        nn = getattr(torch, "nn", None)
        P = getattr(nn, "Parameter", None)
        if isinstance(P, type) and issubclass(tp, P):
            return "parameter"
        T = getattr(torch, "Tensor", None)
        if T is not None and issubclass(tp, T):
            return "tensor"
        M = getattr(nn, "Module", None)
        if M is not None and issubclass(tp, M):
            return "module"
        optim = getattr(torch, "optim", None)
        O = getattr(optim, "Optimizer", None)
        if O is not None and issubclass(tp, O):
            return "optimizer"
        if tp.__module__ in ("builtins",) or not hasattr(tp, "__dict__"):
            return ""
        mod = sys.modules.get(tp.__module__)
        if mod is not None and is_user_file(getattr(mod, "__file__", None), exclude):
            return "user"
    except Exception:
        pass
    return ""


def _module_label(mod):
    f = getattr(mod, "__file__", None)
    return os.path.basename(f) if f else getattr(mod, "__name__", "?")


_CONTAINED_MODULES = 256      # values of a map read for the models it keeps
_HISTORY_MAPS = ("Out", "_oh")  # IPython's output history in __main__: it keeps a cell's result, not on purpose
_HISTORY_RESULTS = re.compile(r"_{1,3}|_[0-9]+")   # and its latest results (_, __, ___) and each by number (_5)


def output_history(name, where):
    """"output_history" for a global IPython's display hook binds (Out, _oh, _, __, ___, _5), else None."""
    if not str(where).startswith("global") or not isinstance(name, str):
        return None
    return "output_history" if name in _HISTORY_MAPS or _HISTORY_RESULTS.fullmatch(name) else None


def _name_contained_modules(scan, v, name):
    """The modules a dict held by `name` keeps as values (a registry or an LRU of models by key): the running
    code holds them as NAME[key], recorded for the models (see _models_named).  A list holding a model is not
    a name for it (a previous run's model kept by something else), nor is IPython's output history or a module's
    namespace held in a variable (globals(): its models are named as globals).  Reads at
    most _CONTAINED_MODULES values; never raises."""
    try:
        if _LRU_WRAPPER is not None and type(v) is _LRU_WRAPPER:
            # functools.lru_cache keeps its results in a dict (maxsize=None) or in links the collector sees
            # (gc.get_referents): the cached models are that function's entries by key
            own = getattr(v, "__dict__", None)
            values = []
            for x in gc.get_referents(v):
                if isinstance(x, dict) and x is not own:
                    values.extend(itertools.islice(x.values(), _CONTAINED_MODULES))
                elif type(x) not in _ATOMS:
                    values.append(x)
        elif not isinstance(v, dict) or name in _HISTORY_MAPS or "__builtins__" in v or "__spec__" in v:
            return                                   # a module's namespace (globals()): its names are read as such
        else:
            values = v.values()
        for m in list(itertools.islice(values, _CONTAINED_MODULES)):
            if type(m) not in _ATOMS and scan.kind(type(m)) == "module":
                _name_module(scan, m, name + "[key]")
    except Exception:
        pass


_GRAPHS_READ = 4         # a holder's tensors with a graph whose saved tensors are read (graphs_alive)
_GRAPHS_LOOK = 64        # of its first tensors


def _graph_nodes(fn, keep, limit=64):
    """The ids of the nodes of the graph under fn (at most `limit`), the parameters' own nodes (AccumulateGrad,
    which every pass over the same weights shares) left out; the nodes are kept in `keep` so no id is reused."""
    out, stack = set(), [fn]
    while stack and len(out) < limit:
        node = stack.pop()
        if node is None or id(node) in out:
            continue
        keep.append(node)
        if type(node).__name__ != "AccumulateGrad":
            out.add(id(node))
        try:
            stack.extend(f[0] for f in (node.next_functions or ()) if f)
        except Exception:
            pass
    return out


def _graphs_alive(tensors):
    """How many distinct graphs that still hold what they saved for backward (oomguard_phase.graph_alive) the
    first _GRAPHS_READ tensors with a grad_fn (among the first _GRAPHS_LOOK) root: outputs of separate passes kept
    with their graphs (losses.append(loss), a rollout's log-probabilities), each keeping every activation of its
    pass alive.  Tensors whose graphs share a node (outputs of one pass, a chain of steps each built on the last)
    count once.  0 when none; never raises."""
    try:
        from oomguard_phase import graph_alive
        alive = read = 0
        seen, keep = set(), []
        for t in itertools.islice(tensors, _GRAPHS_LOOK):
            fn = getattr(t, "grad_fn", None)
            if fn is None:
                continue
            read += 1
            if graph_alive(t) is True:
                nodes = _graph_nodes(fn, keep)
                alive += 0 if nodes & seen else 1
                seen |= nodes
            if read >= _GRAPHS_READ:
                break
        return alive
    except Exception:
        return 0


def _library_holder(scan, v, name, kind, where, graphs=True, always=False):
    """A name of the program for an object of a library's class (neither the program's own, a container, a tensor,
    a module nor an optimizer): when the object keeps a model (an engine, a pipeline, a trainer: vLLM's LLM, a
    diffusers pipeline, a Trainer), _DEPTH levels down its attributes and containers, the program holds that model
    by this name, and the tensors the object keeps beside it (an engine's KV cache) are held under the name too; an
    object that keeps no model (a model's output) is a holder only where `always` says (a global, as it always
    was).  The object's attributes are walked once."""
    modules = []
    tensors = scan.tensors_in(v, modules=modules)
    for m in modules:
        _name_module(scan, m, name)
    if modules or always:
        if tensors and purpose_of((name,), (kind,)) is None:
            pp = _path_purpose(scan, v)
            if pp is not None:
                scan.path_purposes[(name, kind, where)] = pp
        _holder(scan, v, name, kind, where, graphs, tensors)


def _path_purpose(scan, v, limit=4096, depth=_DEPTH + 4):
    """What the attribute paths inside v say its bytes are for, when neither its name nor its class says: each
    tensor below v that no role has yet counts under the purpose of the names and classes on its path (vLLM's LLM
    -> llm_engine -> model_executor -> driver_worker -> cache_engine, a CacheEngine -> gpu_cache: the KV cache; a
    list or dict met on the way adds its own name).  A path's purpose is the first of PURPOSES any of its parts
    says (purpose_of reads a union of names and classes so), carried down the walk part by part.  A tensor
    reached by several paths (the worker's own gpu_cache is the cache engine's list) counts under the first any of
    them says.  The purpose of at least half of those bytes, or None.  At most `limit` objects, `depth` levels
    down: deeper than the holder's own walk, which may have reached a tensor by a shorter path that says less."""
    order = dict((p[0], i) for i, p in enumerate(PURPOSES))
    none = len(PURPOSES)
    said = {}                            # a name or a class -> the rank of the purpose it says alone

    def rank_of(part, kind):
        r = said.get((part, kind))
        if r is None:
            r = said[(part, kind)] = order.get(purpose_of(() if kind else (part,), (part,) if kind else ()), none)
        return r

    best = {}                            # data pointer -> [bytes, the best rank of a path to it]
    visited = {}                         # id -> the best rank of a path it was read by
    stack = [(v, none, depth)]
    n = 0
    while stack and n < limit:
        x, rank, d = stack.pop()
        n += 1
        scan.tick()
        tp = type(x)
        if tp in _ATOMS or visited.get(id(x), none + 1) <= rank:
            continue
        visited[id(x)] = rank
        k = scan.kind(tp)
        if k == "tensor" or k == "parameter":
            st = scan.storage(x)
            if st is not None and st[0] not in scan.seen:
                b = best.setdefault(st[0], [st[1], none])
                b[1] = min(b[1], rank)
            continue
        if d <= 0 or k in ("module", "optimizer"):
            continue
        if tp in _CONTAINERS or tp in _MAPPINGS or issubclass(tp, (list, tuple, dict)):
            items = list(itertools.islice(x.items() if issubclass(tp, dict) else ((None, y) for y in x), _SAMPLE_OVER))
        elif k == "user" or (k == "" and _not_builtin(tp)):
            try:
                dd = object.__getattribute__(x, "__dict__")
            except Exception:
                continue
            if type(dd) is not dict:
                continue
            items = list(dd.items())
            rank = min(rank, rank_of(tp.__name__, True))
        else:
            continue
        for key, y in items:
            if type(y) not in _ATOMS:
                stack.append((y, min(rank, rank_of(key, False)) if type(key) is str else rank, d - 1))
    by = {}
    for size, r in best.values():
        by[r] = by.get(r, 0) + size
    total = sum(by.values())
    r, most = max(by.items(), key=lambda kv: kv[1], default=(none, 0))
    return PURPOSES[r][0] if r < none and 2 * most >= total > 0 else None


def _holder(scan, v, name, kind, where, graphs=True, tensors=None, owner=None):
    """Counts the unclaimed tensors v holds under the holder (name, kind, where); True when v
    holds a tensor at all.  The models v keeps as values are named after it (_name_contained_modules).
    graphs: read whether its tensors keep their autograd graphs (_graphs_alive); not for the locals of a
    module's own code (a forward's list of skip connections is its pass's, backward frees it).  tensors: those
    in v, when the caller read them already.  owner: the object whose attribute v is, read for the bound it
    names (_bound)."""
    _name_contained_modules(scan, v, name)
    if tensors is None:
        tensors = scan.tensors_in(v)
    if not tensors:
        return False
    got = 0
    n = 0
    big = (0, 0)
    sizes = []
    restored = {}                        # the torch.load line -> bytes of v's tensors it restored onto a GPU
    f64 = 0                              # ... and of its float64 tensors (numpy's default, pandas' too)
    for t in tensors:
        b = scan.claim(t, "held_by_python")
        if b:
            got += b
            n += 1
            if dtype_name(t) == "float64":
                f64 += b
            at = _restored_at(scan, t)
            if at is not None:
                restored[at] = restored.get(at, 0) + b
            if len(sizes) < 4096:
                sizes.append(b)
            if b > big[1]:
                st = scan.storage(t)
                big = (st[0] if st else 0, b)
    if got:
        h = scan.holders.setdefault((name, kind, where), [0, 0, 0, 0, 0, {}, 0, 0, None, None])
        for at, rb in restored.items():
            h[5][at] = h[5].get(at, 0) + rb
        h[0] += got
        h[1] += n
        if big[1] > h[3]:
            h[2], h[3] = big
        if graphs and h[4] < _GRAPHS_READ:
            h[4] = min(_GRAPHS_READ, h[4] + _graphs_alive(tensors))
        h[6] = max(h[6], _records(scan, v))
        h[7] += f64
        if h[8] is None and h[9] is None:
            h[8], h[9] = _bound(v, owner)
        c = scan.sizes_of.setdefault((name, kind, where), {})
        for sz in sizes:
            c[sz] = c.get(sz, 0) + 1
    return True


def _not_builtin(tp):
    """tp is no built-in type: its module is not builtins, or a `class` statement made it (a heap type), whatever
    its __module__ says: one defined by exec() without a module name says "builtins", as int and dict do"""
    try:
        return tp.__module__ != "builtins" or bool(tp.__flags__ & _HEAPTYPE)
    except Exception:
        return False


def _library_object(scan, v):
    """v is an object of a library's class, with attributes: not an atom, a container, a tensor, a module, an
    optimizer, the program's own class, a class or a module, nor functools.lru_cache's wrapper"""
    tp = type(v)
    return (tp not in _ATOMS and tp not in _CONTAINERS and tp not in _MAPPINGS and tp is not _LRU_WRAPPER and
            not isinstance(v, (type, type(sys))) and scan.kind(tp) == "" and _not_builtin(tp) and
            not issubclass(tp, (list, tuple, dict, set, frozenset)))


# the bound an object names for what it keeps (an LRU's budget): an int attribute of the owner named for a byte
# budget (budget_bytes, max_bytes, capacity_bytes, cache_size_bytes) or for a count of entries (capacity, maxsize,
# max_entries); a deque's own maxlen.  Names only: a value is never computed, no method is called
_BOUND_BYTES = re.compile(r"^(?:[a-z0-9]+_)*(?:budget|max|capacity|limit)(?:_[a-z0-9]+)*_bytes$|"
                          r"^(?:[a-z0-9]+_)*bytes_(?:budget|max|limit|cap|capacity)$|^(?:max|budget)_?bytes$")
_BOUND_RECORDS = re.compile(r"^_?(?:capacity|maxsize|max_size|max_entries|max_items|max_len|maxlen|"
                            r"max_cache_size|cache_size|max_keys)$")


def _bound(v, owner):
    """(bytes, records): the bound the holder v names or its owner names for it, None each when none is named.
    Never raises."""
    nbytes = records = None
    try:
        m = getattr(v, "maxlen", None) if isinstance(v, collections.deque) else None
        if isinstance(m, int) and not isinstance(m, bool) and m > 0:
            records = m
        d = getattr(owner, "__dict__", None) if owner is not None else None
        for k, x in list(d.items())[:256] if isinstance(d, dict) else ():
            if not isinstance(k, str) or isinstance(x, bool) or not isinstance(x, int) or x <= 0:
                continue
            low = k.lower()
            if nbytes is None and _BOUND_BYTES.match(low):
                nbytes = x
            elif records is None and _BOUND_RECORDS.match(low):
                records = x
    except Exception:
        pass
    return nbytes, records


def _records(scan, v):
    """How many like records v is a collection of: for a list, tuple, deque or dict (its values) of at least two
    elements whose first _RECORDS_READ each hold tensors of the failing device, all of one type and as many
    tensors, its length; 0 otherwise.  Measured, not named: a scene's photos, an epoch's batches kept whole."""
    try:
        tp = type(v)
        if not (tp in _CONTAINERS or tp in _MAPPINGS) or tp in (set, frozenset) or len(v) < 2:
            return 0
        items = v.values() if issubclass(tp, dict) else v
        shape = None
        for y in itertools.islice(items, _RECORDS_READ):
            n = sum(1 for t in scan.tensors_in(y, _DEPTH - 1) if scan.storage(t))
            if not n or (shape is not None and shape != (type(y), n)):
                return 0
            shape = (type(y), n)
        return len(v)
    except _OutOfTime:
        raise                            # the scan's time budget, spent while reading the records
    except Exception:
        return 0


def _restored_at(scan, t):
    """The program's line of the torch.load that restored tensor t's storage onto a GPU, or None."""
    if scan.restored is None:
        return None
    try:
        st = scan.storage_of(t)
        return scan.restored(int(st.data_ptr()), int(st.nbytes()))
    except Exception:
        return None


_CO_OPTIMIZED = 0x1          # a function's frame: its locals live in fast slots, f_locals is a copy


def _frame_locals(frame):
    """The frame's local variables as (name, value) pairs, leaving nothing behind.

    Up to Python 3.12, reading f_locals of a function's frame fills a dict that stays on the frame
    until the function returns: every value in it stays alive even after the function deletes or
    rebinds the variable (a failed batch's tensors kept until the next failure).  Unless someone
    else holds that dict (the program's own locals(); a tracer, which copies it back into the
    frame), it is emptied again once read; the next reader refills it from the frame.  From 3.13
    f_locals is a view of the frame and keeps nothing."""
    try:
        d = frame.f_locals
    except Exception:
        return []
    items = list(d.items())
    if (sys.version_info < (3, 13) and type(d) is dict and d is not frame.f_globals
            and frame.f_code.co_flags & _CO_OPTIMIZED and frame.f_trace is None
            and sys.gettrace() is None and _thread_tracer() is None
            and sys.getrefcount(d) <= 3):        # the frame, `d` and getrefcount's argument
        d.clear()
    return items


def _thread_tracer():
    get = getattr(threading, "gettrace", None)   # 3.10 and later
    return get() if get is not None else None


def _shape(t):
    """t's shape as a tuple of ints, or None (not a tensor, or unreadable)."""
    try:
        return tuple(int(n) for n in t.shape)
    except Exception:
        return None


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


def measure(torch, device, allocated, on_device=None, sizes=None, round_to=512, private=None, sites=None,
            budget=None, frame_roots=True, restored=None):
    """The failing device's allocated bytes by role (see the module's docstring), as a dict:
    {"allocated", "roles": {role: [bytes|None, tensors]},
     "optimizers": {class: [bytes, tensors, parameter bytes, bytes of state not shaped like its parameter]},
     "holders": [(label, name, kind, where, bytes, tensors, (file, line, function)|None, purpose, copy_of, graphs,
                  restored bytes|None, the restoring torch.load's (file, line, function)|None)],
    restored(data pointer, bytes): the torch.load line that restored that storage onto a GPU, or None (see
    oomguard_torch.restored_storage); None: not watched, the holders' restored bytes unknown.
     "complete", "why", "elapsed_ms", "objects"}.  None when nothing could be measured."""
    t0 = _clock()
    budget = budget_s() if budget is None else float(budget)
    if budget <= 0:
        return None
    try:
        if on_device is None:
            dev = int(device)

            def on_device(t):
                return t.is_cuda and t.get_device() == dev
        scan = _Scan(torch, on_device, sizes, round_to, private, sites, t0 + budget, restored)
        if scan.tensor_type is None or scan.storage_of is None:
            return None
        complete, why = True, ""
        gc_was = gc.isenabled()
        gc.disable()                      # no collection (nor finalizer) while walking the heap
        try:
            _walk(scan, frame_roots)
        except _OutOfTime:
            complete, why = False, "the scan stopped at its time budget (%g ms) while reading %s: the roles before " \
                "are whole, the later ones lower bounds" % (budget * 1000.0, scan.stage)
        finally:
            if gc_was:
                gc.enable()
        return _result(scan, allocated, complete, why, t0)
    except Exception as e:          # never into the program
        return {"error": "%s: %s" % (type(e).__name__, e)}


def _walk(scan, frame_roots):
    objs = gc.get_objects()
    scan.objects = len(objs)
    # the types first (C speed), then only the objects of the types that matter
    kinds = scan.kinds
    for tp in set(map(type, objs)):
        if tp not in kinds:
            scan.kind(tp)
    if _clock() > scan.deadline:
        raise _OutOfTime()
    wanted = dict((tp, k) for tp, k in kinds.items() if k in ("module", "optimizer", "parameter"))
    picked = list(itertools.compress(objs, map(wanted.__contains__, map(type, objs))))
    del objs
    modules, optimizers, loose = [], [], []
    dtypes = scan.dtypes

    def param(p):
        """Counts p under the parameters role (and its dtype); True when it was counted now."""
        b = scan.claim(p, "parameters")
        if b:
            d = dtypes.setdefault(dtype_name(p), [0, 0])
            d[0] += b
            d[1] += 1
        return b
    by_kind = {"module": modules, "optimizer": optimizers, "parameter": loose}
    for o in picked:
        by_kind[wanted[type(o)]].append(o)
    del picked
    scan.stage = "parameters"
    # parameters and buffers: of every module (all of them are gc objects), then the optimizers'
    params = []
    for m in modules:
        d = getattr(m, "__dict__", {})
        for p in (d.get("_parameters") or {}).values():
            if p is not None:
                scan.tick()
                param(p)
                params.append(p)
    for opt in optimizers:
        held = {}                         # the device's storages its param_groups hold
        for g in getattr(opt, "param_groups", ()) or ():
            for p in (g.get("params") or ()) if isinstance(g, dict) else ():
                scan.tick()
                param(p)
                params.append(p)
                st = scan.storage(p)
                if st is not None:
                    held[st[0]] = st[1]
        o = scan.optimizers.setdefault(type(opt).__name__, [0, 0, 0, 0])
        o[2] += sum(held.values())
        scan.optimized.update(held)
    for p in loose:                       # parameters of no module and no optimizer (frozen, bare)
        scan.tick()
        if param(p):
            params.append(p)
    for m in modules:
        for b in (getattr(m, "__dict__", {}).get("_buffers") or {}).values():
            if b is not None:
                scan.tick()
                scan.claim(b, "buffers")
    scan.stage = "gradients"
    for p in params:
        scan.tick()
        try:
            g = p.grad
        except Exception:
            g = None
        if g is not None:
            scan.claim(g, "gradients")
        _per_sample(scan, p)
    scan.stage = "optimizer state"
    for opt in optimizers:
        name = type(opt).__name__
        got = [0, 0, 0]
        state = getattr(opt, "state", None) or {}
        try:
            items = list(state.items())
        except Exception:
            items = []
        for p, v in items:                # the parameters it has made state for: it has stepped on them
            if isinstance(v, dict) and not v:
                continue
            try:
                st = scan.storage(p)
            except Exception:
                st = None
            if st is not None:
                scan.stepped.add(st[0])
        seen = {}
        for p, v in items:
            shape = _shape(p)
            for t in scan.tensors_in(v, 2, seen):
                b = scan.claim(t, "optimizer_state")
                if b:
                    got[0] += b
                    got[1] += 1
                    # not one value per element of its parameter (Adam's moments are shaped like it): a
                    # preconditioner matrix (Shampoo, SOAP), a projection, factored statistics
                    ts = _shape(t)
                    if shape is not None and ts is not None and ts != shape and _numel(ts) > 1:
                        got[2] += b
        o = scan.optimizers.setdefault(name, [0, 0, 0, 0])
        o[0] += got[0]
        o[1] += got[1]
        o[3] += got[2]
    scan.stage = "models"
    scan.models = _models(scan, modules)            # fills scan.parent, which _lora_bytes climbs
    scan.lora, scan.lora_base = _lora_bytes(scan, modules)
    scan.ddp = _ddp(scan, modules)
    # the graph pools' live blocks that no role above holds
    for ptr, size in scan.private.items():
        if ptr not in scan.seen:
            scan.seen[ptr] = "graph_pools"
            scan.totals["graph_pools"][0] += size
            scan.totals["graph_pools"][1] += 1
    _named_holders(scan, modules, frame_roots)
    scan.stage = "the models the running code holds"
    _running_modules(scan)
    scan.models = _models_named(scan)
    scan.stage = "a deep copy under way"
    scan.copy_made = _copy_made(scan)


def _lora_bytes(scan, modules, limit=4096):
    """LoRA adapters on the failing device: (adapter bytes, other bytes that train), or (None, None) when no module
    has an adapter (not 0, which would say an adapter is empty).  An adapter's parameters: a parameter named lora_*
    (loralib's lora_A, lora_B) or a parameter of a submodule named so and of the submodules below it (PEFT's
    lora_A.default.weight).  The others that train: every other parameter that requires grad in the models that
    hold an adapter (the outermost module above each), except those under a submodule named modules_to_save (PEFT's
    trained copies of a head or an embedding, asked for by name): LoRA means the rest of that model is frozen; a
    model without adapters beside it (another one loading) is not its base.  Each storage once."""
    seen, found = set(), False
    total = [0, 0]

    def add(p, i):
        st = scan.storage(p)
        if st is not None and st[0] not in seen:
            seen.add(st[0])
            total[i] += st[1]

    def below(c):
        """c and the modules under it"""
        stack, n = [c], 0
        while stack and n < limit:
            x = stack.pop()
            n += 1
            yield x
            stack.extend(y for y in list(((getattr(x, "__dict__", None) or {}).get("_modules") or {}).values())
                         if y is not None)
    saved = set()                         # ids of the modules under a modules_to_save
    holders = []                          # the modules an adapter is found in
    for m in modules:                     # the adapters first
        scan.tick()
        d = getattr(m, "__dict__", None) or {}
        for k, p in list((d.get("_parameters") or {}).items()):
            if p is not None and "lora" in str(k).lower():
                found = True
                holders.append(m)
                add(p, 0)
        for k, c in list((d.get("_modules") or {}).items()):
            if c is None:
                continue
            if "lora" in str(k).lower():
                found = True
                holders.append(m)
                for x in below(c):
                    for p in list(((getattr(x, "__dict__", None) or {}).get("_parameters") or {}).values()):
                        if p is not None:
                            add(p, 0)
            elif str(k) == "modules_to_save":
                saved.update(id(x) for x in below(c))
    if not found:
        return None, None
    roots = {}                            # the outermost module above each adapter (scan.parent, from _models)
    for m in holders:
        r = _root_of(scan, m)
        roots[id(r)] = r
    done = set()
    for root in roots.values():           # then what else trains there, the adapters' storages seen already
        for m in below(root):
            scan.tick()
            if id(m) in saved or id(m) in done:
                continue
            done.add(id(m))
            for p in list(((getattr(m, "__dict__", None) or {}).get("_parameters") or {}).values()):
                if p is not None and getattr(p, "requires_grad", False) is True:
                    add(p, 1)
    return total[0], total[1]


def _per_sample(scan, p):
    """Claims the tensors parameter p carries as attributes (its instance dictionary, and the containers kept
    there) that hold one gradient per example: shaped (n, *p.shape), of any dtype (Opacus' grad_sample, in
    autocast's dtype under mixed precision; BackPACK's grad_batch: a bias's too is two-dimensional); where a
    shape is not known (the stand-in torch's tensors),
    of p's dtype and n times its bytes (n >= 2).  A tensor shaped like p (Megatron's main_grad), a flat one
    of a flat p (FSDP's unsharded _full_param_padded), one of another dtype, is not one."""
    values = _own_values(p)
    if not values:
        return
    shape, size = _shape(p), _nbytes(p)
    for v in values:
        if type(v) in _ATOMS:
            continue
        for t in scan.tensors_in(v, 1):
            ts = _shape(t)
            n = 0
            if shape and ts and len(ts) == len(shape) + 1 and ts[1:] == shape:
                n = ts[0]
            elif (shape is None or ts is None) and size and dtype_name(t) == dtype_name(p):
                tb = _nbytes(t)
                n = tb // size if tb and tb % size == 0 and tb // size >= 2 else 0
            if n and scan.claim(t, "per_sample_gradients") and n > scan.per_sample:
                scan.per_sample = n


def _own_values(x):
    """The values of x's own attributes, without making it a dictionary: reading __dict__ of a torch tensor or
    Parameter creates an empty one and leaves it there (one per parameter of the program), so the collector's
    referents are read instead: the dictionary when it exists, else (3.11+, a Python class's attributes kept in the
    object) the values themselves; classes aside.  [] when none; never raises."""
    out = []
    try:
        for r in gc.get_referents(x):
            if type(r) is dict:
                out.extend(r.values())
            elif not isinstance(r, type):
                out.append(r)
    except Exception:
        pass
    return out


def _nbytes(t):
    """t's bytes (its elements times their size), or None."""
    try:
        n = getattr(t, "nbytes", None)
        if n is None:
            n = t.numel() * t.element_size()
        return int(n)
    except Exception:
        return None


def _copy_made(scan, limit=256):
    """The bytes on the failing device that a copy.deepcopy running on this thread made so far: the tensors
    among the values of the memo of its outermost copy.deepcopy frame (copy.deepcopy records every copy it
    makes there, torch's Tensor.__deepcopy__ and Parameter.__deepcopy__ too), each storage once; not the
    originals it keeps alive under memo[id(memo)].  None when no deepcopy runs (or its memo cannot be read)."""
    memo = None
    f, n = sys._getframe(), 0
    while f is not None and n < limit:
        code = f.f_code
        if code.co_name == "deepcopy" and os.path.basename(code.co_filename) == "copy.py":
            for k, v in _frame_locals(f):
                if k == "memo" and type(v) is dict:
                    memo = v                 # the outermost wins: the whole copy, not a nested part of it
                    break
        f, n = f.f_back, n + 1
    f = None
    if memo is None:
        return None
    keep = memo.get(id(memo))
    total, seen = 0, set()
    for v in list(memo.values()):
        scan.tick()
        if v is keep or not isinstance(v, scan.tensor_type):
            continue
        st = scan.storage(v)
        if st is not None and st[0] not in seen:
            seen.add(st[0])
            total += st[1]
    return total


_STORES = frozenset(("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"))
_STATEMENT_ENDS = frozenset(("POP_TOP", "RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE", "GET_ITER", "FOR_ITER",
                             "BEFORE_WITH", "SETUP_WITH", "END_FOR"))


def _pending_stores(f):
    """The names the statement frame f is running will store its result into once the call under way returns:
    the STORE instructions after its current instruction, before the statement ends (model = from_pretrained(...)
    running: `model`).  A model such a name holds now is being replaced (a notebook cell run again), not kept by
    that name.  () when none; never raises."""
    try:
        from oomguard_phase import _instructions
        lasti, out, stored = f.f_lasti, [], False
        for off, op, name, *_ in _instructions(f.f_code):
            if off <= lasti:
                continue
            if op in _STORES and name:
                out.append(name)
                stored = True
                continue
            if stored and op not in ("COPY", "DUP_TOP", "STORE_ATTR", "STORE_SUBSCR"):
                break
            if op in _STATEMENT_ENDS or op.startswith("JUMP") or op.startswith("POP_JUMP"):
                break
        return tuple(out)
    except Exception:
        return ()


def _name_module(scan, v, name):
    """The running code holds module v under `name` (a local of a running function of the program, a global
    of the program, an attribute of the program's object): recorded for the models (see _models_named)."""
    names = scan.model_names.setdefault(id(v), [])
    if name not in names and len(names) < 8:
        names.append(name)


def _running_modules(scan, limit=256):
    """The modules that are `self` of a running frame (their forward, generate, __init__ is executing), of
    any file: the model the job runs (or builds) now.  And the modules a running loader holds in its locals
    (a frame the phase table calls loading: from_pretrained building its model, load_checkpoint(model, path)
    given one): the model its weights are arriving in, which no method of its own may be running (a
    classmethod builds it, accelerate's functions fill it).  Reads frames' locals: nothing is called."""
    from oomguard_phase import loads
    for tid, top in list(sys._current_frames().items()):
        n = 0
        while top is not None and n < limit:
            code = top.f_code
            method = code.co_argcount and code.co_varnames[0] == "self"
            loader = loads(top)
            if (method or loader) and not os.path.dirname(os.path.abspath(code.co_filename)) == _HERE:
                for k, v in _frame_locals(top):
                    if (loader or k == "self") and scan.kind(type(v)) == "module" and \
                            all(v is not m for m in scan.running):
                        scan.running.append(v)
                    if k == "self" and not loader:
                        break
            top, n = top.f_back, n + 1
        top = None


def _root_of(scan, m):
    seen = 0
    while id(m) in scan.parent and seen < 64:
        m, seen = scan.parent[id(m)], seen + 1
    return m


def _models_named(scan):
    """scan.models with, for each group, how many of its roots the running code holds by a name (named),
    how many it is running (a method of the root or of one of its submodules is executing: running), and
    those names, the purpose those names or the class say (PURPOSES: an EMA, a teacher, a reference), how
    many of them an optimizer trains (its param_groups hold a parameter of theirs; None when no optimizer holds
    any parameter of the device), and how many of those it has stepped on (its state holds an entry for a
    parameter of theirs: a training that made its first step; None as trained), and the bytes of one root's
    parameters not on the failing device (on the host, the meta device, another GPU: the rest of a model a load
    is moving here): [(class, bytes, tensors, count, frozen, named, running, names, purpose, trained, stepped,
    away, training, fp32, quant)], fp32 the bytes of one root's parameters on the device in float32, quant those in a
    dtype of 8 bits or fewer (QUANTIZED_DTYPES: int8 weights, packed 4-bit ones, float8).  A root no name of the
    running code reaches is a leftover (a previous run's model kept by a traceback, a cycle); so is one whose
    names a running statement of the program is about to rebind (_pending_stores: a cell run again while its
    previous model lives), though its names are listed."""
    running_roots = set(id(_root_of(scan, m)) for m in scan.running)
    out = []
    for cls, b, n, k, fr in scan.models:
        roots = scan.model_roots.get((cls, b, n), ())
        # a trained model and a frozen copy of it (a reference policy, an EMA, a teacher of the same
        # architecture) are different things though their class and size agree: the roots are told apart by
        # their own frozen flag and what their own names say, each part a group of its own
        parts = {}
        for r in roots:
            # and a model only a map's entry holds (a registry, an lru_cache of loaded models) from one the
            # running code also holds by a name (the entry it took out to run): idle entries are a group
            nms = scan.model_names.get(id(r), ())
            keyed = bool(nms) and all(nm.endswith("[key]") for nm in nms)
            key = (scan.root_frozen.get(id(r), fr), purpose_of(nms, [cls]), keyed)
            parts.setdefault(key, []).append(r)
        for (frozen, purpose, _), rs in parts.items() if roots else [((fr, purpose_of((), [cls]), False), ())]:
            # a name a running statement is about to rebind (model = from_pretrained(...) while the previous
            # model lives) does not keep that model: it is the previous copy (its names still say which)
            named = [r for r in rs
                     if any(nm not in scan.rebound.get(id(r), ()) for nm in scan.model_names.get(id(r), ()))]
            names = []
            for r in rs:
                for nm in scan.model_names.get(id(r), ()):
                    if nm not in names and len(names) < 4:
                        names.append(nm)
            trained = sum(1 for r in rs if scan.root_trained.get(id(r))) if roots and scan.optimized else None
            stepped = sum(1 for r in rs if scan.root_stepped.get(id(r))) if trained is not None else None
            away = max([scan.root_away.get(id(r), 0) for r in rs] or [0])
            # of one root's parameters on the device, those in float32 (None: no root, nothing measured)
            fp32 = max([scan.root_fp32.get(id(r), 0) for r in rs]) if rs else None
            quant = max([scan.root_quant.get(id(r), 0) for r in rs]) if rs else None
            # how many are in training mode (Module.training, set by train() and eval()); None: a root without the flag
            modes = [getattr(r, "training", None) for r in rs] if roots else [None]
            training = sum(1 for v in modes if v is True) if all(isinstance(v, bool) for v in modes) else None
            out.append((cls, b, n, len(rs) if roots else k, frozen, len(named),
                        sum(1 for r in rs if id(r) in running_roots), names, purpose, trained, stepped, away,
                        training, fp32, quant))
    return out[:TOP_MODELS]


def _ddp(scan, modules):
    """DistributedDataParallel wrappers (a class of that name in the module's MRO, real torch's and a
    program's own alike) whose gradients are not views of the reducer's buckets (gradient_as_bucket_view
    not True; False is DDP's default): the reducer keeps a flat bucket copy of every gradient of the
    wrapped module's parameters that require grad.  (wrappers, bucket bytes on the failing device: those
    parameters' bytes, each storage once), or None when there is no such wrapper."""
    found, total, seen = 0, 0, set()
    for m in modules:
        try:
            if not any(c.__name__ == "DistributedDataParallel" for c in type(m).__mro__):
                continue
            if getattr(m, "gradient_as_bucket_view", False) is True:
                continue
            inner = (getattr(m, "__dict__", {}).get("_modules") or {}).get("module") or getattr(m, "module", None)
        except Exception:
            continue
        if inner is None:
            continue
        found += 1
        stack, visited = [inner], set()
        while stack:
            x = stack.pop()
            if id(x) in visited:
                continue
            visited.add(id(x))
            d = getattr(x, "__dict__", {})
            for p in (d.get("_parameters") or {}).values():
                scan.tick()
                try:
                    if p is None or not p.requires_grad:
                        continue
                except Exception:
                    continue
                st = scan.storage(p)
                if st is not None and st[0] not in seen:
                    seen.add(st[0])
                    total += st[1]
            stack.extend(c for c in (d.get("_modules") or {}).values() if c is not None)
    return (found, total) if found else None


# The dtypes of 8 bits or fewer a quantized model keeps its weights in: int8 (LLM.int8, W8A8, torchao), uint8 (the
# packed 4-bit of bitsandbytes, GPTQ and AWQ), float8 (FP8 checkpoints), PyTorch's quantized and sub-byte types.
QUANTIZED_DTYPES = frozenset((
    "int8", "uint8", "qint8", "quint8", "quint4x2", "quint2x4", "int4", "uint4", "int2", "uint2", "int1", "uint1",
    "float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2"))


def dtype_name(t):
    """A tensor's dtype as a short name: "float32", "bfloat16" (torch.float32 -> float32); "unknown"."""
    try:
        s = str(getattr(t, "dtype", None) or "unknown")
        return s[6:] if s.startswith("torch.") else s
    except Exception:
        return "unknown"


# An attention module, by what the model's code calls it: its class says so (MultiheadAttention,
# LlamaAttention, CausalSelfAttention, AttnBlock), its parent holds it under such a name (self.attn,
# self_attn, c_attn, to_qkv), or it holds the projections of one (q/k/v, q_proj/k_proj/v_proj, query/key/
# value, qkv) or a parameter named so (self.attn = Parameter(...): a layer's weights in one tensor; an
# attention bias).  Names, not behaviour: a layer that calls scaled_dot_product_attention under another name with
# none of these is missed, so only a whole walk that met none says "no attention" (and the op seen on the
# stack, roles.operation, still says attention).
_ATTENTION_TOKENS = frozenset(("attention", "attn", "qkv", "mha", "multihead", "self_attn", "c_attn", "to_qkv"))
_PROJECTION_NAMES = (frozenset(("q", "k", "v")), frozenset(("q_proj", "k_proj", "v_proj")),
                     frozenset(("query", "key", "value")), frozenset(("wq", "wk", "wv")),
                     frozenset(("to_q", "to_k", "to_v")))


def is_attention(module, key=None):
    """Whether `module` (held by its parent as `key`) is an attention layer by its names.  Never raises."""
    try:
        if name_tokens(type(module).__name__) & _ATTENTION_TOKENS or name_tokens(key) & _ATTENTION_TOKENS:
            return True
        d = getattr(module, "__dict__", {})
        params = set(d.get("_parameters") or ())
        keys = set(d.get("_modules") or ()) | params
        return ("in_proj_weight" in keys or any(len(keys & p) >= 2 for p in _PROJECTION_NAMES) or
                any(name_tokens(k) & _ATTENTION_TOKENS for k in params))
    except Exception:
        return False


def _is_embedding(module):
    """Whether a module is an embedding table: a class named *Embedding* in its MRO (torch's Embedding and
    EmbeddingBag, TorchRec's collections, a program's own).  Never raises."""
    try:
        return any("Embedding" in c.__name__ for c in type(module).__mro__[:8])
    except Exception:
        return False


def _tensor_bytes(t):
    """A tensor's bytes from its shape and dtype (Tensor.nbytes, or numel x element_size before torch 1.11's
    nbytes): a meta tensor's too, which has no storage."""
    n = getattr(t, "nbytes", None)
    return int(n) if isinstance(n, int) else int(t.numel()) * int(t.element_size())


def _models(scan, modules):
    """The models on the failing device: the modules no other module holds (roots), grouped by class
    and parameter bytes: [(class, bytes, tensors, count, frozen)], largest first.  frozen: no
    parameter of those roots requires grad (a teacher, an EMA copy).  Two roots of one class and size
    are a second copy of a model (a notebook cell run again, a deepcopy)."""
    children = set()
    for m in modules:
        scan.tick()
        for c in (getattr(m, "__dict__", {}).get("_modules") or {}).values():
            if c is not None:
                children.add(id(c))
                scan.parent[id(c)] = m
    groups = {}
    attention = set()
    for root in modules:
        if id(root) in children:
            continue
        seen, b, n, grad, trained, stepped = set(), 0, 0, False, False, False
        away, away_seen, fp32, quant = 0, set(), 0, 0
        stack, visited, attn = [(root, None)], set(), set()
        while stack:
            m, key = stack.pop()
            if id(m) in visited:
                continue
            visited.add(id(m))
            if is_attention(m, key):
                attn.add(id(m))
            d = getattr(m, "__dict__", {})
            table = _is_embedding(m)
            for p in (d.get("_parameters") or {}).values():
                scan.tick()
                st = scan.storage(p) if p is not None else None
                if table and st is not None and st[0] not in scan.embedding_seen:
                    scan.embedding_seen.add(st[0])
                    scan.embedding += st[1]
                if st is None and p is not None and id(p) not in away_seen:
                    away_seen.add(id(p))         # on the host, the meta device or another GPU: to come in a load
                    try:
                        away += 0 if scan.on_device(p) else _tensor_bytes(p)
                    except Exception:
                        pass
                if st is None or st[0] in seen:
                    continue
                seen.add(st[0])
                b += st[1]
                n += 1
                dt = dtype_name(p)
                fp32 += st[1] if dt == "float32" else 0
                quant += st[1] if dt in QUANTIZED_DTYPES else 0
                trained = trained or st[0] in scan.optimized
                stepped = stepped or st[0] in scan.stepped
                try:
                    grad = grad or bool(p.requires_grad)
                except Exception:
                    grad = True
            stack.extend((c, k) for k, c in (d.get("_modules") or {}).items() if c is not None)
        if not n:
            continue
        attention |= attn
        g = groups.setdefault((type(root).__name__, b, n), [0, True])
        g[0] += 1
        g[1] = g[1] and not grad
        scan.root_frozen[id(root)] = not grad
        scan.root_trained[id(root)] = trained
        scan.root_stepped[id(root)] = stepped
        scan.root_away[id(root)] = away
        scan.root_fp32[id(root)] = fp32
        scan.root_quant[id(root)] = quant
        scan.model_roots.setdefault((type(root).__name__, b, n), []).append(root)
    # the walk met every module of the models: a count, 0 included; no model at all says nothing
    scan.attention = len(attention) if groups else None
    out = [(cls, b, n, k, fr) for (cls, b, n), (k, fr) in groups.items()]
    out.sort(key=lambda x: (-x[1] * x[3], x[0]))
    return out[:TOP_MODELS]


def _class_holders(scan, cls, where):
    """The containers a class of the program keeps in its own body (`cache = {}` under `class Session:`): one object
    every instance shares, alive as long as the class, whatever happens to the instances.  Named Class.attribute.
    Methods, properties and other descriptors hold nothing of their own."""
    for k, v in list(vars(cls).items()):
        if k.startswith("__") or type(v) in _ATOMS or callable(v) or isinstance(v, (staticmethod, classmethod,
                                                                                   property, type(sys))):
            continue
        _holder(scan, v, "%s.%s" % (cls.__name__, k), type(v).__name__, where)


def _named_holders(scan, modules, frame_roots):
    # named holders: attributes of modules, module globals of the program, the containers that its
    # running functions hold in local variables; the program's own objects met there (a global
    # trainer, a method's self) are read attribute by attribute, two levels down
    visited = set()
    scan.stage = "the tensors held by Python objects"

    def attr_holder(o, k, v):
        if k in _MODULE_INTERNALS and scan.kinds.get(type(o)) == "module":
            return False
        if scan.kind(type(v)) == "user":
            return instance(v, 1)
        return _holder(scan, v, "self." + str(k), type(v).__name__, "on " + type(o).__name__, owner=o)

    def instance(o, depth, path="self"):
        # path: how the running code reaches o (a global's or a local's name, "self" for an attribute of a
        # module or of an object reached no other way): the models among its attributes are named by it
        # (base.unet: rebinding `base` drops them)
        if id(o) in visited or depth < 0:
            return False
        visited.add(id(o))
        d = getattr(o, "__dict__", None)
        found = False
        for k, v in list(d.items()) if isinstance(d, dict) else ():
            if type(v) not in _ATOMS:
                if scan.kind(type(v)) == "module":
                    _name_module(scan, v, path + "." + str(k))
                elif scan.kind(type(v)) == "user":
                    found = instance(v, depth - 1, path + "." + str(k)) or found
                else:
                    found = _holder(scan, v, "self." + str(k), type(v).__name__, "on " + type(o).__name__,
                                    owner=o) or found
        return found

    scan.attrs_of(modules, attr_holder)
    for mname, mod in list(sys.modules.items()):
        if mod is None or (mname != "__main__" and not is_user_file(getattr(mod, "__file__", None), scan.exclude)):
            continue
        where = "global in " + _module_label(mod)
        for k, v in list(getattr(mod, "__dict__", {}).items()):
            if isinstance(v, type) and getattr(v, "__module__", None) == mname:
                _class_holders(scan, v, "class attribute in " + _module_label(mod))
            if k.startswith("__") or type(v) in _ATOMS or isinstance(v, (type(sys), type)):
                continue
            if scan.kind(type(v)) == "user":
                instance(v, 2, str(k))
            elif scan.kind(type(v)) == "module":
                _name_module(scan, v, str(k))
            elif _library_object(scan, v):
                _library_holder(scan, v, str(k), type(v).__name__, where, always=True)
            else:
                _holder(scan, v, str(k), "lru_cache" if type(v) is _LRU_WRAPPER else type(v).__name__, where)
    if not frame_roots:
        return
    # the running threads' stacks, innermost first; and a stack that stopped (frame_roots a list of frames,
    # outermost first: a traceback's, which keeps the failing stack's locals alive after it unwound)
    stacks = [] if frame_roots is True else [list(reversed(frame_roots))]
    stack = []
    staged = []
    try:
        for tid, top in list(sys._current_frames().items()):
            stack = []
            while top is not None and len(stack) < 1024:
                stack.append(top)
                top = top.f_back
            stacks.append(stack)
        for stack in stacks:
            # outermost first: a list passed down is named as the caller keeps it (ema_params in
            # train(), not the callee's argument `tensors`)
            for i in range(len(stack) - 1, -1, -1):
                f = stack[i]
                code = f.f_code
                if is_user_file(code.co_filename, scan.exclude):
                    where = "local in %s (%s:%d)" % (code.co_name, os.path.basename(code.co_filename), f.f_lineno or 0)
                    pending = _pending_stores(f)
                    local = list(_frame_locals(f))
                    me = dict(local).get("self")
                    own_code = code.co_name in ("forward", "__call__", "_call_impl") or (
                        me is not None and scan.kind(type(me)) == "module")
                    for k, v in local:
                        tp = type(v)
                        if tp in _LOCAL_HOLDERS:
                            _holder(scan, v, str(k), tp.__name__, where, graphs=not own_code)
                        elif tp not in _ATOMS and scan.kind(tp) == "user":
                            instance(v, 2, "self" if k == "self" else str(k))
                        elif k != "self" and tp not in _ATOMS and scan.kind(tp) == "module":
                            _name_module(scan, v, str(k))
                            if k in pending:
                                scan.rebound.setdefault(id(v), set()).add(str(k))
                        elif k != "self" and _library_object(scan, v):
                            _library_holder(scan, v, str(k), tp.__name__, where, graphs=not own_code)
                        elif not own_code and scan.kind(tp) == "tensor":
                            staged.append((k, v, where))
                    if staged:
                        for k, v, where in _staged(scan, staged, stack[:i]):
                            _holder(scan, v, str(k), type(v).__name__, where)
                        del staged[:]
                    for k in pending:                # a global the statement rebinds (STORE_GLOBAL in a function)
                        v = f.f_globals.get(k)
                        if v is not None and type(v) not in _ATOMS and scan.kind(type(v)) == "module":
                            scan.rebound.setdefault(id(v), set()).add(str(k))
    finally:
        # the current thread's stack holds this very frame: a list of it (or `f`, at the end of the loop)
        # left in a local of it is a cycle that keeps the failing pass's frames, and their tensors, alive
        # until the collector runs (into the program's next step)
        for s in stacks:
            del s[:]
        del stack[:]
        del staged[:]
        top = f = None


def _staged(scan, candidates, inner, limit=256):
    """The bare tensors among a running function's locals (CANDIDATES: (name, tensor, where)) that the call it is
    making gets only a part of: the frames it called (INNER, innermost first) hold views of the tensor's storage,
    and the largest of those views is under half of the local's own elements (a whole document's pages moved to
    the GPU before the loop, each batch a slice of them).  Those bytes are the program's data held by a variable,
    not the pass's: a batch the call gets whole, a loss, the previous step's outputs are not.  Reads the locals of
    at most LIMIT frames (a library's wrapper frames too: the view reaches the model through them) and the
    elements of the tuples and lists among them (an argument tuple); never raises."""
    want = {}
    for k, v, where in candidates:
        st = scan.storage(v)
        own = _nbytes(v)
        if st is not None and own:
            want.setdefault(st[0], []).append((own, k, v, where))
    views = {}                                   # storage pointer -> the largest view of it the callees hold
    try:
        for f in inner[:limit] if want else ():
            for _, v in _frame_locals(f):
                for t in (v if type(v) in (tuple, list) and len(v) <= 16 else (v,)):
                    if scan.kind(type(t)) != "tensor":
                        continue
                    st = scan.storage(t)
                    if st is not None and st[0] in want:
                        views[st[0]] = max(views.get(st[0], 0), _nbytes(t) or 0)
    except Exception:
        return []
    finally:
        f = v = t = None
    return [(k, v, where) for ptr, got in want.items() if ptr in views
            for own, k, v, where in got if 0 < views[ptr] and 2 * views[ptr] < own]


def child_processes(limit=8):
    """The children this process started through Python's multiprocessing that are alive by its own record
    (multiprocessing.process._children: a DataLoader's workers, a Pool's, the worker a dask-cuda Nanny spawns), as
    (pid, name): the name the code that started it gave the Process ("Dask Worker process (from Nanny)",
    "SpawnPoolWorker-3"), or None where it kept the default one ("SpawnProcess-2": a DataLoader's workers, whose
    target start() forgets, or any other unnamed process).  Read from the record as it is: active_children() would
    poll and reap finished ones.  None when multiprocessing was never imported (no child of it to read); never
    raises."""
    mp = sys.modules.get("multiprocessing.process")
    if mp is None:
        return None
    try:
        kids = list(getattr(mp, "_children", None) or ())
    except Exception:
        return None
    out = []
    for p in kids:
        try:
            pid = int(getattr(getattr(p, "_popen", None), "pid", 0) or 0)
            if pid <= 0:
                continue
            name = getattr(p, "_name", None)
            default = "%s-%s" % (type(p).__name__, ":".join(str(i) for i in getattr(p, "_identity", ()) or ()))
            out.append((pid, name if isinstance(name, str) and name and name != default else None))
        except Exception:
            continue
    out.sort(key=lambda c: c[0])
    return out[:limit]


def _result(scan, allocated, complete, why, t0, unknown=()):
    roles = dict((r, [None, 0] if r in unknown else [v[0], v[1]]) for r, v in scan.totals.items())
    known = sum(v[0] for r, v in scan.totals.items() if r != "activations" and r not in unknown)
    if allocated is None:
        roles["activations"] = [None, 0]
        why = why or "the framework's allocated bytes are unknown"
    elif not complete:
        roles["activations"] = [None, 0]
    else:
        roles["activations"] = [max(0, int(allocated) - known), 0]
        if known > int(allocated):
            why = "the roles found exceed the allocated bytes by %d (read at different times)" % (known - int(allocated))
    # the allocated blocks no role reached (activations and temporaries): a copy of the parameters or the
    # optimizer state among them, by block sizes (only with the allocator's blocks, a finished scan)
    rest_copy = None
    if complete and scan.sizes is not None:
        rest = {}
        for ptr, size in scan.sizes.items():
            if ptr not in scan.seen:
                rest[size] = rest.get(size, 0) + 1
        rest_copy = copy_among(rest, scan.sizes_of)
    hs = sorted(scan.holders.items(), key=lambda kv: (-kv[1][0], kv[0]))[:TOP_HOLDERS]
    holders = []
    for (name, kind, where), (b, n, ptr, _, graphs, restored, records, f64, bound_b, bound_n) in hs:
        sep = " " if where.startswith("on ") else ", "
        label = "%s (%s%s%s)" % (name, kind, sep, where)
        owner = where[3:] if where.startswith("on ") else ""      # the class whose attribute it is
        purpose = (purpose_of((name,), (kind, owner)) or scan.path_purposes.get((name, kind, where)) or
                   output_history(name, where))
        copied = copy_of(scan.sizes_of.get((name, kind, where), {}), scan.sizes_of)
        # what torch.load restored onto the GPU of its tensors (None: not watched), and the line that restored most
        rb = sum(restored.values()) if scan.restored is not None else None
        rsite = max(restored.items(), key=lambda kv: (kv[1], kv[0]))[0] if restored else None
        holders.append((label, name, kind, where, b, n, scan.sites.get(ptr), purpose, copied, graphs, rb, rsite,
                        records, f64, bound_b, bound_n))
    dtypes = None if "parameters" in unknown else dict((k, list(v)) for k, v in scan.dtypes.items())
    return {"allocated": allocated, "roles": roles, "optimizers": scan.optimizers, "holders": holders,
            "parameters_by_dtype": dtypes,
            "models": list(scan.models), "activations_copy_of": rest_copy, "ddp": scan.ddp,
            "attention_modules": scan.attention,
            "copy_made": getattr(scan, "copy_made", None),
            "per_sample_count": (scan.per_sample or None) if "per_sample_gradients" not in unknown else None,
            "lora_bytes": scan.lora,
            "lora_base_bytes": getattr(scan, "lora_base", None),
            "embedding_bytes": scan.embedding if scan.models else None,
            "embedding_tables": len(scan.embedding_seen) if scan.models else None,
            "complete": complete, "why": why, "elapsed_ms": (_clock() - t0) * 1000.0,
            "objects": scan.objects, "sampled": scan.sampled}


def measure_arrays(framework, array_type, arrays, allocated, storage, budget=None, frame_roots=True):
    """A framework whose live arrays are known but not what they are for (JAX: jax.live_arrays()):
    held_by_python is every live array on the failing device (all of them are Python objects),
    the largest named holders as measure() names them; parameters, buffers, gradients, optimizer
    state and graph pools are unknown (None); activations = allocated - the live arrays (XLA's
    temporaries and the running computation's buffers).  storage(a) -> (key, bytes on the failing
    device) or None.  Same result as measure(); never raises."""
    t0 = _clock()
    budget = budget_s() if budget is None else float(budget)
    if budget <= 0:
        return None
    try:
        import types
        ns = types.SimpleNamespace(Tensor=array_type, __file__=getattr(framework, "__file__", None) or "")
        scan = _Scan(ns, lambda a: True, None, 1, None, None, t0 + budget)
        if not getattr(framework, "__file__", None):
            scan.exclude = ()
        scan.storage = storage
        complete, why = True, ""
        gc_was = gc.isenabled()
        gc.disable()
        try:
            scan.stage = "the live arrays"
            total = [0, 0]
            keys = set()
            for a in arrays:
                scan.tick()
                st = storage(a)
                if st is not None and st[0] not in keys:
                    keys.add(st[0])
                    total[0] += st[1]
                    total[1] += 1
            _named_holders(scan, [], frame_roots)
            scan.totals["held_by_python"] = total
        except _OutOfTime:
            complete, why = False, "the scan stopped at its time budget (%g ms) while reading %s" % (
                budget * 1000.0, scan.stage)
        finally:
            if gc_was:
                gc.enable()
        r = _result(scan, allocated, complete, why, t0,
                    unknown=("parameters", "buffers", "gradients", "per_sample_gradients", "optimizer_state",
                             "graph_pools"))
        if not complete:
            r["roles"]["held_by_python"] = [None, 0]
        r["why"] = r["why"] or ("parameters, gradients and optimizer state are arrays like the others here: "
                                "not told apart")
        return r
    except Exception as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}


def _clean(s):
    return str(s).replace("\t", " ").replace("\n", " ")


def encode(r):
    """The measurement as the shim reads it (oomguard_framework_stats_t.roles): one record a line,
    fields separated by tabs; '-' is unknown.
      role  NAME BYTES TENSORS | optimizer CLASS BYTES TENSORS PARAMETER_BYTES NOT_ELEMENTWISE_BYTES |
      dtype NAME BYTES TENSORS (the parameters by dtype; with `meta by_dtype 1`: measured) |
      holder BYTES TENSORS LABEL NAME KIND WHERE FILE LINE FUNCTION PURPOSE COPY_OF GRAPHS RESTORED_BYTES RESTORED_FILE
      RESTORED_LINE RESTORED_FUNCTION RECORDS FLOAT64_BYTES BOUND_BYTES BOUND_RECORDS (what torch.load restored onto
      the GPU of its tensors, and where; RECORDS: the like records it is a collection of, _records; FLOAT64_BYTES: its
      float64 tensors; BOUND_BYTES, BOUND_RECORDS: the budget its owner names for it, _bound, - none) |
      model CLASS BYTES TENSORS COUNT FROZEN NAMED RUNNING NAMES PURPOSE TRAINED STEPPED AWAY TRAINING FLOAT32
      QUANTIZED (NAMED:
      roots the running code holds by a name, RUNNING: roots whose method runs, NAMES: those names, comma-separated,
      AWAY: bytes of one root's parameters not on the failing device, TRAINING: roots in training mode, FLOAT32: bytes
      of one root's parameters on the device in float32, QUANTIZED: those in a dtype of 8 bits or fewer, - unknown) |
      operation NAME FILE LINE FUNCTION ARGUMENT (the failing operation, oomguard_phase.OPERATIONS; ARGUMENT
      the argument its row read, need_weights=True, or -) |
      ddp WRAPPERS BUCKET_BYTES (DistributedDataParallel wrappers without gradient_as_bucket_view) |
      statement FILE LINE FUNCTION TARGET PURPOSE NAMES INTS |
      accumulating FILE LINE FUNCTION TARGET OPERAND | setting FACT FILE LINE FUNCTION KEY (the program's line that
      sets a fact of oomguard_phase.CODE_SETTINGS, by the keyword KEY) |
      steps MADE ALLOCATED,... (after each of an optimizer's latest steps, oldest first) |
      generation_input NAME D0,D1,... (the input of the generate() call running at the failure and its shape,
      batch first) | child PID NAME (a child multiprocessing started and the name its starter gave it, - the
      default one: child_processes) | layer NAME INDEX COUNT ALIKE (the failing pass runs in layer INDEX, from 0, of a
      run of COUNT like layers its model holds under NAME, ALIKE 1 when its first, failing and last layers hold as
      many bytes of parameters, 0 when not, - not read: failing_layer) |
      meta KEY VALUE
      (meta num_beams N: the beam width of the generation running at the failure; meta checkpointing 0|1: activation
      checkpointing off or in force for the failing pass; meta batch_size N: the batch the program names;
      meta children_read 1: the child lines are this process's multiprocessing children, all of them;
      meta statement_model_device N NAME: the GPU of the models the failing statement reads, another than the
      failing one, and the name of the first;
      meta copy_made N: the bytes a copy.deepcopy running at the failure made so far; meta per_sample_count N: the
      most examples a per-sample gradient holds; meta lora_bytes N: the parameters of LoRA adapters;
      meta lora_base_bytes N: the other parameters that require grad (PEFT's modules_to_save aside); meta
      embedding_bytes N: the models' embedding tables' parameters; meta embedding_tables N: how many tensors; meta
      autocast_in_code 1: a function of the program on the failing stack enters autocast; meta
      input_requires_grad 1: a tensor the outermost model's forward was given requires grad (not a parameter); meta
      scaler_without_autocast 1: one names a GradScaler and none of the program's files names autocast; meta
      backward_in_code 1: a function of the program on the failing stack calls backward; meta backward_on_stack 1|0:
      a frame of the failing stack, a framework's too, calls backward or autograd.grad, or none does)"""
    if not r or "roles" not in r:
        return None
    out = []
    for name in ROLES:
        b, n = r["roles"].get(name, [None, 0])
        out.append("role\t%s\t%s\t%d" % (name, "-" if b is None else int(b), int(n)))
    for cls, v in sorted(r["optimizers"].items()):
        pb = v[2] if len(v) > 2 else None
        shaped = v[3] if len(v) > 3 else None
        out.append("optimizer\t%s\t%d\t%d\t%s\t%s" % (_clean(cls), int(v[0]), int(v[1]), "-" if pb is None else int(pb),
                                                    "-" if shaped is None else int(shaped)))
    dtypes = r.get("parameters_by_dtype")
    if dtypes is not None:
        for name, (b, n) in sorted(dtypes.items(), key=lambda kv: (-kv[1][0], kv[0])):
            out.append("dtype\t%s\t%d\t%d" % (_clean(name), int(b), int(n)))
        out.append("meta\tby_dtype\t1")
    for h in r["holders"]:
        label, name, kind, where, b, n, site = h[:7]
        purpose = h[7] if len(h) > 7 else None
        copied = h[8] if len(h) > 8 else None
        graphs = h[9] if len(h) > 9 else 0
        rb = h[10] if len(h) > 10 else None
        rf, rln, rfn = (h[11] if len(h) > 11 else None) or ("-", 0, "-")
        records = h[12] if len(h) > 12 else 0
        f64 = h[13] if len(h) > 13 else None
        bound_b = h[14] if len(h) > 14 else None
        bound_n = h[15] if len(h) > 15 else None
        f, ln, fn = site if site else ("-", 0, "-")
        out.append("holder\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t%d\t%s\t%s\t%s\t%d\t%s\t%s\t%d\t%s\t%d\t%s\t%s\t%s" % (
            int(b), int(n), _clean(label), _clean(name), _clean(kind), _clean(where), _clean(f), int(ln), _clean(fn),
            _clean(purpose or "-"), _clean(copied or "-"), int(graphs), "-" if rb is None else int(rb), _clean(rf),
            int(rln), _clean(rfn), int(records or 0), "-" if f64 is None else int(f64),
            "-" if bound_b is None else int(bound_b), "-" if bound_n is None else int(bound_n)))
    for m in r.get("models") or ():
        cls, b, n, k, frozen = m[:5]
        line = "model\t%s\t%d\t%d\t%d\t%d" % (_clean(cls), int(b), int(n), int(k), 1 if frozen else 0)
        if len(m) >= 8:
            line += "\t%d\t%d\t%s" % (int(m[5]), int(m[6]), _clean(",".join(m[7][:4])) or "-")
        if len(m) >= 9:
            line += "\t%s" % _clean(m[8] or "-")
        if len(m) >= 10:
            line += "\t%s" % ("-" if m[9] is None else int(m[9]))
        if len(m) >= 11:
            line += "\t%s" % ("-" if m[10] is None else int(m[10]))
        if len(m) >= 12:
            line += "\t%d" % int(m[11] or 0)
        if len(m) >= 13:
            line += "\t%s" % ("-" if m[12] is None else int(m[12]))
        if len(m) >= 14:
            line += "\t%s" % ("-" if m[13] is None else int(m[13]))
        if len(m) >= 15:
            line += "\t%s" % ("-" if m[14] is None else int(m[14]))
        out.append(line)
    op = r.get("operation")
    if op:
        name, (f, ln, fn), arg = op
        out.append("operation\t%s\t%s\t%d\t%s\t%s" % (_clean(name), _clean(f), int(ln), _clean(fn),
                                                     _clean(arg or "-")))
    if r.get("ddp"):
        wrappers, buckets = r["ddp"]
        out.append("ddp\t%d\t%d" % (int(wrappers), int(buckets)))
    st = r.get("statement")
    if st:
        f, ln, fn, target, names, purpose = st[:6]
        ints = st[6] if len(st) > 6 else ()
        out.append("statement\t%s\t%d\t%s\t%s\t%s\t%s\t%s" % (
            _clean(f), int(ln), _clean(fn), _clean(target or "-"), _clean(purpose or "-"),
            _clean(",".join(names[:8]) or "-"), ",".join(str(int(v)) for v in ints[:8]) or "-"))
    acc = r.get("accumulating")
    if acc:
        f, ln, fn, target, operand = acc[:5]
        out.append("accumulating\t%s\t%d\t%s\t%s\t%s" % (_clean(f), int(ln), _clean(fn), _clean(target),
                                                          _clean(operand or "-")))
    for fact, at in sorted((r.get("code_settings") or {}).items()):
        f, ln, fn, key = at[:4]
        out.append("setting\t%s\t%s\t%d\t%s\t%s" % (_clean(fact), _clean(f), int(ln), _clean(fn), _clean(key)))
    if r.get("attention_modules") is not None:
        out.append("meta\tattention_modules\t%d" % int(r["attention_modules"]))
    if r.get("num_beams"):
        out.append("meta\tnum_beams\t%d" % int(r["num_beams"]))
    if r.get("generation_input"):
        name, shape = r["generation_input"][:2]
        out.append("generation_input\t%s\t%s" % (_clean(name), ",".join(str(int(d)) for d in shape[:6])))
    if r.get("checkpointing") is not None:
        out.append("meta\tcheckpointing\t%d" % (1 if r["checkpointing"] else 0))
    if r.get("failing_layer"):
        name, index, count = r["failing_layer"][:3]
        alike = r["failing_layer"][3] if len(r["failing_layer"]) > 3 else None
        out.append("layer\t%s\t%d\t%d\t%s" % (_clean(name) or "-", int(index), int(count),
                                                 "-" if alike is None else 1 if alike else 0))
    if r.get("batch_size"):
        out.append("meta\tbatch_size\t%d" % int(r["batch_size"]))
    if r.get("child_processes") is not None:
        out.append("meta\tchildren_read\t1")
        for pid, name in r["child_processes"]:
            out.append("child\t%d\t%s" % (int(pid), _clean(name or "") or "-"))
    if r.get("statement_model_device") is not None:
        gpu, name = r["statement_model_device"][:2]
        out.append("meta\tstatement_model_device\t%d\t%s" % (int(gpu), _clean(name or "-")))
    if r.get("autocast_in_code"):
        out.append("meta\tautocast_in_code\t1")
    if r.get("scaler_without_autocast"):
        out.append("meta\tscaler_without_autocast\t1")
    if r.get("backward_in_code"):
        out.append("meta\tbackward_in_code\t1")
    if r.get("input_requires_grad"):
        out.append("meta\tinput_requires_grad\t1")
    if r.get("backward_on_stack") is not None:
        out.append("meta\tbackward_on_stack\t%d" % (1 if r["backward_on_stack"] else 0))
    out.append("meta\tallocated\t%s" % ("-" if r["allocated"] is None else int(r["allocated"])))
    out.append("meta\tcomplete\t%d" % (1 if r["complete"] else 0))
    out.append("meta\telapsed_us\t%d" % int(r["elapsed_ms"] * 1000))
    out.append("meta\tobjects\t%d" % int(r["objects"]))
    out.append("meta\tsampled\t%d" % int(r.get("sampled", 0)))
    if r.get("last_step_age") is not None:
        out.append("meta\tlast_step_age_us\t%d" % int(r["last_step_age"] * 1e6))
    if r.get("copy_made") is not None:
        out.append("meta\tcopy_made\t%d" % int(r["copy_made"]))
    if r.get("per_sample_count"):
        out.append("meta\tper_sample_count\t%d" % int(r["per_sample_count"]))
    if r.get("lora_bytes") is not None:
        out.append("meta\tlora_bytes\t%d" % int(r["lora_bytes"]))
    if r.get("lora_base_bytes") is not None:
        out.append("meta\tlora_base_bytes\t%d" % int(r["lora_base_bytes"]))
    if r.get("embedding_bytes") is not None:
        out.append("meta\tembedding_bytes\t%d" % int(r["embedding_bytes"]))
    if r.get("embedding_tables") is not None:
        out.append("meta\tembedding_tables\t%d" % int(r["embedding_tables"]))
    if r.get("activations_copy_of"):
        role, b = r["activations_copy_of"]
        out.append("meta\tactivations_copy_of\t%s\t%d" % (_clean(role), int(b)))
    if r.get("steps"):
        made, series = r["steps"][:2]
        on_device = r["steps"][4] if len(r["steps"]) >= 5 else None
        out.append("steps\t%d\t%s%s" % (int(made), ",".join(str(int(v)) for v in series[-32:]) or "-",
                                         "" if on_device is None else "\t%d" % int(on_device)))
        if len(r["steps"]) >= 4 and r["steps"][3]:
            every, run = r["steps"][2:4]
            out.append("steps_run\t%d\t%s" % (int(every), ",".join(str(int(v)) for v in run[-32:])))
    if r.get("why"):
        out.append("meta\twhy\t%s" % _clean(r["why"]))
    return "\n".join(out) + "\n"
