"""train_sft.py -- a two-person lab full-fine-tunes Qwen2.5-14B on Korean statute QA, on their own
workstation: 4x RTX 3090 (24 GB each), 256 GB of RAM, DeepSpeed 0.15, launched with

    deepspeed --num_gpus 4 train_sft.py --deepspeed ds_zero2_offload.json

They read that ZeRO-Offload "trains a 13B model on a single V100" and wrote the config from the ZeRO-Offload
tutorial: ZeRO stage 2, offload_optimizer to the CPU (pinned), bf16, micro-batch 1, gradient accumulation 16,
gradient checkpointing.  The model is loaded on the CPU in bf16 (29.5 GB per rank, 118 GB of the 256 GB
RAM), then handed to deepspeed.initialize:

    model = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-14B", torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=args.deepspeed)

deepspeed.initialize dies on every rank before a single batch is read: the engine moves the module to its
GPU (stage 1 and 2 keep a full copy of the 16-bit weights on every rank -- only the optimizer state, and in
stage 2 the gradients, are partitioned; offload_optimizer moves those partitions to the CPU), and 14.8B
bf16 weights are 27.5 GiB against the 3090's 23.2 GiB left after the CUDA context: the copy fails at
decoder layer 42 of 48.  The V100 claim held because 13B in fp16 (26 GB) fits a 32 GB card; 14.8B does not
fit a 24 GB one whatever happens to the optimizer.

An expert: the weights themselves must be partitioned: ZeRO stage 3 (each rank holds a quarter, 6.9 GiB,
gathered layer by layer), with offload_param to the CPU as well if the activations need the room, and the
model built under zero.Init (HfDeepSpeedConfig / the Trainer's deepspeed argument before from_pretrained)
so that no rank ever materializes it whole; or, if full fine-tuning is not a must, LoRA/QLoRA.  Wrong first
advice: a smaller batch, gradient checkpointing, mixed precision (nothing has run; it is already bf16), an
8-bit optimizer (the optimizer state is already on the CPU), loading in bf16 or map_location="cpu" (the
checkpoint is already on the CPU in bf16), expandable_segments / empty_cache (nothing is cached),
inference_mode.
"""
import ctypes
import json
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
BF16 = 2


# ---- the parts of transformers and deepspeed this script goes through (the simulator has neither): a
# model loaded with from_pretrained lives on the CPU until something moves it; DeepSpeedEngine moves it to
# the rank's GPU in _configure_distributed_model, as deepspeed/runtime/engine.py does for stages 0-2.
class _HostTensor(object):
    """A weight in host memory, as from_pretrained leaves it (no device memory)."""

    def __init__(self, numel, dtype):
        self.numel, self.dtype, self.is_cuda = numel, dtype, False


def _apply(module, fn):
    """torch.nn.Module._apply: the children first, in the order they were registered, then the module's own
    weights, each replaced by fn(weight)."""
    for child in module._modules.values():
        _apply(child, fn)
    for name, t in list(vars(module).items()):
        if isinstance(t, _HostTensor):
            setattr(module, name, torch.nn.Parameter(fn(t)))
    return module


class PreTrainedModel(torch.nn.Module):
    def _apply(self, fn):
        return _apply(self, fn)

    def to(self, device=None, dtype=None):
        def convert(t):
            return torch.empty(t.numel, dtype=dtype or t.dtype, device=device)
        return self._apply(convert)

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True


class Qwen2DecoderLayer(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.self_attn = _HostTensor(5120 * 5120 * 2 + 5120 * 1024 * 2 + 5120 + 1024 * 2, dtype)  # q,o + k,v (GQA)
        self.mlp = _HostTensor(3 * 5120 * 13824, dtype)
        self.norms = _HostTensor(2 * 5120, dtype)


class Embedding(torch.nn.Module):
    def __init__(self, num, dim, dtype):
        torch.nn.Module.__init__(self)
        self.weight = _HostTensor(num * dim, dtype)


class Linear(Embedding):
    pass


class Qwen2Model(torch.nn.Module):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Embedding(152064, 5120, dtype)
        for i in range(48):
            setattr(self, "layers_%d" % i, Qwen2DecoderLayer(dtype))
        self.norm = Embedding(1, 5120, dtype)


class Qwen2ForCausalLM(PreTrainedModel):
    def __init__(self, dtype):
        torch.nn.Module.__init__(self)
        self.model = Qwen2Model(dtype)
        self.lm_head = Linear(152064, 5120, dtype)          # not tied in the 14B

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls(torch_dtype or torch.get_default_dtype())


class AutoModelForCausalLM(object):
    from_pretrained = Qwen2ForCausalLM.from_pretrained


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, args=None, model=None, optimizer=None, model_parameters=None, config=None):
        torch.nn.Module.__init__(self)
        self._config = config
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.device = "cuda:%d" % self.local_rank
        self.zero_stage = config["zero_optimization"]["stage"]
        self._configure_distributed_model(model)
        self._configure_optimizer(optimizer, model_parameters)

    def bfloat16_enabled(self):
        return self._config.get("bf16", {}).get("enabled", False)

    def _configure_distributed_model(self, model):
        self.module = model
        if self.zero_stage < 3:
            # stages 0-2: every rank holds the module's 16-bit weights in full
            self.module.to(self.device, dtype=torch.bfloat16 if self.bfloat16_enabled() else None)
        self._broadcast_model()

    def _broadcast_model(self):
        for p in self.module.parameters():
            dist.broadcast(p, 0)

    def _configure_optimizer(self, optimizer, model_parameters):
        # offload_optimizer: the fp32 master weights and Adam moments of this rank's partition in pinned host
        # memory (DeepSpeedCPUAdam); stage 2's gradient partitions go there too
        self.optimizer = types.SimpleNamespace(cpu_offload=True)


def _nccl_library():
    for p in (os.environ.get("SCEN_NCCL", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib",
                           "libnccl.so.2")):
        if p and os.path.exists(p):
            lib = ctypes.CDLL(p)
            lib.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
            return lib
    raise SystemExit("libnccl.so.2 stand-in not found")


_comm = []


def _broadcast(tensor, src=0):
    if not _comm:       # the communicator is made by the first collective
        if _nccl_library().nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
                                               4 * (1 << 20), 8) != 0:
            raise RuntimeError("NCCL error: unhandled cuda error")
        _comm.append(True)


dist = types.SimpleNamespace(broadcast=_broadcast)


def _init_distributed(dist_backend="nccl"):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


def _initialize(args=None, model=None, optimizer=None, model_parameters=None, config=None):
    if isinstance(config, str):
        config = json.load(open(config))
    engine = DeepSpeedEngine(args=args, model=model, optimizer=optimizer, model_parameters=model_parameters,
                             config=config)
    return engine, engine.optimizer, None, None


deepspeed = types.SimpleNamespace(init_distributed=_init_distributed, initialize=_initialize)


# ---- ds_zero2_offload.json, as the lab wrote it
DS_CONFIG = {
    "bf16": {"enabled": True},
    "zero_optimization": {
        "stage": 2,
        "offload_optimizer": {"device": "cpu", "pin_memory": True},
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": 5e8,
        "allgather_bucket_size": 5e8,
    },
    "gradient_accumulation_steps": 16,
    "train_micro_batch_size_per_gpu": 1,
    "gradient_clipping": 1.0,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-5, "weight_decay": 0.0}},
}

# ---- train_sft.py
deepspeed.init_distributed()
local_rank = int(os.environ["LOCAL_RANK"])
model = AutoModelForCausalLM.from_pretrained("/data/models/Qwen2.5-14B", torch_dtype=torch.bfloat16)
model.gradient_checkpointing_enable()
n = sum(t.numel for m in model.modules() for t in vars(m).values() if isinstance(t, _HostTensor))
if local_rank == 0:
    print("loaded Qwen2.5-14B on cpu: %.2fB parameters, %.1f GiB in bf16" % (n / 1e9, n * BF16 / GiB))
try:
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=DS_CONFIG)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
print("engine ready")
sys.exit(0)
