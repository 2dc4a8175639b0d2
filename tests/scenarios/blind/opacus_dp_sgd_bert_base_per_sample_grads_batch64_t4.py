"""dp_finetune.py -- a health-insurance analytics team fine-tunes bert-base-uncased to route members' free-text
claim notes into 14 queues, with differential privacy (DP-SGD, Opacus 1.4) because the notes are personal
data.  It runs on a single Tesla T4 (16 GB, 15 GiB usable), in fp32 (Opacus' default path).  Following
Opacus' BERT tutorial the word/position embeddings are frozen; the 12 encoder layers, pooler and
classifier train (85.6M parameters).  DP needs large batches for a good privacy/utility trade-off, so:

    model, optimizer, train_loader = privacy_engine.make_private(
        module=model, optimizer=optimizer, data_loader=train_loader,        # batch_size=64, max_len=128
        noise_multiplier=0.8, max_grad_norm=1.0)
    for batch in train_loader:
        loss = model(**batch).loss
        loss.backward()                       # Opacus' hooks compute a gradient PER SAMPLE here
        optimizer.step(); optimizer.zero_grad()

Opacus clips each example's gradient, so during backward its hooks materialise `p.grad_sample` for every
trainable parameter: batch x parameters x 4 bytes = 64 x 85.6M x 4 = 21.9 GB -- on top of the 6 GiB of
activations of a 64 x 128-token batch.  The forward pass fits; the first backward fails in the per-sample
gradients of the fifth encoder layer from the top, each layer adding 1.7 GiB.

An expert: the per-sample gradients scale with (physical batch) x (trainable parameters), not with the
activations.  Keep the logical batch of 64 for the privacy accounting but process it in physical chunks
with Opacus' BatchMemoryManager(max_physical_batch_size=8..16) -- a smaller batch with accumulation, which
DP-SGD does through virtual steps -- or switch to ghost clipping (Opacus >= 1.5, grad_sample_mode="ghost"),
which clips without materialising per-sample gradients; training fewer parameters (LoRA, or freezing the
lower layers) shrinks them too.  Wrong first advice: gradient checkpointing (the per-sample gradients are
not activations, and Opacus' hooks do not support it well), mixed precision, an 8-bit optimizer (AdamW's
state is 0.7 GB), expandable_segments / empty_cache, shorter sequences (per-sample gradients do not depend
on the length).
(Opacus and the module hooks PyTorch calls it through -- register_forward_hook, register_full_backward_hook,
called by the autograd engine during backward -- are written below with their real shapes; the stand-in
torch lacks them.)
"""
import os
import sys
import sysconfig

import torch
import scen_truth

scen_truth.note_every_empty(torch)

# ---------------------------------------------------------------- what the stand-in torch lacks: module hooks
_MODULE_SRC = '''
def register_forward_hook(self, hook):
    hooks = self.__dict__.setdefault("_forward_hooks", {})
    hooks[len(hooks)] = hook
    return hook

def register_full_backward_hook(self, hook):
    hooks = self.__dict__.setdefault("_backward_hooks", {})
    hooks[len(hooks)] = hook
    for p in self._parameters.values():
        if p is not None:
            p._backward_modules = getattr(p, "_backward_modules", ()) + (self,)
    return hook

def _call_impl(self, *args, **kwargs):
    _graph.begin_forward()
    out = None
    try:
        out = self.forward(*args, **kwargs)
    finally:
        _graph.end_forward(self, args, kwargs, out)
    for hook in list(self.__dict__.get("_forward_hooks", {}).values()):
        res = hook(self, args, out)
        if res is not None:
            out = res
    return out
'''

_ENGINE_SRC = '''
def run(params, box, done):
    """The engine thread: walking the graph from the loss, each module's full backward hooks run when its
    gradients are ready (the last module of the forward first), then AccumulateGrad makes .grad."""
    _tls.engine = True
    try:
        modules = []
        for p in params:
            for m in getattr(p, "_backward_modules", ()):
                if all(m is not x for x in modules):
                    modules.append(m)
        modules.sort(key=lambda m: m.__dict__.get("_forward_order", 0))
        for m in reversed(modules):
            for hook in list(m.__dict__.get("_backward_hooks", {}).values()):
                hook(m, (None,), (None,))
            for p in m._parameters.values():
                if p is not None and p.requires_grad and p.grad is None:
                    p.grad = torch.empty_like(p)
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
'''


def _install_module_hooks():
    from torch.nn.modules import module as _module
    from torch.autograd import _engine
    exec(compile(_MODULE_SRC, _module.__file__, "exec"), _module.__dict__)
    for name in ("register_forward_hook", "register_full_backward_hook", "_call_impl"):
        setattr(_module.Module, name, _module.__dict__[name])
    exec(compile(_ENGINE_SRC, _engine.__file__, "exec"), _engine.__dict__)


_install_module_hooks()

# ---------------------------------------------------------------- Opacus 1.4, as far as this script uses it
_OPACUS_SRC = '''
import torch

class GradSampleModule(torch.nn.Module):
    """opacus.GradSampleModule: a forward hook keeps each trainable layer's input (module.activations), a
    full backward hook turns it and the incoming gradient into one gradient per example (p.grad_sample)."""

    def __init__(self, m, batch_first=True, loss_reduction="mean"):
        torch.nn.Module.__init__(self)
        self._module = m
        self._order = [0]
        for sub in m.modules():
            if any(p.requires_grad for p in sub._parameters.values() if p is not None):
                sub.register_forward_hook(self.capture_activations_hook)
                sub.register_full_backward_hook(self.capture_backprops_hook)

    def forward(self, *args, **kwargs):
        self._order[0] = 0
        return self._module(*args, **kwargs)

    def capture_activations_hook(self, module, forward_input, forward_output):
        self._order[0] += 1
        module.__dict__["_forward_order"] = self._order[0]
        module.__dict__.setdefault("activations", []).append(forward_input[0] if forward_input else None)

    def capture_backprops_hook(self, module, _forward_input, forward_output):
        activations = module.__dict__["activations"].pop()
        n = module.__dict__.get("batch_size_hint", 1)
        for p in module._parameters.values():
            if p is not None and p.requires_grad:
                # GRAD_SAMPLERS[type(module)](module, activations, backprops):
                # einsum("n...i,n...j->nij", backprops, activations) -> one gradient per example, [n, *p.shape]
                p.grad_sample = torch.empty(n * p.nbytes, device=p.device)


class DPOptimizer(object):
    def __init__(self, optimizer, noise_multiplier, max_grad_norm, expected_batch_size):
        self.original_optimizer = optimizer
        self.noise_multiplier, self.max_grad_norm = noise_multiplier, max_grad_norm
        self.expected_batch_size = expected_batch_size

    def step(self, closure=None):
        # clip_and_accumulate(): per-sample norms, clip factors, summed_grad; add_noise(); scale_grad()
        return self.original_optimizer.step(closure)

    def zero_grad(self, set_to_none=False):
        for g in self.original_optimizer.param_groups:
            for p in g["params"]:
                p.grad_sample = None
        self.original_optimizer.zero_grad(set_to_none)


class PrivacyEngine(object):
    def __init__(self, accountant="prv", secure_mode=False):
        self.accountant = accountant

    def make_private(self, module, optimizer, data_loader, noise_multiplier, max_grad_norm, poisson_sampling=True):
        gsm = GradSampleModule(module)
        for sub in module.modules():
            sub.__dict__["batch_size_hint"] = data_loader.batch_size
        dp_opt = DPOptimizer(optimizer, noise_multiplier, max_grad_norm, data_loader.batch_size)
        return gsm, dp_opt, data_loader
'''


def _install_opacus():
    import types
    path = os.path.join(sysconfig.get_paths()["purelib"], "opacus", "grad_sample", "grad_sample_module.py")
    mod = types.ModuleType("opacus")
    mod.__file__ = path
    exec(compile(_OPACUS_SRC, path, "exec"), mod.__dict__)
    sys.modules["opacus"] = mod
    return mod


opacus = _install_opacus()
PrivacyEngine = opacus.PrivacyEngine

# ------------------------------------------------------------------------------------------------ the script
HIDDEN, FFN, LAYERS, HEADS, VOCAB, NUM_LABELS = 768, 3072, 12, 12, 30522, 14


def act(nbytes, prev):
    """a layer's output; with autograd on it keeps what it was made from for backward"""
    t = torch.empty(nbytes, device="cuda")
    t._saved = prev if torch.is_grad_enabled() else None
    return t


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(d_in * d_out * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(d_out * 4, device="cuda"))
        self.d_out = d_out

    def forward(self, x, tokens):
        return act(tokens * self.d_out * 4, x)


class LayerNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(d * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(d * 4, device="cuda"))
        self.d = d

    def forward(self, x, tokens):
        return act(tokens * self.d * 4, x)


class BertLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query, self.key, self.value = Linear(HIDDEN, HIDDEN), Linear(HIDDEN, HIDDEN), Linear(HIDDEN, HIDDEN)
        self.attention_output = Linear(HIDDEN, HIDDEN)
        self.attention_norm = LayerNorm(HIDDEN)
        self.intermediate = Linear(HIDDEN, FFN)
        self.output = Linear(FFN, HIDDEN)
        self.output_norm = LayerNorm(HIDDEN)

    def forward(self, x, batch, seq):
        t = batch * seq
        q = self.query(x, t)
        k = self.key(q, t)
        v = self.value(k, t)
        scores = act(batch * HEADS * seq * seq * 4, v)
        probs = act(batch * HEADS * seq * seq * 4, scores)
        drop = act(batch * HEADS * seq * seq, probs)                 # dropout mask
        ctx = act(t * HIDDEN * 4, drop)
        h = self.attention_output(ctx, t)
        h = self.attention_norm(act(t * HIDDEN, h), t)               # dropout mask, residual + norm
        i = self.intermediate(h, t)
        g = act(t * FFN * 4, i)                                      # GELU
        o = self.output(g, t)
        return self.output_norm(act(t * HIDDEN, o), t)


class BertForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN * 4, device="cuda"))
        self.position_embeddings = torch.nn.Parameter(torch.empty(512 * HIDDEN * 4, device="cuda"))
        self.embeddings_norm = LayerNorm(HIDDEN)
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, BertLayer())
        self.pooler = Linear(HIDDEN, HIDDEN)
        self.classifier = Linear(HIDDEN, NUM_LABELS)

    def forward(self, input_ids, attention_mask, labels, batch, seq):
        t = batch * seq
        x = self.embeddings_norm(act(t * HIDDEN * 4, input_ids), t)
        for i in range(LAYERS):
            x = getattr(self, "layer_%d" % i)(x, batch, seq)
        pooled = self.pooler(x, batch)
        logits = self.classifier(pooled, batch)
        return torch.nn.functional.cross_entropy(logits, labels)


class ClaimNotesLoader(object):
    """the tokenized claim notes: batches of input_ids / attention_mask / labels, max_length=128"""

    def __init__(self, batch_size, max_length):
        self.batch_size, self.max_length = batch_size, max_length

    def __iter__(self):
        for _ in range(2400):
            ids = torch.empty(self.batch_size * self.max_length * 8, device="cuda")
            mask = torch.empty(self.batch_size * self.max_length * 8, device="cuda")
            labels = torch.empty(self.batch_size * 8, device="cuda")
            yield ids, mask, labels


def main():
    model = BertForSequenceClassification().cuda()
    model.word_embeddings.requires_grad_(False)
    model.position_embeddings.requires_grad_(False)
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)
    train_loader = ClaimNotesLoader(batch_size=64, max_length=128)

    privacy_engine = PrivacyEngine()
    model, optimizer, train_loader = privacy_engine.make_private(
        module=model, optimizer=optimizer, data_loader=train_loader,
        noise_multiplier=0.8, max_grad_norm=1.0)

    for step, (input_ids, attention_mask, labels) in enumerate(train_loader):
        loss = model(input_ids, attention_mask, labels, train_loader.batch_size, train_loader.max_length)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print("step", step, flush=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
