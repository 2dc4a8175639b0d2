"""Online logit distillation, mixed JAX + PyTorch in one process, on a 4x RTX A6000 (48 GB) workstation.

The real script (kd_train.py) a research engineer wrote:

    import jax, jax.numpy as jnp, flax, optax, numpy as np
    import torch, torch.nn.functional as F
    from transformers import AutoModelForCausalLM
    from easylm_student import FlaxLlamaForCausalLM      # a 1.1B Llama-architecture student in Flax

    STUDENT_DEVICES = jax.devices()[:3]        # "GPUs 0-2 for JAX ..."
    TEACHER_DEVICE = "cuda:3"                  # "... and GPU 3 is the teacher's"

    state = create_train_state(jax.random.PRNGKey(0))            # first jnp op: the XLA GPU client starts
    state = flax.jax_utils.replicate(state, devices=STUDENT_DEVICES)
    p_train_step = jax.pmap(train_step, axis_name="batch", devices=STUDENT_DEVICES, donate_argnums=(0,))

    teacher = AutoModelForCausalLM.from_pretrained("meta-llama/Llama-3.2-3B", torch_dtype=torch.bfloat16,
                                                   attn_implementation="sdpa").to(TEACHER_DEVICE).eval()
    teacher.requires_grad_(False)

    for step, batch in enumerate(loader):                      # 3 x 4 sequences of 1024 tokens
        ids = torch.from_numpy(batch["input_ids"]).to(TEACHER_DEVICE)
        with torch.no_grad():
            logits = teacher(ids).logits                        # [12, 1024, 128256] bf16
            logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
            top_lp, top_ix = logp.topk(64, dim=-1)              # top-64 teacher log-probs for the KD loss
        state, metrics = p_train_step(state, shard(batch), shard(top_lp.cpu().numpy()), shard(top_ix...))

What happens.  The user split the box by hand: the student's pmap runs on jax.devices()[:3] and the
PyTorch teacher is moved to cuda:3.  But the XLA GPU client does not know about that split: at its first
operation it creates a client for EVERY visible GPU and, with the default XLA_PYTHON_CLIENT_PREALLOCATE=true
and XLA_PYTHON_CLIENT_MEM_FRACTION=0.75, preallocates 75% of each card's total memory for its BFC arena --
GPU 3 included, although no JAX computation ever runs there.  The teacher then shares GPU 3 with an idle
36 GiB XLA arena.

The arithmetic (MiB; nvidia-smi says 49140 MiB per A6000):
  XLA arena on each of GPUs 0-3:   0.75 x 49140 = 36854 MiB (about 36.0 GiB), one cuMemAlloc each
  CUDA context on GPU 3:           ~512 MiB (shared by XLA and PyTorch: both use the primary context)
  left on GPU 3 for PyTorch:       49140 - 512 - 36854 = 11774 MiB (about 11.5 GiB)
  teacher Llama-3.2-3B in bf16:    3.21 B parameters (28 layers, hidden 3072, MLP 8192, 8 KV heads,
                                   tied 128256 x 3072 embedding) = 6.43 GB, about 6130 MiB -- loads fine
  teacher forward, no_grad:        hidden states of 12 x 1024 x 3072 bf16 = 72 MiB, MLP 192 MiB, transient
  logits [12, 1024, 128256] bf16:  3006 MiB -- still fits (about 2.5 GiB left, with PyTorch's cache)
  log_softmax in float32:          6012 MiB -> torch.cuda.OutOfMemoryError on the first step:
                                   "Tried to allocate 5.87 GiB. GPU 3 ... of which ~2.5 GiB is free ...
                                    this process has ~45.5 GiB in use. Of the allocated memory 8.9 GiB is
                                    allocated by PyTorch" -- 36 GiB of it is not PyTorch's.
  The whole teacher side needs about 15.5 GiB; GPU 3 alone has 47.5 GiB after its context.  With the card
  to itself the teacher fits three times over.

What an expert says first: the 36 GiB of "non-PyTorch memory" on GPU 3 is JAX's preallocated arena, and
JAX never computes on GPU 3.  Keep JAX off the teacher's card before the first JAX op --
jax.config.update("jax_cuda_visible_devices", "0,1,2") (JAX then makes clients, and arenas, only for GPUs
0-2; the student keeps its preallocation there) -- or, less precisely, XLA_PYTHON_CLIENT_PREALLOCATE=false
or a smaller XLA_PYTHON_CLIENT_MEM_FRACTION.  Nothing about the teacher needs to change.

Wrong advice: a smaller distillation batch or shorter sequences (the step would fit in 11.5 GiB, but for
memory that nobody uses), quantizing the teacher (changes the KD targets), chunking the log_softmax (a
workaround around 36 GiB of idle memory), a bigger GPU, CPU offload, expandable_segments or empty_cache
(no fragmentation; PyTorch caches only a few hundred MiB and already released it in its retry),
inference_mode (the teacher already runs under no_grad), mixed precision (already bf16), gradient
checkpointing (no backward on the teacher), CUDA_VISIBLE_DEVICES=0,1,2 for the process (would hide GPU 3
from PyTorch too), or hunting for other processes (there are none: the memory is this process's).

The JAX side is the scenario kit's xla_extension.so (tests/scenarios/kit/xla.c), loaded as jaxlib loads
its extension and driven the way jax's backend initialisation drives it: one client per visible GPU.
"""
import ctypes
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)

# ----------------------------------------------------------------------------------------------------------
# jax / jaxlib, as far as this script touches them


def _find_xla_extension():
    """jaxlib/xla_extension.so: the scenario kit's stand-in, next to the other stand-in libraries."""
    here = os.path.dirname(os.path.abspath(__file__))
    cands = []
    c10 = os.environ.get("FAKE_TORCH_LIBC10")
    if c10:
        cands.append(os.path.join(os.path.dirname(os.path.abspath(c10)), "..", "scenarios", "lib",
                                  "xla_extension.so"))
    cands.append(os.path.join(here, "..", "..", "..", "build", "tests", "scenarios", "lib", "xla_extension.so"))
    for c in cands:
        if os.path.exists(c):
            return os.path.normpath(c)
    raise ImportError("jaxlib: xla_extension.so not found")


class GpuDevice(object):
    def __init__(self, client, idx):
        self.client, self.id = client, idx

    def __repr__(self):
        return "cuda(id=%d)" % self.id


class XlaGpuBackend(object):
    """jax._src.xla_bridge.backends(): at the first JAX operation, one GPU client over every visible CUDA
    device (jax_cuda_visible_devices defaults to "all"); each device's BFC allocator preallocates
    XLA_PYTHON_CLIENT_MEM_FRACTION (0.75) of that card unless XLA_PYTHON_CLIENT_PREALLOCATE=false."""
    _instance = None

    def __init__(self):
        self._lib = ctypes.CDLL(_find_xla_extension(), mode=ctypes.RTLD_GLOBAL)
        self._lib.xla_client_init.argtypes = [ctypes.c_int]
        visible = os.environ.get("JAX_CUDA_VISIBLE_DEVICES", "all")
        cuda = ctypes.CDLL("libcuda.so.1")
        count = ctypes.c_int(0)
        if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
            raise RuntimeError("Unable to initialize backend 'cuda'")
        n = count.value
        ids = list(range(n)) if visible == "all" else [int(x) for x in visible.split(",") if x.strip()]
        self.devices = []
        for d in ids:
            rc = self._lib.xla_client_init(d)
            if rc:
                raise RuntimeError("RESOURCE_EXHAUSTED: could not create the GPU client for device %d" % d)
            self.devices.append(GpuDevice(self, d))

    @classmethod
    def get(cls):
        if cls._instance is None:
            cls._instance = XlaGpuBackend()
        return cls._instance


def jax_devices():
    return list(XlaGpuBackend.get().devices)


# ----------------------------------------------------------------------------------------------------------
# the Flax student (its memory lives in the XLA arenas of GPUs 0-2; the stand-in computes nothing)

STUDENT_CONFIG = dict(vocab_size=128256, hidden_size=2048, num_hidden_layers=16, intermediate_size=8192)


class StudentTrainState(object):
    def __init__(self, step, params_bytes, opt_state_bytes, devices):
        self.step, self.params_bytes, self.opt_state_bytes, self.devices = step, params_bytes, opt_state_bytes, devices


def create_train_state(rng_seed):
    """model.init(rng, dummy) + optax.adamw: the first jnp op, so the GPU backend starts here."""
    devices = jax_devices()
    h, L, m, v = (STUDENT_CONFIG[k] for k in ("hidden_size", "num_hidden_layers", "intermediate_size",
                                               "vocab_size"))
    n_params = v * h + L * (4 * h * h + 3 * h * m)     # ~1.2 B
    return StudentTrainState(0, n_params * 4, n_params * 8, devices[:1])


def replicate(state, devices):
    """flax.jax_utils.replicate: the state copied into the arena of each device."""
    return StudentTrainState(state.step, state.params_bytes, state.opt_state_bytes, list(devices))


def pmap(fn, axis_name, devices, donate_argnums=()):
    def mapped(*args):
        return fn(*args)
    mapped.devices = list(devices)
    return mapped


def train_step(state, batch, teacher_top_logp, teacher_top_ix):
    """The KD step: student logits, cross-entropy against the teacher's top-64 log-probs, adamw."""
    return StudentTrainState(state.step + 1, state.params_bytes, state.opt_state_bytes, state.devices), {}


# ----------------------------------------------------------------------------------------------------------
# the PyTorch teacher: transformers' LlamaForCausalLM, laid out as modeling_llama.py lays it out

TEACHER_NAME = "meta-llama/Llama-3.2-3B"
TEACHER_CONFIG = dict(vocab_size=128256, hidden_size=3072, num_hidden_layers=28, intermediate_size=8192,
                      num_attention_heads=24, num_key_value_heads=8, tie_word_embeddings=True)


class Linear(nn.Module):
    """nn.Linear(in, out, bias=False) in bf16 on the device."""

    def __init__(self, in_features, out_features, dtype, device):
        nn.Module.__init__(self)
        self.in_features, self.out_features = in_features, out_features
        self.weight = nn.Parameter(torch.empty(out_features * in_features, dtype=dtype, device=device))

    def forward(self, x):
        tokens = x.nbytes // 2 // self.in_features
        w = self.weight
        return torch.empty(tokens * self.out_features, dtype=w.dtype, device=x.device)


class Embedding(nn.Module):
    def __init__(self, num, dim, dtype, device):
        nn.Module.__init__(self)
        self.num_embeddings, self.embedding_dim = num, dim
        self.weight = nn.Parameter(torch.empty(num * dim, dtype=dtype, device=device))

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8                  # int64 ids
        return torch.empty(tokens * self.embedding_dim, dtype=self.weight.dtype, device=input_ids.device)


class LlamaRMSNorm(nn.Module):
    def __init__(self, hidden, dtype, device):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(hidden, dtype=dtype, device=device))

    def forward(self, x):
        w = self.weight
        return torch.empty(x.nbytes // 2, dtype=w.dtype, device=x.device)


class LlamaAttention(nn.Module):
    def __init__(self, cfg, dtype, device):
        nn.Module.__init__(self)
        h = cfg["hidden_size"]
        kv = h // cfg["num_attention_heads"] * cfg["num_key_value_heads"]
        self.q_proj = Linear(h, h, dtype, device)
        self.k_proj = Linear(h, kv, dtype, device)
        self.v_proj = Linear(h, kv, dtype, device)
        self.o_proj = Linear(h, h, dtype, device)

    def forward(self, hidden_states):
        q = self.q_proj(hidden_states)
        k = self.k_proj(hidden_states)
        v = self.v_proj(hidden_states)
        # F.scaled_dot_product_attention (flash / mem-efficient kernel): output of q's size, no score matrix
        attn = torch.empty(q.nbytes // 2, dtype=q.dtype, device=q.device)
        del q, k, v
        return self.o_proj(attn)


class LlamaMLP(nn.Module):
    def __init__(self, cfg, dtype, device):
        nn.Module.__init__(self)
        h, m = cfg["hidden_size"], cfg["intermediate_size"]
        self.gate_proj = Linear(h, m, dtype, device)
        self.up_proj = Linear(h, m, dtype, device)
        self.down_proj = Linear(m, h, dtype, device)

    def forward(self, x):
        gate = self.gate_proj(x)
        up = self.up_proj(x)
        act = torch.empty(gate.nbytes // 2, dtype=gate.dtype, device=gate.device)   # act_fn(gate) * up
        del gate, up
        return self.down_proj(act)


class LlamaDecoderLayer(nn.Module):
    def __init__(self, cfg, dtype, device):
        nn.Module.__init__(self)
        self.input_layernorm = LlamaRMSNorm(cfg["hidden_size"], dtype, device)
        self.self_attn = LlamaAttention(cfg, dtype, device)
        self.post_attention_layernorm = LlamaRMSNorm(cfg["hidden_size"], dtype, device)
        self.mlp = LlamaMLP(cfg, dtype, device)

    def forward(self, hidden_states):
        residual = hidden_states
        h = self.self_attn(self.input_layernorm(hidden_states))
        hidden_states = torch.empty(residual.nbytes // 2, dtype=residual.dtype, device=residual.device)  # residual + h
        del h, residual
        residual = hidden_states
        h = self.mlp(self.post_attention_layernorm(hidden_states))
        out = torch.empty(residual.nbytes // 2, dtype=residual.dtype, device=residual.device)
        return out


class ModuleList(nn.Module):
    """nn.ModuleList: submodules registered as "0", "1", ..."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __len__(self):
        return len(self._modules)


class LlamaModel(nn.Module):
    def __init__(self, cfg, dtype, device):
        nn.Module.__init__(self)
        self.embed_tokens = Embedding(cfg["vocab_size"], cfg["hidden_size"], dtype, device)
        self.layers = ModuleList([LlamaDecoderLayer(cfg, dtype, device) for _ in range(cfg["num_hidden_layers"])])
        self.norm = LlamaRMSNorm(cfg["hidden_size"], dtype, device)

    def forward(self, input_ids):
        hidden_states = self.embed_tokens(input_ids)
        for layer in self.layers:
            hidden_states = layer(hidden_states)
        return self.norm(hidden_states)


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(nn.Module):
    def __init__(self, cfg, dtype, device):
        nn.Module.__init__(self)
        self.config = cfg
        self.model = LlamaModel(cfg, dtype, device)
        # tie_word_embeddings: lm_head.weight is embed_tokens.weight

    def forward(self, input_ids):
        hidden_states = self.model(input_ids)
        tokens = hidden_states.nbytes // 2 // self.config["hidden_size"]
        w = self.model.embed_tokens.weight
        logits = torch.empty(tokens * self.config["vocab_size"], dtype=w.dtype, device=hidden_states.device)
        return CausalLMOutput(logits)


def load_teacher(device):
    """AutoModelForCausalLM.from_pretrained(TEACHER_NAME, torch_dtype=torch.bfloat16).to(device).eval()"""
    teacher = LlamaForCausalLM(TEACHER_CONFIG, torch.bfloat16, device)
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad = False
    return teacher


# ----------------------------------------------------------------------------------------------------------
# the data and the loop

PER_DEVICE_BATCH = 4
SEQ_LEN = 1024
TOP_K = 64
TOTAL_STEPS = 20000


def fineweb_edu_loader(global_batch, seq_len):
    """Packed 1024-token sequences from the tokenized corpus (numpy int64 on the host)."""
    for _ in range(TOTAL_STEPS):
        yield {"input_ids_bytes": global_batch * seq_len * 8}


def teacher_targets(teacher, input_ids):
    """The teacher's top-k log-probabilities over the full vocabulary."""
    with torch.no_grad():
        logits = teacher(input_ids).logits
        logp = F.log_softmax(logits, dim=-1, dtype=torch.float32)
        top_lp = torch.empty(logp.nbytes // 4 // TEACHER_CONFIG["vocab_size"] * TOP_K * 4, device=logp.device)
        top_ix = torch.empty(logp.nbytes // 4 // TEACHER_CONFIG["vocab_size"] * TOP_K * 8, device=logp.device)
        del logits, logp
    return top_lp, top_ix


def main():
    student_devices = jax_devices()[:3]                  # GPUs 0-2 for the student ...
    teacher_device = "cuda:3"                            # ... GPU 3 for the teacher
    state = create_train_state(0)
    state = replicate(state, student_devices)
    p_train_step = pmap(train_step, axis_name="batch", devices=student_devices, donate_argnums=(0,))

    torch.cuda.set_device(teacher_device)
    teacher = load_teacher(teacher_device)
    print("teacher %s on %s: %.2f GiB" % (TEACHER_NAME, teacher_device,
                                          torch.cuda.memory_allocated(3) / 2.0 ** 30), flush=True)

    global_batch = PER_DEVICE_BATCH * len(student_devices)
    for step, batch in enumerate(fineweb_edu_loader(global_batch, SEQ_LEN)):
        ids = torch.empty(batch["input_ids_bytes"], device=teacher_device)   # from_numpy(...).to("cuda:3")
        top_lp, top_ix = teacher_targets(teacher, ids)
        # top_lp.cpu().numpy(), sharded over the three student devices
        state, metrics = p_train_step(state, batch, top_lp, top_ix)
        del ids, top_lp, top_ix
        if step % 100 == 0:
            print("step %d" % step, flush=True)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark(3)
        raise
