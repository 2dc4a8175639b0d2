"""What the job was doing when an allocation failed (event.phase in the dump; docs/dump-format.md),
from the Python stack of the failing thread and the adapter's flags -- never from block sizes.

PATTERNS is the one table: (phase, priority, file pattern, function pattern), fnmatch patterns on
the frame's file ('/'-separated) and function name.  Every frame of the failing stack is matched;
the match of highest priority decides, the innermost among equals, and that frame is reported
(event.phase_frame), with the program's own line at or outside it (event.phase_site: site(), the
call into the framework, `loss.backward()`; a framework's frame is told by the one table of their
packages, common/framework_code.def).  Before the table:
  * oom_handler: the failing thread is inside the `except` block of an earlier out-of-memory error
    (sys.exc_info(), or the chain of the exception being raised): the job retries in the handler;
  * the failing thread has no frame of its own (PyTorch's autograd engine threads run backward
    with no Python frames): the thread that called backward() decides, found in
    sys._current_frames();
after it, two flags: a forward pass with autograd off is an evaluation, and so is one with autograd on
whose every module on the stack is in eval mode (model.eval(): a validation pass that forgot no_grad).  When no frame matches, the
failing statement (statement(): the name it assigns to, the names it reads) may say what it builds:
PURPOSE_PHASES maps the purpose of those names (a checkpoint, an average of the weights) to a phase.
No Python stack at all: unknown (None).  Python 3.9+, standard library only; never raises.
"""
import fnmatch
import os
import sys
import threading

PHASES = ("loading", "forward", "backward", "optimizer_step", "evaluation", "generation", "collective",
          "oom_handler", "ema_update")

# (phase, priority, file pattern, function pattern): higher priority wins; data, not code
PATTERNS = (
    ("loading", 50, "*/torch/serialization.py", "*"),
    ("loading", 50, "*/safetensors/*", "*"),
    ("loading", 50, "*", "from_pretrained"),
    ("loading", 50, "*", "load_state_dict"),
    ("loading", 50, "*", "load_checkpoint"),
    ("loading", 50, "*", "dequantize"),
    ("loading", 50, "*", "dequantize_and_replace"),
    ("loading", 50, "*", "prepare_model_for_kbit_training"),
    ("loading", 50, "*/torch/nn/modules/module.py", "to"),
    ("loading", 50, "*/torch/nn/modules/module.py", "cuda"),
    ("loading", 50, "*/torch/nn/modules/module.py", "_apply"),
    ("loading", 50, "*/torch/nn/modules/module.py", "_load_from_state_dict"),
    ("generation", 45, "*", "generate"),
    ("generation", 45, "*", "generate_*"),
    ("generation", 45, "*/transformers/generation/*", "*"),
    ("ema_update", 42, "*/torch/optim/swa_utils.py", "update_parameters"),
    ("ema_update", 42, "*/timm/utils/model_ema.py", "*"),
    ("ema_update", 42, "*", "update_ema"),
    ("ema_update", 42, "*", "ema_update"),
    ("optimizer_step", 40, "*/torch/optim/*", "*"),
    ("optimizer_step", 40, "*/bitsandbytes/optim/*", "*"),
    ("optimizer_step", 40, "*/apex/optimizers/*", "*"),
    ("optimizer_step", 40, "*/deepspeed/ops/adam/*", "*"),
    ("optimizer_step", 40, "*/optax/*", "*"),
    ("backward", 35, "*/torch/autograd/__init__.py", "backward"),
    ("backward", 35, "*/torch/autograd/__init__.py", "grad"),
    ("backward", 35, "*/torch/autograd/graph.py", "_engine_run_backward"),
    ("backward", 35, "*/torch/_tensor.py", "backward"),
    ("backward", 35, "*/jax/_src/api.py", "*grad*"),
    ("collective", 30, "*/torch/distributed/distributed_c10d.py", "*"),
    ("collective", 30, "*/torch/distributed/_functional_collectives*.py", "*"),
    ("collective", 30, "*/torch/cuda/nccl.py", "*"),
    ("collective", 30, "*/deepspeed/comm/*", "*"),
    ("evaluation", 20, "*", "evaluate"),
    ("evaluation", 20, "*", "evaluation_loop"),
    ("evaluation", 20, "*", "validate"),
    ("evaluation", 20, "*", "validation_step"),
    ("evaluation", 20, "*", "test_step"),
    ("evaluation", 20, "*", "predict_step"),
    ("evaluation", 20, "*", "prediction_step"),
    ("forward", 10, "*/torch/nn/modules/module.py", "_call_impl"),
    ("forward", 10, "*", "forward"),
)

# Frames that decide no phase though a pattern above names them: torch's helpers whose names only sound
# like a phase (a causal mask made by `generate_square_subsequent_mask` in a training forward)
NOT_PHASES = (("*/torch/nn/modules/transformer.py", "generate_square_subsequent_mask"),)

# What the failing statement builds, when no frame of the table matched: the purpose of the name it
# assigns to (or of the names it reads), as oomguard_roles.PURPOSES tells it -> the phase.  A statement
# `ckpt = restore(path)` is a checkpoint arriving; `ema = copy.deepcopy(model)` an average of the
# weights being made or updated.
PURPOSE_PHASES = (("checkpoint", "loading"), ("ema", "ema_update"))

# The modules of torch that hold a convolutional network's weights: the convolutions (transposed ones too) and the
# normalizations beside them (activations, pooling and dropout hold none).  A block is read as far as
# _CONV_BLOCK_MODULES modules: a block is small, a whole network is not one.
_CONV_MODULES = ("torch.nn.modules.conv",)
_NORM_MODULES = ("torch.nn.modules.batchnorm", "torch.nn.modules.instancenorm", "torch.nn.modules.normalization")
_CONV_BLOCK_MODULES = 64


def conv_block(module):
    """Whether `module` is a convolutional block: among it and its submodules (at most _CONV_BLOCK_MODULES), every
    one that holds a parameter is one of torch's convolutions or normalizations, and one at least is a
    convolution.  Reads the modules' dicts only: nothing is called.  Never raises."""
    try:
        todo, seen, conv = [module], set(), False
        while todo:
            m = todo.pop()
            if id(m) in seen:
                continue
            seen.add(id(m))
            if len(seen) > _CONV_BLOCK_MODULES:
                return False
            d = getattr(m, "__dict__", None) or {}
            if any(p is not None for p in (d.get("_parameters") or {}).values()):
                kind = type(m).__module__
                if kind in _CONV_MODULES:
                    conv = True
                elif kind not in _NORM_MODULES:
                    return False
            todo.extend(c for c in (d.get("_modules") or {}).values() if c is not None)
        return conv
    except Exception:
        return False


class Argument:
    """In place of a class pattern in OPERATIONS: the frame's own argument `name` has the value `value`
    (nn.MultiheadAttention called with need_weights=True), in a method of a class `kind` matches ("*": any, a
    function too).  str() is what the dump records as the operation's argument."""

    def __init__(self, name, value, kind="*"):
        self.name, self.value, self.kind = name, value, kind

    def __str__(self):
        return "%s=%r" % (self.name, self.value)

    def holds(self, f):
        """Whether frame `f` has the argument with this value (an argument, not a later local: the frame's code
        lists it among its arguments).  Never raises."""
        try:
            code = f.f_code
            if self.name not in code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]:
                return False
            from oomguard_roles import _frame_locals
            args = dict(_frame_locals(f))
            if self.kind != "*" and not (code.co_varnames[:1] == ("self",) and "self" in args and
                                         fnmatch.fnmatchcase(type(args["self"]).__name__, self.kind)):
                return False
            return self.name in args and args[self.name] is self.value
        except Exception:
            return False


# What the failing operation is (roles.operation in the dump; common/operations.def): (operation, priority,
# file pattern, function pattern, class pattern), fnmatch patterns on the frame's file, its function and the
# class of its `self` ("*": any, a function too), or in place of the class pattern a test of the `self` object
# itself (conv_block: what its layers are, whatever the class is called) or of an argument of the frame (Argument:
# the dump records which).  Every frame of the failing stack is matched, the framework's and the libraries' too
# (torch/nn/functional.py's cross_entropy, diffusers' decoder); the match of highest priority decides, the
# innermost among equals.  Data, not code: an operation a remedy can split or fuse.
OPERATIONS = (
    # a transducer's loss over its joint network's [batch, frames, target tokens, vocabulary] output (torchaudio's
    # rnnt_loss and RNNTLoss, k2's rnnt_loss*, warp-rnnt; NeMo's RNNTLoss) and the joint network making it (NeMo's
    # RNNTJoint, torchaudio's _Joiner): above cross_entropy, whose log_softmax a joint network may call
    ("transducer_loss", 32, "*", "*rnnt_loss*", "*"),
    ("transducer_loss", 32, "*", "forward", "*RNNTLoss*"),
    ("transducer_loss", 31, "*", "*", "*RNNTJoint*"),
    ("transducer_loss", 31, "*", "forward", "*Joiner*"),
    ("cross_entropy", 30, "*", "cross_entropy", "*"),
    ("cross_entropy", 30, "*", "*cross_entropy_loss", "*"),
    ("cross_entropy", 30, "*", "log_softmax", "*"),
    ("cross_entropy", 30, "*/torch/nn/functional.py", "nll_loss", "*"),
    ("image_decode", 20, "*/diffusers/models/autoencoders/*", "*", "*"),
    ("image_decode", 20, "*/diffusers/models/upsampling.py", "*", "*"),
    ("image_decode", 20, "*", "decode", "*Autoencoder*"),
    ("image_decode", 20, "*", "decode", "*VAE*"),
    ("image_decode", 20, "*", "decode", "*Vae*"),
    ("image_decode", 20, "*", "decode", "VQ*"),
    ("image_decode", 15, "*/torch/nn/functional.py", "interpolate", "*"),
    ("image_decode", 15, "*/torch/nn/modules/upsampling.py", "*", "*"),
    ("pairwise", 20, "*", "cdist", "*"),
    ("pairwise", 20, "*/torch/nn/functional.py", "pairwise_distance", "*"),
    # every box against every box (anchors x ground truth, detections x detections): torchvision's box ops and
    # the programs' own box_iou / generalized_box_iou
    ("pairwise", 20, "*/torchvision/ops/boxes.py", "*", "*"),
    ("pairwise", 20, "*", "*box_iou", "*"),
    # a Gaussian process's kernel matrix, K(X, X): every training point against every other (GPyTorch's kernels,
    # their covar_dist and the lazy kernel tensor's evaluate_kernel, a program's own kernel classes)
    ("kernel_matrix", 20, "*/gpytorch/kernels/*", "*", "*"),
    ("kernel_matrix", 20, "*", "covar_dist", "*"),
    ("kernel_matrix", 20, "*", "evaluate_kernel", "*"),
    ("kernel_matrix", 18, "*", "forward", "*Kernel"),
    # a graph network's message passing: PyTorch Geometric's layers and aggregations, DGL's message passing, and a
    # module class named as a graph convolution (GCNConv, GATConv, GATv2Conv, SAGEConv, GINConv, GraphConv,
    # EdgeConv) in its forward: above the image convolutions, whose class pattern *Conv* such names also match
    ("graph_messages", 12, "*/torch_geometric/nn/*", "*", "*"),
    ("graph_messages", 12, "*/torch_geometric/utils/*", "scatter*", "*"),
    ("graph_messages", 12, "*/dgl/*", "*", "*"),
    ("graph_messages", 9, "*", "forward", "*GCNConv*"),
    ("graph_messages", 9, "*", "forward", "*GATConv*"),
    ("graph_messages", 9, "*", "forward", "*GATv2Conv*"),
    ("graph_messages", 9, "*", "forward", "*SAGEConv*"),
    ("graph_messages", 9, "*", "forward", "*GINConv*"),
    ("graph_messages", 9, "*", "forward", "*GraphConv*"),
    ("graph_messages", 9, "*", "forward", "*EdgeConv*"),
    # a convolution, pooling or normalization over an image or volume: torch's modules (conv2d itself is a
    # builtin, no frame), the functional pooling, and a network's own block classes named *Conv* (ConvBlock,
    # DoubleConv, BasicConv2d) in their forward; below the decoders (a decoder's convolutions are its decode)
    ("conv", 10, "*/torch/nn/modules/conv.py", "*", "*"),
    ("conv", 10, "*/torch/nn/modules/pooling.py", "*", "*"),
    ("conv", 10, "*/torch/nn/functional.py", "*pool[123]d*", "*"),
    ("conv", 8, "*", "forward", "*Conv*"),
    # ... and a block of any name whose layers with weights are all convolutions and their normalizations
    # (ResNet's BasicBlock, a U-Net's Down, ESRGAN's ResidualDenseBlock): what fails in its forward (a torch.cat of
    # feature maps, a residual sum) is made of feature maps, at full resolution as the convolutions' are
    ("conv", 7, "*", "forward", conv_block),
    # attention computed eagerly: Hugging Face's eager_attention_forward (the "eager" attn_implementation; sdpa
    # and flash run other functions) and the _attn method of older models' attention classes
    ("attention", 25, "*", "eager_attention_forward", "*"),
    ("attention", 25, "*", "_attn", "*Attention*"),
    # ... and nn.MultiheadAttention asked for its weights (need_weights=True, its default): PyTorch 2 runs the fused
    # kernel only without them, so the softmax of every head, batch x heads x L x L, is made whole; torch's own
    # functional frame, or the forward of any class of that name (a copy of torch's module)
    ("attention", 25, "*/torch/nn/functional.py", "multi_head_attention_forward", Argument("need_weights", True)),
    ("attention", 25, "*", "forward", Argument("need_weights", True, "MultiheadAttention")),
    # a dense attention mask made whole, batch x 1 x L x L: transformers' mask utilities (a packed batch's 4D
    # block-causal mask expanded, its copy for SDPA) and the models' _update_causal_mask; above attention, whose
    # mask a model may build inside its attention
    ("attention_mask", 26, "*/transformers/modeling_attn_mask_utils.py", "*", "*"),
    ("attention_mask", 26, "*", "_update_causal_mask", "*"),
    ("attention_mask", 26, "*", "_prepare_4d_causal_attention_mask*", "*"),
    ("attention_mask", 26, "*", "_unmask_unattended", "*"),
    # a deep copy being made (of a model, an optimizer's state_dict): the standard library's copy.deepcopy and
    # the __deepcopy__ it calls (torch's Tensor and Parameter); lowest: an operation inside a copy decides
    ("copy", 5, "*/copy.py", "deepcopy", "*"),
    ("copy", 5, "*", "__deepcopy__", "*"),
)

_HERE = os.path.dirname(os.path.abspath(__file__))
_cache = {}


def _table_rows():
    """The rows of framework_code.def (installed next to the adapters; common/ of the source tree), the
    table the library and the command read too: {kind: [argument, ...]} for OG_FRAMEWORK_CODE,
    OG_STANDARD_LIBRARY and OG_INSTALLED_PACKAGES."""
    import re
    for path in (os.path.join(_HERE, "framework_code.def"),
                 os.path.join(_HERE, os.pardir, os.pardir, "common", "framework_code.def")):
        try:
            with open(path) as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        rows = {}
        for kind, arg in re.findall(r'^OG_([A-Z_]+)\("([^"\\]*)"\)', text, re.M):
            rows.setdefault(kind, []).append(arg)
        if rows.get("FRAMEWORK_CODE"):
            return rows
    return {}


def _framework_packages(rows):
    """The frameworks' top-level packages: the OG_FRAMEWORK_CODE rows."""
    import re
    got = [p for p in rows.get("FRAMEWORK_CODE", ()) if re.match(r"^[A-Za-z0-9_.]+$", p)]
    return frozenset(got) if got else frozenset(("torch",))


def _standard_library(rows):
    """A regular expression for the OG_STANDARD_LIBRARY rows: a pattern at the start of the path or right
    after a '/', '#' one or more digits; None when the table has none."""
    import re
    pats = ["(?:^|/)" + "[0-9]+".join(re.escape(part) for part in p.split("#"))
            for p in rows.get("STANDARD_LIBRARY", ())]
    return re.compile("|".join(pats)) if pats else None


_ROWS = _table_rows()
FRAMEWORK_PACKAGES = _framework_packages(_ROWS)
INSTALLED_PACKAGES = frozenset(_ROWS.get("INSTALLED_PACKAGES", ("site-packages", "dist-packages")))
_STDLIB = _standard_library(_ROWS)
_fw_files = {}
_std_files = {}


def is_standard_library(filename):
    """A file of the interpreter's standard library by its path, as the library and the command tell it
    (the OG_STANDARD_LIBRARY rows of framework_code.def: ".../lib/python3.11/copy.py", "<frozen runpy>"),
    not a package installed below it (OG_INSTALLED_PACKAGES: ".../lib/python3.11/site-packages/...").
    By path only: a program's own copy.py is the program's.  Never raises."""
    got = _std_files.get(filename)
    if got is None:
        got = False
        try:
            fn = filename.replace(os.sep, "/")
            m = _STDLIB.search(fn) if _STDLIB is not None else None
            if m is not None:
                got = not any(p in INSTALLED_PACKAGES for p in fn[m.end():].split("/")[:-1])
        except Exception:
            got = False
        if len(_std_files) < 4096:
            _std_files[filename] = got
    return got


def is_framework_frame(frame):
    """A frame of a framework's own code (framework_code.def): by its module's top-level package
    (`torch.autograd._engine` is torch's wherever the file lies: the tests' stand-in torch too),
    else by a directory of the file named as such a package."""
    name = frame.f_globals.get("__name__") if frame.f_globals is not None else None
    if isinstance(name, str) and name.partition(".")[0] in FRAMEWORK_PACKAGES:
        return True
    fn = frame.f_code.co_filename
    got = _fw_files.get(fn)
    if got is None:
        parts = fn.replace(os.sep, "/").split("/")[:-1]
        got = any(p in FRAMEWORK_PACKAGES for p in parts)
        if len(_fw_files) < 4096:
            _fw_files[fn] = got
    return got


def site(frame, limit=256):
    """The program's own frame at or outside `frame` (the frame that decided the phase): `frame`
    itself when it is the program's code, else the innermost frame outwards that is (not a
    framework's, the standard library's, an installed package's or the adapters'): the line of the
    program that called into the framework (`loss.backward()`).  None when there is none."""
    try:
        import oomguard_roles
        n = 0
        while frame is not None and n < limit:
            if not _ours(frame) and not is_framework_frame(frame) and \
                    not is_standard_library(frame.f_code.co_filename) and \
                    oomguard_roles.is_user_file(frame.f_code.co_filename):
                return frame
            frame = frame.f_back
            n += 1
    except Exception:
        pass
    return None


def _match(filename, function):
    """(phase, priority) of one frame, or None.  Cached by (file, function)."""
    key = (filename, function)
    r = _cache.get(key, False)
    if r is not False:
        return r
    fn = filename.replace(os.sep, "/")
    best = None
    if not any(fnmatch.fnmatchcase(function, npat) and fnmatch.fnmatchcase(fn, fpat) for fpat, npat in NOT_PHASES):
        for phase, prio, fpat, npat in PATTERNS:
            if (best is None or prio > best[1]) and fnmatch.fnmatchcase(function, npat) and \
                    fnmatch.fnmatchcase(fn, fpat):
                best = (phase, prio)
    if len(_cache) < 4096:
        _cache[key] = best
    return best


def loads(frame):
    """Whether the phase table calls this frame a load (from_pretrained, load_state_dict, Module.to ...)."""
    m = _match(frame.f_code.co_filename, frame.f_code.co_name)
    return m is not None and m[0] == "loading"


def _ours(frame):
    return os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _HERE


def frames_of(frame, limit=256):
    """The frames from `frame` outwards, without the adapters' own."""
    out = []
    while frame is not None and len(out) < limit:
        if not _ours(frame):
            out.append(frame)
        frame = frame.f_back
    return out


def from_frames(frames):
    """(phase, frame) decided by the table, or (None, None)."""
    best, at = None, None
    for f in frames:                       # innermost first: ties keep the innermost
        m = _match(f.f_code.co_filename, f.f_code.co_name)
        if m is not None and (best is None or m[1] > best[1]):
            best, at = m, f
    return (best[0], at) if best else (None, None)


_NO_SELF = object()


def _self(f):
    """The frame's `self` (its first argument), or _NO_SELF when it has none.  Reads the fast local without
    materialising f_locals."""
    code = f.f_code
    if not code.co_argcount or code.co_varnames[0] != "self":
        return _NO_SELF
    try:
        from oomguard_roles import _frame_locals
        for k, v in _frame_locals(f):
            if k == "self":
                return v
    except Exception:
        pass
    return _NO_SELF


def operation(frame, limit=64):
    """(operation, (file, line, function), argument) of the failing stack by OPERATIONS, argument the row's
    Argument as str() or None; or None.  Never raises."""
    try:
        best, at, arg = None, None, None
        for f in frames_of(frame, limit) if frame is not None else ():
            fn = f.f_code.co_filename.replace(os.sep, "/")
            name = f.f_code.co_name
            me = None
            for op, prio, fpat, npat, cpat in OPERATIONS:
                if best is not None and prio <= best[1]:
                    continue
                if not fnmatch.fnmatchcase(name, npat) or not fnmatch.fnmatchcase(fn, fpat):
                    continue
                if isinstance(cpat, Argument):
                    if not cpat.holds(f):
                        continue
                elif cpat != "*":
                    me = _self(f) if me is None else me
                    if callable(cpat):
                        if me is _NO_SELF or not cpat(me):
                            continue
                    elif not fnmatch.fnmatchcase("" if me is _NO_SELF else type(me).__name__, cpat):
                        continue
                best, at, arg = (op, prio), f, str(cpat) if isinstance(cpat, Argument) else None
        return (best[0], _where(at), arg) if best else None
    except Exception:
        return None


# the names a program's code uses when it enters mixed precision: torch.autocast, torch.cuda.amp.autocast,
# accelerate's accelerator.autocast(), and the loss scaler of float16 training
_AUTOCAST_NAMES = frozenset(("autocast", "GradScaler"))


def autocast_in_code(frame, limit=64):
    """True when a function of the program's own code on the failing stack (not a framework's, an installed
    package's or the adapters') loads autocast (or a GradScaler) to use it (_loads_any; an import alone is not):
    the running loop enters mixed precision around some of its work, though autocast may be off at the failing
    line (a loss computed outside the autocast block, a backward pass); None when none does (a caller no longer
    running is not read).
    Reads code objects only: nothing is called.  Never raises."""
    return _program_loads(frame, _AUTOCAST_NAMES, limit)


def _program_loads(frame, names, limit):
    """True when a function of the program's own code on the failing stack (not a framework's, an installed
    package's, the standard library's or the adapters') loads one of NAMES (_loads_any); None when none does."""
    try:
        import oomguard_roles
        for f in frames_of(frame, limit) if frame is not None else ():
            if is_framework_frame(f) or is_standard_library(f.f_code.co_filename) or \
                    not oomguard_roles.is_user_file(f.f_code.co_filename):
                continue
            if _loads_any(f.f_code, names):
                return True
    except Exception:
        pass
    return None


def _loads_any(code, names):
    """True when CODE loads one of NAMES (a global, a name, an attribute or a method: what a call or a `with`
    uses), not only stores it: a script's module code that defines `def backward(loss): ...` or imports autocast
    calls neither.  Its own bytecode, not that of the functions it defines."""
    if not names.intersection(code.co_names):
        return False
    return any(op in _LOADS and op != "LOAD_FAST" and name in names for _, op, name, *_ in _instructions(code))


# the names a program's code calls backward through: loss.backward(), accelerate's accelerator.backward(loss),
# Lightning's self.manual_backward(loss)
_BACKWARD_NAMES = frozenset(("backward", "manual_backward"))


def backward_in_code(frame, limit=64):
    """True when a function of the program's own code on the failing stack (as autocast_in_code reads it) loads
    backward, to call it (_loads_any: a definition named backward is no call): the pass that runs is one whose
    loss the running code backpropagates, a training step though no optimizer of torch's has stepped or holds the
    parameters (a closure handed to scipy's L-BFGS, a first step); None when none does.  Reads code objects only:
    nothing is called."""
    return _program_loads(frame, _BACKWARD_NAMES, limit)


# what calls backward, a framework's frames included: loss.backward(), accelerate's and DeepSpeed's backward(loss),
# Lightning's manual_backward and its closure's _backward_fn, torch.autograd.grad, a pipeline schedule's
# backward of one micro-batch (torch.distributed.pipelining's backward_one_chunk and stage_backward, Megatron's
# backward_step) (exact names: torch's own _call_impl reads _backward_hooks, which call nothing)
_BACKWARD_CALLS = frozenset(("backward", "manual_backward", "_backward_fn", "backward_fn", "grad",
                             "backward_one_chunk", "stage_backward", "backward_step"))


def backward_on_stack(frame, limit=256):
    """Whether a frame of the failing stack, the program's or a framework's (a trainer's training_step, Lightning's
    closure), loads a name it calls backward through (_BACKWARD_CALLS): True when one does, False when the stack was
    read and none does (the pass feeds no backward the running code would call), None when there is no frame.  The
    standard library's frames and the adapters' are not read.  Reads code objects only.  Never raises."""
    try:
        if frame is None:
            return None
        for f in frames_of(frame, limit):
            path = f.f_code.co_filename
            if is_standard_library(path) or os.path.dirname(os.path.abspath(path)) == _HERE:
                continue
            if _loads_any(f.f_code, _BACKWARD_CALLS):
                return True
        return False
    except Exception:
        return None


def scaler_without_autocast(frame, limit=64, max_files=8):
    """True when a function of the program's own code on the failing stack names a GradScaler (the loss scaler of
    float16 training) and none of the program's files (those of its functions on the stack and its __main__) names
    autocast anywhere, comments and strings aside: mixed precision half applied, the scaler scales a float32
    forward.  None otherwise (autocast in a helper not running now still counts as entered).  Never raises; reads
    at most max_files files of _CODE_FILE_LINES lines."""
    try:
        import linecache
        import oomguard_roles
        scaler = False
        for f in frames_of(frame, limit) if frame is not None else ():
            if is_framework_frame(f) or not oomguard_roles.is_user_file(f.f_code.co_filename):
                continue
            names = f.f_code.co_names
            if "autocast" in names:
                return None
            scaler = scaler or "GradScaler" in names
        if not scaler:
            return None
        files = _program_files(frame, limit)
        if not files or len(files) > max_files:
            return None                        # not all of the program read: unknown
        for fn in files:
            lines = linecache.getlines(fn)
            if not lines or len(lines) > _CODE_FILE_LINES:
                return None
            if any("autocast" in t for t in lines) and "autocast" in _source_names(lines):
                return None
        return True
    except Exception:
        return None


def _source_names(lines):
    """The names (NAME tokens) of a source: what comments and strings say is not read."""
    import io
    import tokenize
    out = set()
    try:
        for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if tok.type == tokenize.NAME:
                out.add(tok.string)
    except (tokenize.TokenError, SyntaxError, ValueError, IndentationError):
        pass
    return out


def _program_files(frame, limit):
    """The source files of the program's own functions on the stack, then its __main__ module's."""
    import oomguard_roles
    files = []
    for f in frames_of(frame, limit) if frame is not None else ():
        fn = f.f_code.co_filename
        if not is_framework_frame(f) and oomguard_roles.is_user_file(fn) and fn not in files:
            files.append(fn)
    main = sys.modules.get("__main__")
    mf = getattr(main, "__file__", None)
    if mf and oomguard_roles.is_user_file(mf) and mf not in files:
        files.append(mf)
    return files


# Settings the program's own code passes (a keyword argument or a dict entry) that decide what the failing pass
# keeps: (fact, key, value).  One table, read from the source's tokens (docstrings, other strings and comments
# never match):
#   padding_to_max_length  a tokenizer padding every input to a fixed maximum length, not to the batch's longest
#                          (Hugging Face's padding="max_length", the older pad_to_max_length=True)
#   extra_outputs          a model asked for outputs beyond the one the job uses, kept for every layer or every
#                          generated token: hidden states, attentions, a generation's scores and logits
CODE_SETTINGS = (
    ("padding_to_max_length", "padding", "max_length"),
    ("padding_to_max_length", "pad_to_max_length", True),
    ("extra_outputs", "output_hidden_states", True),
    ("extra_outputs", "output_attentions", True),
    ("extra_outputs", "output_scores", True),
    ("extra_outputs", "output_logits", True),
)
_SETTING_OF = dict(((key, value), fact) for fact, key, value in CODE_SETTINGS)
_SETTING_WORDS = tuple(set(key for _, key, _ in CODE_SETTINGS))
_CODE_FILE_LINES = 20000  # a file longer than this is not read (the adapter's time at a failure is bounded)


def _settings_in(lines):
    """{fact: (0-based line, key)} of the first line setting each CODE_SETTINGS fact in this source."""
    import ast
    import io
    import tokenize
    found = {}
    prev = []  # the latest three significant tokens: (type, string, row)
    try:
        for tok in tokenize.generate_tokens(io.StringIO("".join(lines)).readline):
            if tok.type in (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
                continue
            prev = (prev + [(tok.type, tok.string, tok.start[0])])[-3:]
            if len(prev) < 3 or prev[1][1] not in ("=", ":"):
                continue
            (kt, key, row), (vt, val, _) = prev[0], prev[2]
            if kt == tokenize.STRING and prev[1][1] == ":":
                key = ast.literal_eval(key) if key[:1] in "'\"" else None
            elif kt != tokenize.NAME or prev[1][1] != "=":
                continue
            value = ast.literal_eval(val) if vt == tokenize.STRING and val[:1] in "'\"" else \
                (True if vt == tokenize.NAME and val == "True" else None)
            fact = _SETTING_OF.get((key, value))
            if fact and fact not in found:
                found[fact] = (row - 1, key)
    except (tokenize.TokenError, SyntaxError, ValueError, IndentationError):
        pass
    return found


def code_settings(frame, limit=64, max_files=8):
    """{fact: (file, line, function, key)}: for each fact of CODE_SETTINGS, the first line of the program's own
    source that sets it.  Read from the source files of the program's functions on the failing stack and of its
    __main__ module (the tokenizing or generating code often ran before the failing line: a dataset's map, a
    collate function, a helper of the same files).  Never raises; reads at most max_files files of
    _CODE_FILE_LINES lines."""
    out = {}
    try:
        import linecache
        for fn in _program_files(frame, limit)[:max_files]:
            lines = linecache.getlines(fn)
            if not lines or len(lines) > _CODE_FILE_LINES or not any(w in t for t in lines for w in _SETTING_WORDS):
                continue
            for fact, (i, key) in _settings_in(lines).items():
                if fact not in out:
                    out[fact] = (fn, i + 1, _enclosing_def(lines, i), key)
    except Exception:
        pass
    return out


def _enclosing_def(lines, i):
    """The name of the function whose body holds line i (by indentation), or "<module>"."""
    indent = len(lines[i]) - len(lines[i].lstrip())
    for j in range(i - 1, -1, -1):
        s = lines[j].lstrip()
        ind = len(lines[j]) - len(s)
        if s.startswith(("def ", "async def ")) and ind < indent:
            return s.split("def ", 1)[1].split("(", 1)[0].strip() or "<module>"
        if s and ind < indent and not s.startswith(("#", ")", "]", "}")):
            indent = ind
    return "<module>"


def _is_oom(exc):
    seen = 0
    while exc is not None and seen < 16:
        if type(exc).__name__ in ("OutOfMemoryError", "XlaRuntimeError", "ResourceExhaustedError") \
                and ("out of memory" in str(exc).lower() or type(exc).__name__ == "OutOfMemoryError"
                     or "resource_exhausted" in str(exc).lower()):
            return True
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return False


def _handler_frame(exc):
    """The frame whose `except` block handles exc: the first entry of its traceback."""
    tb = getattr(exc, "__traceback__", None)
    return tb.tb_frame if tb is not None else None


def _own_frames(frames, package_dir):
    """Frames of the failing thread outside the framework's package (the program's, a library's)."""
    if not package_dir:
        return frames
    return [f for f in frames if not os.path.abspath(f.f_code.co_filename).startswith(package_dir)]


# detect()'s source when the phase was told by the thread that called backward()
BACKWARD_CALLER = "thread that called backward()"


def backward_caller():
    """The frame of another thread that is inside backward(), or None."""
    me = threading.get_ident()
    for tid, f in list(sys._current_frames().items()):
        if tid == me:
            continue
        for fr in frames_of(f):
            m = _match(fr.f_code.co_filename, fr.f_code.co_name)
            if m is not None and m[0] == "backward":
                return fr
    return None


def detect(frame, grad_enabled=0, exc=None, package_dir=None, stmt=None):
    """(phase, (file, line, function) | None, source, site) for a failure on the thread whose innermost
    frame is `frame` (None: no Python frame); site: (file, line, function) of the program's own line
    at or outside the frame that decided (site()), None when none.  grad_enabled: 1/-1/0 as the adapter's flag.  exc:
    the exception being raised, if the failure is known from one (its chain is looked at);
    package_dir: the framework's own directory ("…/torch/"), whose frames alone do not make a
    thread of its own.  source: "stack" | "exception being handled" | "thread that called
    backward()" | "stack and autograd off" | why it is unknown.  Never raises."""
    phase, at, source = _detect(frame, grad_enabled, exc, package_dir, stmt)
    if isinstance(at, _StmtFrame):
        return phase, at.where, source, at.where
    return phase, _where(at), source, _where(site(at)) if at is not None else None


def _is_module(obj):
    """Whether obj is a torch.nn.Module (by its classes' module and name: no import of torch)."""
    try:
        return any(c.__name__ == "Module" and c.__module__ == "torch.nn.modules.module" for c in type(obj).__mro__)
    except Exception:
        return False


# methods of a torch.nn.Module that put its weights on the device when no loader's frame is on the stack: its
# __init__ (a model constructed on the device: device="cuda", a default device) and a .to() or .cuda() of its own
# (a library's model class overriding torch's, as diffusers' ModelMixin does), with what each is said to do
_MODULE_LOADS = (("__init__", "a model's __init__ making its weights on the device"),
                 ("to", "a model's own to() moving its weights to the device"),
                 ("cuda", "a model's own cuda() moving its weights to the device"))


def _model_being_built(frames):
    """(the outermost frame of a method of _MODULE_LOADS whose self is a torch.nn.Module, what it does), or
    (None, None) when no such frame runs."""
    built = (None, None)
    for f in frames:
        for name, what in _MODULE_LOADS:
            if f.f_code.co_name == name and _is_module(_self(f)):
                built = (f, what)
    return built


def _detect(frame, grad_enabled, exc, package_dir, stmt):
    """(phase, the frame that decided or None, source) for detect()."""
    try:
        frames = frames_of(frame) if frame is not None else []
        handled = sys.exc_info()[1]
        for e, src in ((handled, "exception being handled"),
                       (getattr(exc, "__context__", None), "exception being handled")):
            if e is not None and _is_oom(e):
                hf = _handler_frame(e)
                return "oom_handler", hf, src
        if not _own_frames(frames, package_dir):
            caller = backward_caller()
            if caller is not None:
                return "backward", caller, BACKWARD_CALLER
            if not frames:
                return None, None, "no Python stack"
        phase, at = from_frames(frames)
        if phase is None and stmt and stmt[5]:
            for purpose, ph in PURPOSE_PHASES:
                if purpose == stmt[5]:
                    what = ("assigns to %s" % stmt[3]) if stmt[3] and oomguard_roles_purpose(stmt[3]) == purpose \
                        else "reads %s" % ", ".join(stmt[4][:3])
                    return ph, _StmtFrame(stmt), "the failing statement %s (%s)" % (what, purpose)
        if phase is None:
            built, what = _model_being_built(frames)
            if built is not None:
                return "loading", built, what
            return None, None, "no frame of the stack matches a phase pattern"
        if phase == "forward" and grad_enabled < 0:
            return "evaluation", at, "stack and autograd off"
        if phase == "forward" and grad_enabled > 0 and _eval_mode(frames):
            return "evaluation", at, "stack and the model in eval mode"
        return phase, at, "stack"
    except Exception as e:
        return None, None, "phase not read: %s" % type(e).__name__


_STORES = frozenset(("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF", "STORE_ATTR"))
_LOADS = frozenset(("LOAD_FAST", "LOAD_NAME", "LOAD_GLOBAL", "LOAD_DEREF", "LOAD_ATTR", "LOAD_METHOD",
                    "LOAD_FAST_CHECK", "LOAD_CLASSDEREF", "LOAD_FROM_DICT_OR_DEREF", "LOAD_SUPER_ATTR"))
_ENDS = frozenset(("POP_TOP", "RETURN_VALUE", "RETURN_CONST", "YIELD_VALUE", "GET_ITER", "FOR_ITER",
                   "BEFORE_WITH", "SETUP_WITH", "END_FOR"))
_code_cache = {}


def _instructions(code):
    """[(offset, opname, argval name or None, line, argrepr, end line)] of a code object, cached (at most 512
    code objects).  The end line is the last line of the instruction's own expression (Python 3.11's
    positions: a call's arguments over several lines), its line where positions are not kept."""
    got = _code_cache.get(code)
    if got is not None:
        return got
    import dis
    out, line = [], None
    for ins in dis.get_instructions(code):
        ln = getattr(ins, "line_number", None)
        if ln is None:
            pos = getattr(ins, "positions", None)
            ln = getattr(pos, "lineno", None) if pos is not None else None
        if ln is None:
            sl = ins.starts_line
            ln = sl if isinstance(sl, int) and not isinstance(sl, bool) else line
        line = ln if ln is not None else line
        end = getattr(getattr(ins, "positions", None), "end_lineno", None)
        out.append((ins.offset, ins.opname, ins.argval if isinstance(ins.argval, str) else None, line,
                    ins.argrepr or "", end if isinstance(end, int) and line is not None and end >= line else line))
    if len(_code_cache) < 512:
        _code_cache[code] = out
    return out


_LOCAL_LOADS = frozenset(("LOAD_FAST", "LOAD_DEREF", "LOAD_FAST_CHECK", "LOAD_CLASSDEREF"))


def _int_values(f, names, reads):
    """The int values of the names the statement read (in read order, a name read twice counted
    twice): the sizes its request was computed from (batch * items, seq * seq).  Tensors' shapes are
    not read: a product's inner dimension repeats in both operands."""
    local = None
    out = []
    for name, op in zip(names, reads):
        if op in _LOCAL_LOADS:
            if local is None:
                import oomguard_roles
                local = dict(oomguard_roles._frame_locals(f))
            v = local.get(name)
        elif op in ("LOAD_GLOBAL", "LOAD_NAME"):
            v = f.f_globals.get(name)
        else:
            continue
        if type(v) is int and v > 1:
            out.append(v)
    return out[:8]


def _statement_of(f):
    """(target, names, ints) of the statement frame f is running: the name its result is stored into
    (None when it is not stored: an expression statement, a return), the names it reads, and the
    int values among them (see _int_values)."""
    ins = _instructions(f.f_code)
    lasti = f.f_lasti
    i = 0
    while i + 1 < len(ins) and ins[i + 1][0] <= lasti:
        i += 1
    line = ins[i][3] if ins else None
    # the lines of the running call's own expression: one, or its arguments over several (a formatter's layout)
    last = ins[i][5] if ins and ins[i][5] is not None else line
    names, reads = [], []
    j = i
    while j >= 0 and i - j < 64 and ins[j][3] is not None and line is not None and line <= ins[j][3] <= last:
        # what the statement read before the call
        if ins[j][1] in _LOADS and ins[j][2]:
            names.append(ins[j][2])
            reads.append(ins[j][1])
        j -= 1
    names.reverse()
    reads.reverse()
    ints = _int_values(f, names, reads)
    target = None
    for k in range(i + 1, min(len(ins), i + 64)):           # where its result goes
        op, name = ins[k][1], ins[k][2]
        if op in _STORES:
            target = name
            break
        if op in _ENDS or op.startswith(("JUMP", "POP_JUMP")):
            break
        if op == "STORE_SUBSCR":                            # d[key] = ...: the container is the target
            break
        if op in _LOADS and name:
            names.append(name)
    return target, names, ints


def statement(frame, package_dir=None, limit=8):
    """What the failing statement builds: (file, line, function, target, names, purpose, ints) of the
    innermost frame of the program (not the framework's, the standard library's or an installed
    package's) whose statement stores its result into a name or reads a name with a purpose
    (oomguard_roles.PURPOSES), or runs in a function named for a KV cache (its purpose then);
    None when there is none.  Reads the frame's bytecode (dis), never
    its source; never raises."""
    try:
        import oomguard_roles
        exclude = (package_dir,) if package_dir else ()
        seen = 0
        for f in frames_of(frame, 64):
            if not oomguard_roles.is_user_file(f.f_code.co_filename, exclude):
                continue
            seen += 1
            if seen > limit:
                break
            target, names, ints = _statement_of(f)
            purpose = oomguard_roles.purpose_of((target,)) if target else None
            purpose = purpose or oomguard_roles.purpose_of(names)
            # a function that makes a KV cache names it (allocate_kv_cache, init_kv_caches): its tensors are one
            # whatever the local they land in is called (k, v, blocks)
            if not purpose and oomguard_roles.purpose_of((f.f_code.co_name,)) == "kv_cache":
                purpose = "kv_cache"
            if target or purpose:
                return (f.f_code.co_filename, int(f.f_lineno or 0), f.f_code.co_name, target, names[:8], purpose,
                        ints)
    except Exception:
        pass
    return None


_NAME_STORES = frozenset(("STORE_FAST", "STORE_NAME", "STORE_GLOBAL", "STORE_DEREF"))
_ADD_OPS = frozenset(("BINARY_ADD", "INPLACE_ADD"))                 # Python < 3.11
_ADD_CALLS = frozenset(("add", "_add", "add_", "iadd"))              # torch.add(total, loss), a helper named so


def graph_alive(t, limit=64):
    """True when tensor t has an autograd graph that still holds what it saved for backward (a saved
    tensor of a node reachable from t.grad_fn can be read), False when it has none or backward freed it
    (reading raises RuntimeError), None when no node within `limit` saved a tensor.  Not read while
    saved-tensor hooks are in force (their unpacking may copy or recompute on the device): None.  Never
    raises."""
    try:
        fn = getattr(t, "grad_fn", None)
        if fn is None:
            return False
        torch = sys.modules.get("torch")
        top = getattr(getattr(getattr(torch, "_C", None), "_autograd", None), "_top_saved_tensors_default_hooks", None)
        if top is not None and top() is not None:
            return None
        stack, seen = [fn], set()
        while stack and len(seen) < limit:
            node = stack.pop()
            if node is None or id(node) in seen:
                continue
            seen.add(id(node))
            for a in dir(node):
                if not a.startswith("_saved_"):
                    continue
                try:
                    v = getattr(node, a)
                except RuntimeError:
                    return False
                except Exception:
                    continue
                if v is not None and hasattr(v, "data_ptr"):
                    return True
            try:
                stack.extend(f[0] for f in (node.next_functions or ()) if f)
            except Exception:
                pass
    except Exception:
        pass
    return None


def _in_module(f, local):
    """A frame of a module's own code (forward, a helper method): its residual sums are one pass's."""
    me = local.get("self")
    try:
        return f.f_code.co_name in ("forward", "__call__", "_call_impl") or (
            me is not None and any(c.__name__ == "Module" for c in type(me).__mro__))
    except Exception:
        return False


def accumulation(frame, package_dir=None, limit=8):
    """A running function of the program that sums the outputs of several passes into one tensor whose
    graph is still alive: a statement of its code stores into a name T that the same statement reads,
    with an addition (T = T + x, T += x, T = torch.add(T, x)), and at the failure T and another name that
    statement reads hold tensors whose graphs still hold their saved tensors (graph_alive), as summing
    micro-batches' losses to call backward once on the sum does: every micro-batch's graph stays alive
    until then.  Or keeps them in a list for that one backward: a statement of its code appends to a
    list L (L.append(x), L.extend(...), L.insert(...)), the code calls backward itself (it loads
    the name `backward`), and at the failure L holds at least two tensors whose graphs are alive
    (losses = []; losses.append(loss); torch.stack(losses).mean().backward()); then the operand is None.
    A list of outputs kept after each backward (for metrics) holds freed graphs: not this.
    Frames of a module's own code are not read (a residual x = x + f(x) is one pass), unless that code calls
    backward itself: a training step written as a module's forward (a meta-learner's outer loop over tasks).
    (file, line, function, target, operand) of the innermost such frame of the program; None when none.
    Reads the frames' bytecode and locals with the collector off, as the role scan does (a collection here
    would free garbage a failed pass left, between the framework's numbers and the failure); never raises."""
    import gc
    gc_was = gc.isenabled()
    gc.disable()
    try:
        return _accumulation(frame, package_dir, limit)
    finally:
        if gc_was:
            gc.enable()


def _accumulation(frame, package_dir, limit):
    try:
        import oomguard_roles
        exclude = (package_dir,) if package_dir else ()
        seen = 0
        for f in frames_of(frame, 64):
            if not oomguard_roles.is_user_file(f.f_code.co_filename, exclude):
                continue
            seen += 1
            if seen > limit:
                break
            lines = {}
            for ins in _instructions(f.f_code):
                if ins[3] is not None:
                    lines.setdefault(ins[3], []).append(ins)
            local = None
            for line in sorted(lines):
                ops = lines[line]
                stores = [i[2] for i in ops if i[1] in _NAME_STORES and i[2]]
                reads = [i[2] for i in ops if i[1] in _LOADS and i[2]]
                if not stores or not any(t in reads for t in stores):
                    continue
                if not any(i[1] in _ADD_OPS or (i[1] == "BINARY_OP" and i[4] in ("+", "+=")) or
                           (i[1] in _LOADS and i[2] in _ADD_CALLS) for i in ops):
                    continue
                if local is None:
                    local = dict(oomguard_roles._frame_locals(f))
                    if _in_module(f, local) and not _calls_backward(lines):
                        break
                for t in stores:
                    if t not in reads or graph_alive(local.get(t, f.f_globals.get(t))) is not True:
                        continue
                    for o in reads:
                        if o != t and graph_alive(local.get(o, f.f_globals.get(o))) is True:
                            return (f.f_code.co_filename, int(line), f.f_code.co_name, t, o)
                    # an attribute of a name the statement reads (total += out.loss / n): a model output's loss
                    for a, b in zip(ops, ops[1:]):
                        if a[1] in _LOCAL_LOADS and a[2] and a[2] != t and b[1] == "LOAD_ATTR" and b[2] and \
                                graph_alive(_plain_attr(local.get(a[2]), b[2])) is True:
                            return (f.f_code.co_filename, int(line), f.f_code.co_name, t, "%s.%s" % (a[2], b[2]))
            got = _kept_in_list(f, lines, local)
            if got is not None:
                return got
    except Exception:
        pass
    return None


def _plain_attr(obj, name):
    """obj's attribute `name` when it is stored on the object (its __dict__, or an item of a dict-like output such
    as a Hugging Face ModelOutput), without calling a property or __getattr__; None otherwise.  Never raises."""
    try:
        if obj is None:
            return None
        d = getattr(obj, "__dict__", None)
        if isinstance(d, dict) and name in d:
            return d[name]
        if isinstance(obj, dict):
            return dict.get(obj, name)
    except Exception:
        pass
    return None


_LIST_ADDS = frozenset(("append", "extend", "insert"))


def _calls_backward(lines):
    """The code of these lines (a frame's, by line) loads the name `backward`: it runs a backward itself."""
    return any(i[2] == "backward" and i[1] in _LOADS for ops in lines.values() for i in ops)


def _kept_in_list(f, lines, local):
    """(file, line, function, L, None) when frame f's code appends to a list L that, at the failure, holds
    at least two tensors whose graphs are alive, and the code calls backward itself; else None."""
    if not _calls_backward(lines):
        return None
    for line in sorted(lines):
        ops = lines[line]
        for a, b in zip(ops, ops[1:]):
            if not (a[1] in _LOCAL_LOADS and a[2] and b[1] in ("LOAD_ATTR", "LOAD_METHOD") and b[2] in _LIST_ADDS):
                continue
            name = a[2]
            if local is None:
                local = dict(oomguard_roles_frame_locals(f))
            v = local.get(name)
            if type(v) is not list:
                continue
            alive = 0
            for t in v[-16:]:
                if graph_alive(t) is True:
                    alive += 1
            if alive >= 2:
                return (f.f_code.co_filename, int(line), f.f_code.co_name, name, None)
    return None


def oomguard_roles_frame_locals(f):
    import oomguard_roles
    return oomguard_roles._frame_locals(f)


def _where(f):
    if f is None:
        return None
    if isinstance(f, _StmtFrame):
        return f.where
    return (f.f_code.co_filename, int(f.f_lineno or 0), f.f_code.co_name)


class _StmtFrame(object):
    """The failing statement's frame as statement() tells it, when it decided the phase: the
    program's own line, its own site."""
    f_back = None
    f_globals = {}

    def __init__(self, stmt):
        self.where = (stmt[0], stmt[1], stmt[2])


def _eval_mode(frames):
    """Every module whose forward is on the stack (a frame named forward whose `self` has a bool
    `training`) is in eval mode, and there is one: the outermost model decides too, so a frozen
    submodule in eval mode inside a training model's forward is not an evaluation.  The frames' locals
    are read without leaving them behind (oomguard_roles._frame_locals).  Never raises."""
    try:
        from oomguard_roles import _frame_locals
        n = 0
        for f in frames:
            code = f.f_code
            if code.co_name != "forward" or not code.co_argcount or code.co_varnames[0] != "self":
                continue
            t = getattr(dict(_frame_locals(f)).get("self"), "training", None)
            if not isinstance(t, bool):
                continue
            if t:
                return False
            n += 1
        return n > 0
    except Exception:
        return False


def oomguard_roles_purpose(name):
    import oomguard_roles
    return oomguard_roles.purpose_of((name,))


def _line(where):
    return "%s\t%d\t%s\n" % (str(where[0]).replace("\t", " ").replace("\n", " "), int(where[1]),
                             str(where[2]).replace("\t", " ").replace("\n", " "))


def encode(phase, where, source, site_where=None):
    """(phase, phase_frame, phase_source) as the shim takes them: strings or None.  phase_frame is
    the frame that decided, then, on a second line, the program's own line (event.phase_site; a
    shim that reads one line keeps the first)."""
    frame = None
    if where:
        frame = _line(where) + (_line(site_where) if site_where else "")
    return phase, frame, source
