"""cpt_long.py -- two-phase continued pretraining of TinyLlama-1.1B (intermediate-step-1431k-3T: 1.1B parameters,
22 layers, d=2048, untied 32,000-token embeddings) on a lab workstation's NVIDIA RTX A5000 (24 GB, 24564 MiB):

  phase 1: the domain corpus at 2,048 tokens (micro-batch 4 x 2,048, ACCUM 32: 262k tokens a step);
  phase 2: long context, 8,192 tokens with RoPE base 10k -> 500k (micro-batch 1 x 8,192, same tokens a step),
           with a fresh AdamW and a new warmup, as the long-context recipe the team follows re-initialises it.

Full fine-tuning in float32 with bf16 autocast, gradient checkpointing, SDPA.  The script keeps the objects
it checkpoints in one dict, built once at the start; save_checkpoint(app_state) writes their state_dicts every
500 steps (torch.distributed.checkpoint style):

    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 1000, PHASE1_STEPS)
    app_state = {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}
    train(PHASE1_STEPS, seqlen=2048, micro_batch=4)

    model.config.rope_theta = 500_000.0                              # phase 2: long context
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 200, PHASE2_STEPS)
    train(PHASE2_STEPS, seqlen=8192, micro_batch=1)

Phase 1 ran for two days with a 20.8 GiB peak: weights 4.1 GiB, their gradients 4.1 GiB, AdamW's two moments
8.2 GiB, and checkpointed activations.  Phase 2's 32 micro-batches go through; its first optimizer.step() dies
while AdamW makes its moments: 7.1 of the 8.2 GiB are made when the card is full.  The team's first reading:
8,192 tokens are too long for 24 GB.

Expert reading: the activations are gone at the step, and phase 2 at 8,192 x 1 holds the same tokens as phase 1
at 2,048 x 4; what is new is a second optimizer.  `optimizer = ...` rebinds the name, but app_state still
holds the phase-1 AdamW and its scheduler, so its exp_avg and exp_avg_sq for all 1.1B parameters (8.2 GiB)
stay on the card beside the new one's.  First: let go of the old optimizer -- update app_state (and anything
else that holds it) with the new optimizer and scheduler, or del them, before phase 2; phase 2 then runs at
phase 1's 20.8 GiB.  Its checkpoints would otherwise have saved the stale phase-1 optimizer.
Wrong advice: shorter sequences (8,192 is the point of phase 2, and the tokens per micro-batch did not change),
a smaller batch or gradient checkpointing (the activations are freed by the step; checkpointing is on), an
8-bit or paged AdamW (would shrink both states and keep checkpointing the wrong one), ZeRO / CPU offload (one
GPU; the new state fits once the old one is gone), LoRA or quantization (full continued pretraining),
expandable_segments / empty_cache (the allocator released its free segments and retried: 8 GiB of live,
unused optimizer state is not a cache), inference_mode, a bigger GPU.
"""
import math
import os
import sys
import types

import torch
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps, compiled as torch's own code: int64, Tensor.float, torch.utils.checkpoint.checkpoint,
# torch.optim.lr_scheduler.LambdaLR, and the autograd engine's order of work (it frees what each node saved as
# it goes and makes a layer's weight gradients when that layer's node runs).
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
_GAPS = """
def float(self):
    out = torch.empty(self.nbytes // torch._ITEMSIZE[self.dtype], dtype=torch.float32, device=self.device)
    out._saved = getattr(self._root(), "_saved", None)
    return torch._derive(out, self)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
torch.Tensor.float = _ns["float"]

_CKPT = """
def checkpoint(function, *args, use_reentrant=None, **kwargs):
    # non-reentrant checkpoint: the forward runs without keeping its activations; the input is saved and the
    # layer's weights get their gradients when backward recomputes it
    with torch.no_grad():
        out = function(*args, **kwargs)
    out._saved = args[0]
    module = getattr(function, "__self__", None)
    out._module = module
    weights = [p for p in module.parameters() if p.requires_grad] if module is not None else []
    return torch._derive(out, *([a for a in args if isinstance(a, torch.Tensor)] + weights))
"""
_ckpt_mod = types.ModuleType("torch.utils.checkpoint")
_ckpt_mod.__file__ = os.path.join(os.path.dirname(torch.__file__), "utils", "checkpoint.py")
_ckpt_mod.torch = torch
exec(compile(_CKPT, _ckpt_mod.__file__, "exec"), _ckpt_mod.__dict__)
_utils = sys.modules.get("torch.utils") or types.ModuleType("torch.utils")
_utils.checkpoint = _ckpt_mod
torch.utils = _utils
sys.modules["torch.utils"] = _utils
sys.modules["torch.utils.checkpoint"] = _ckpt_mod

_SCHED = """
class LambdaLR(object):
    def __init__(self, optimizer, lr_lambda, last_epoch=-1):
        self.optimizer = optimizer
        self.lr_lambdas = [lr_lambda]
        self.base_lrs = [g["lr"] for g in optimizer.param_groups]
        self.last_epoch = 0

    def step(self):
        self.last_epoch += 1
        for g, base in zip(self.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * self.lr_lambdas[0](self.last_epoch)

    def state_dict(self):
        return {"last_epoch": self.last_epoch, "base_lrs": self.base_lrs}
"""
_sched_mod = types.ModuleType("torch.optim.lr_scheduler")
_sched_mod.__file__ = os.path.join(os.path.dirname(torch.__file__), "optim", "lr_scheduler.py")
exec(compile(_SCHED, _sched_mod.__file__, "exec"), _sched_mod.__dict__)
torch.optim.lr_scheduler = _sched_mod
sys.modules["torch.optim.lr_scheduler"] = _sched_mod

_ENGINE = """
def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for i, r in enumerate(roots):
        if not r.requires_grad and r.grad_fn is None:
            raise RuntimeError("element %d of tensors does not require grad and does not have a grad_fn" % i)
    params = []
    for r in roots:
        for p in r._params:
            if all(p is not q for q in params):
                params.append(p)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_run_graph, (roots, params, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]


def _accumulate(p):
    if p.requires_grad and p.grad is None:
        p.grad = torch.empty_like(p)


def _run_graph(roots, params, box, done):
    _engine._tls.engine = True
    try:
        order, seen, todo = [], set(), list(roots)
        while todo:
            t = todo.pop()
            if not isinstance(t, torch.Tensor) or id(t) in seen:
                continue
            seen.add(id(t))
            order.append(t)
            v = t.__dict__.get("_saved")
            todo.extend(v if isinstance(v, (tuple, list)) else [v])
        del todo, roots
        order.reverse()
        grad_out = None
        while order:
            t = order.pop()
            g = torch.empty(t.nbytes, device=t.device)
            m = t.__dict__.get("_module")
            if m is not None:
                for p in m.parameters():
                    _accumulate(p)
            t.__dict__["_saved"] = None
            del t
            grad_out = g
        del grad_out
        for p in params:
            _accumulate(p)
    except BaseException as e:
        box["error"] = e
    finally:
        done.release()
"""
import _thread
from torch.autograd import _engine as _eng_mod
_ns_e = {"torch": torch, "_thread": _thread, "_engine": _eng_mod}
exec(compile(_ENGINE, _eng_mod.__file__, "exec"), _ns_e)
torch.autograd.backward = _ns_e["backward"]
# ----

GiB = 1 << 30


def get_cosine_schedule_with_warmup(optimizer, num_warmup_steps, num_training_steps):
    """transformers.get_cosine_schedule_with_warmup."""

    def lr_lambda(current_step):
        if current_step < num_warmup_steps:
            return float(current_step) / float(max(1, num_warmup_steps))
        progress = float(current_step - num_warmup_steps) / float(max(1, num_training_steps - num_warmup_steps))
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)


class LlamaConfig(object):      # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T's config.json
    vocab_size = 32000
    hidden_size = 2048
    intermediate_size = 5632
    num_hidden_layers = 22
    num_attention_heads = 32
    num_key_value_heads = 4
    rope_theta = 10000.0
    tie_word_embeddings = False


def _p(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.out_features = o
        self.weight = _p(i * o)

    def forward(self, x, tokens):
        out = torch.empty(tokens * self.out_features, dtype=torch.bfloat16, device="cuda")
        out._saved = x
        out._module = self
        return out


class LlamaRMSNorm(torch.nn.Module):
    def __init__(self, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(d)
        self.d = d

    def forward(self, x, tokens):
        out = torch.empty(tokens * self.d, dtype=torch.float32, device="cuda")
        out._saved = x
        out._module = self
        return out


class Embedding(torch.nn.Module):
    def __init__(self, n, d):
        torch.nn.Module.__init__(self)
        self.weight = _p(n * d)
        self.d = d

    def forward(self, ids, tokens):
        out = torch.empty(tokens * self.d, dtype=torch.float32, device="cuda")
        out._module = self
        return out


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        h, ff = c.hidden_size, c.intermediate_size
        kv = h // c.num_attention_heads * c.num_key_value_heads
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = Linear(h, h), Linear(h, kv), Linear(h, kv), Linear(h, h)
        self.gate_proj, self.up_proj, self.down_proj = Linear(h, ff), Linear(h, ff), Linear(ff, h)
        self.input_layernorm = LlamaRMSNorm(h)
        self.post_attention_layernorm = LlamaRMSNorm(h)
        self.h = h

    def forward(self, x, tokens):
        # under checkpoint: the temporaries come and go
        n = self.input_layernorm(x, tokens)
        q, k, v = self.q_proj(n, tokens), self.k_proj(n, tokens), self.v_proj(n, tokens)
        a = self.o_proj(torch.empty(tokens * self.h, dtype=torch.bfloat16, device="cuda"), tokens)
        del n, q, k, v
        hid = torch.empty(tokens * self.h, dtype=torch.float32, device="cuda")
        del a
        n = self.post_attention_layernorm(hid, tokens)
        g, u = self.gate_proj(n, tokens), self.up_proj(n, tokens)
        m = self.down_proj(torch.empty(g.nbytes // 2, dtype=torch.bfloat16, device="cuda"), tokens)
        del g, u, n
        out = torch.empty(tokens * self.h, dtype=torch.float32, device="cuda")
        del hid, m
        return out


class LlamaModel(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(c.vocab_size, c.hidden_size)
        self.layers = []
        for i in range(c.num_hidden_layers):
            layer = LlamaDecoderLayer(c)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = LlamaRMSNorm(c.hidden_size)
        self.gradient_checkpointing = False

    def forward(self, input_ids, tokens):
        hidden_states = self.embed_tokens(input_ids, tokens)
        for decoder_layer in self.layers:
            if self.gradient_checkpointing and self.training:
                hidden_states = torch.utils.checkpoint.checkpoint(decoder_layer.__call__, hidden_states, tokens,
                                                                  use_reentrant=False)
            else:
                hidden_states = decoder_layer(hidden_states, tokens)
        return self.norm(hidden_states, tokens)


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, c):
        torch.nn.Module.__init__(self)
        self.config = c
        self.model = LlamaModel(c)
        self.lm_head = Linear(c.hidden_size, c.vocab_size)

    def gradient_checkpointing_enable(self):
        self.model.gradient_checkpointing = True

    def forward(self, input_ids, labels):
        tokens = input_ids.tokens
        hidden_states = self.model(input_ids, tokens)
        logits = self.lm_head(hidden_states, tokens).float()
        return F.cross_entropy(logits, labels)


def token_batch(rows, seqlen):
    ids = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    ids.tokens = rows * seqlen
    labels = torch.empty(rows * seqlen, dtype=torch.int64, device="cuda")
    return ids, labels


def save_checkpoint(state, path):
    """torch.distributed.checkpoint.save of each entry's state_dict (written from host copies)."""
    sd = {k: v.state_dict() for k, v in state.items()}
    print("checkpoint %s: %s" % (path, ", ".join(sorted(sd))))


ACCUM = 32
PHASE1_STEPS = 20000
PHASE2_STEPS = 2000
SAVE_EVERY = 500


def train(num_steps, seqlen, micro_batch, phase):
    global global_step
    for step in range(num_steps):
        for micro in range(ACCUM):
            ids, labels = token_batch(micro_batch, seqlen)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(ids, labels)
            loss.backward()
            del loss, ids, labels
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
        global_step += 1
        if global_step % SAVE_EVERY == 0:
            save_checkpoint(app_state, "ckpt/step_%d" % global_step)
        if step % 500 == 0:
            print("phase %d step %d: %.1f GiB allocated, peak %.1f GiB"
                  % (phase, step, torch.cuda.memory_allocated() / GiB, torch.cuda.max_memory_allocated() / GiB))


global_step = 0
model = LlamaForCausalLM(LlamaConfig())        # from_pretrained(..., torch_dtype=torch.float32).cuda()
model.gradient_checkpointing_enable()
model.train()

try:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 1000, PHASE1_STEPS)
    app_state = {"model": model, "optimizer": optimizer, "lr_scheduler": scheduler}
    train(2, seqlen=2048, micro_batch=4, phase=1)       # the simulation runs 2 of phase 1's 20,000 steps
    global_step = PHASE1_STEPS
    save_checkpoint(app_state, "ckpt/phase1_final")

    model.config.rope_theta = 500_000.0                 # phase 2: long context, a fresh optimizer
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = get_cosine_schedule_with_warmup(optimizer, 200, PHASE2_STEPS)
    train(PHASE2_STEPS, seqlen=8192, micro_batch=1, phase=2)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
