"""sft_code.py -- a platform team fine-tunes StarCoder2-15B on its internal monorepo (full fine-tuning, packed
4096-token sequences), one node of 8x H100 80GB, DeepSpeed ZeRO stage 2, bf16, gradient checkpointing:

    deepspeed --num_gpus 8 sft_code.py --deepspeed ds_z2.json

The same config trained StarCoder2-3B last month.  While profiling that run someone saw hundreds of small
reduce calls per step in the NCCL trace and raised both buckets tenfold, from DeepSpeed's 5e8 to 5e9
elements ("fewer, bigger all-reduces"); the 3B run was a little faster and nobody looked at its memory.
With overlap_comm, stage 2 keeps two reduction buffers of reduce_bucket_size elements each (double
buffering), allocated at the start of every backward pass: at 5e9 bf16 elements that is 2 x 9.3 GiB.

What a rank holds when the 15B run starts: all bf16 weights (ZeRO-2 partitions only optimizer state and
gradients: 29.7 GiB), its eighth of the fp32 master weights and of the two Adam moments (22.3 GiB), CUDA
context and NCCL buffers (1 GiB).  The first forward (micro-batch 4 x 4096 tokens, 40 checkpointed layers,
fp32 logits of a 49k vocabulary for the loss) adds 13.9 GiB.  engine.backward(loss) then allocates the
first 9.3 GiB reduction buffer, and the second one fails: 3 GiB free.  With the default 5e8 buckets the two
buffers are 1.9 GiB and the step fits (about 74 GiB at its peak, early in the backward pass).

An expert: the failing request is exactly reduce_bucket_size x 2 bytes: put reduce_bucket_size and
allgather_bucket_size back to 5e8 (or "auto" with the HF integration); turning overlap_comm off only
drops one of the two buffers, not enough alone.  The model, batch and optimizer fit as configured.  Wrong first advice: a smaller
micro-batch, gradient checkpointing (already on), mixed precision (already bf16), an 8-bit optimizer or a
bigger card (both would hide a 19 GiB configuration mistake), NCCL_BUFFSIZE (NCCL's own buffers are not
these; DeepSpeed's buckets are PyTorch tensors), expandable_segments / empty_cache (the memory is live),
quantization, inference_mode.
"""
import ctypes
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20
BF16, F32 = 2, 4


# ---- the parts of transformers and deepspeed this script goes through (the simulator has neither),
# mirroring deepspeed/runtime/engine.py and deepspeed/runtime/zero/stage_1_and_2.py
class _HostTensor(object):
    def __init__(self, numel):
        self.numel, self.is_cuda = numel, False


def _apply(module, fn):
    for child in module._modules.values():
        _apply(child, fn)
    for name, t in list(vars(module).items()):
        if isinstance(t, _HostTensor):
            setattr(module, name, torch.nn.Parameter(fn(t)))
    return module


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
    if not _comm:
        if _nccl_library().nccl_comm_init_rank(int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"]),
                                               16 * MiB, 32) != 0:
            raise RuntimeError("NCCL error: unhandled cuda error")
        _comm.append(True)


dist = types.SimpleNamespace(broadcast=_broadcast, get_rank=lambda: int(os.environ["RANK"]),
                             get_world_size=lambda: int(os.environ["WORLD_SIZE"]))


class _Accelerator(object):
    def current_device_name(self):
        return "cuda:%d" % torch.cuda.current_device()


def get_accelerator():
    return _Accelerator()


class FusedAdam(torch.optim.AdamW):
    """deepspeed.ops.adam.FusedAdam: exp_avg and exp_avg_sq per (fp32 partition) parameter."""


class DeepSpeedZeroOptimizer(object):
    def __init__(self, init_optimizer, bit16_params, reduce_bucket_size, allgather_bucket_size, overlap_comm,
                 contiguous_gradients, dp_size, partition_id):
        self.optimizer = init_optimizer
        self.dtype = torch.bfloat16
        self.device = get_accelerator().current_device_name()
        self.reduce_bucket_size = int(reduce_bucket_size)
        self.allgather_bucket_size = int(allgather_bucket_size)
        self.overlap_comm = overlap_comm
        self.contiguous_gradients = contiguous_gradients
        self.micro_step_id = 0
        self.ipg_buffer = None
        numel = sum(p.nbytes for p in bit16_params) // BF16
        partition = (numel + dp_size - 1) // dp_size
        # this rank's fp32 master copy of its partition of the flat bf16 group
        self.single_partition_of_fp32_groups = [torch.empty(partition * F32, device=self.device)]
        self.single_partition_of_fp32_groups[0].requires_grad = True
        self.optimizer.param_groups[0]["params"] = self.single_partition_of_fp32_groups
        self.initialize_optimizer_states()

    def initialize_optimizer_states(self):
        for p in self.single_partition_of_fp32_groups:
            p.grad = torch.empty(p.nbytes, device=self.device)      # torch.zeros(...) of the partition
        self.optimizer.step()
        for p in self.single_partition_of_fp32_groups:
            p.grad = None

    def backward(self, loss, retain_graph=False):
        self.micro_step_id += 1
        if self.contiguous_gradients:
            self.ipg_buffer = []
            buf_0 = torch.empty(int(self.reduce_bucket_size), dtype=self.dtype, device=self.device)
            self.ipg_buffer.append(buf_0)
            # Use double buffers to avoid data access conflict when overlap_comm is enabled.
            if self.overlap_comm:
                buf_1 = torch.empty(int(self.reduce_bucket_size), dtype=self.dtype, device=self.device)
                self.ipg_buffer.append(buf_1)
            self.ipg_index = 0
        loss.backward(retain_graph=retain_graph)


class DeepSpeedEngine(torch.nn.Module):
    def __init__(self, model, model_parameters, config):
        torch.nn.Module.__init__(self)
        self._config = config
        self._configure_distributed_model(model)
        self.optimizer = self._configure_zero_optimizer(FusedAdam(list(model_parameters), **config["optimizer"]["params"]))

    def _configure_distributed_model(self, model):
        self.module = model
        device = get_accelerator().current_device_name()
        _apply(self.module, lambda t: torch.empty(t.numel, dtype=torch.bfloat16, device=device))
        for p in self.module.parameters():
            dist.broadcast(p, 0)

    def _configure_zero_optimizer(self, optimizer):
        zc = self._config["zero_optimization"]
        return DeepSpeedZeroOptimizer(optimizer, self.module.parameters(),
                                      reduce_bucket_size=zc["reduce_bucket_size"],
                                      allgather_bucket_size=zc["allgather_bucket_size"],
                                      overlap_comm=zc["overlap_comm"],
                                      contiguous_gradients=zc["contiguous_gradients"],
                                      dp_size=dist.get_world_size(), partition_id=dist.get_rank())

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def backward(self, loss):
        self.optimizer.backward(loss)

    def step(self):
        self.optimizer.optimizer.step()


def _initialize(model=None, model_parameters=None, config=None):
    engine = DeepSpeedEngine(model, model_parameters, config)
    return engine, engine.optimizer, None, None


def _init_distributed(dist_backend="nccl"):
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))


deepspeed = types.SimpleNamespace(initialize=_initialize, init_distributed=_init_distributed)


# ---- the model: bigcode/starcoder2-15b as transformers lays it out (sizes only)
class Linear(torch.nn.Module):
    def __init__(self, numel):
        torch.nn.Module.__init__(self)
        self.weight = _HostTensor(numel)


class Starcoder2DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = Linear(6144 * 6144 * 2 + 6144 * 512 * 2 + 6144 * 2 + 512 * 2)   # q, o; k, v (GQA, 4 kv heads)
        self.mlp = Linear(6144 * 24576 * 2 + 24576 + 6144)
        self.norms = Linear(4 * 6144)

    def forward(self, hidden, tokens):
        # under gradient checkpointing: run without saving, keep only the layer's input for the recompute
        inter = torch.empty(tokens * 24576 * BF16, device="cuda")
        del inter
        out = torch.empty(tokens * 6144 * BF16, device="cuda")
        out._saved = hidden
        return out


class Starcoder2Model(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = Linear(49152 * 6144)
        for i in range(40):
            setattr(self, "layers_%d" % i, Starcoder2DecoderLayer())
        self.norm = Linear(2 * 6144)

    def forward(self, input_ids, tokens):
        hidden = torch.empty(tokens * 6144 * BF16, device="cuda")
        hidden._saved = input_ids
        for i in range(40):
            hidden = getattr(self, "layers_%d" % i)(hidden, tokens)
        out = torch.empty(tokens * 6144 * BF16, device="cuda")
        out._saved = hidden
        return out


class Starcoder2ForCausalLM(torch.nn.Module):
    vocab = 49152

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = Starcoder2Model()
        self.lm_head = Linear(self.vocab * 6144)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        return cls()

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_ids, labels, micro_batch, seq_len):
        tokens = micro_batch * seq_len
        hidden = self.model(input_ids, tokens)
        logits = torch.empty(tokens * self.vocab * BF16, device="cuda")      # self.lm_head(hidden_states)
        logits._saved = hidden
        logits_fp32 = torch.empty(tokens * self.vocab * F32, device="cuda")  # logits = logits.float()
        logits_fp32._saved = hidden
        torch.autograd._graph.derive(logits_fp32, logits)
        del logits
        loss = torch.nn.functional.cross_entropy(logits_fp32, labels)
        return types.SimpleNamespace(loss=loss, logits=logits_fp32)


# ---- ds_z2.json
DS_CONFIG = {
    "bf16": {"enabled": True},
    "optimizer": {"type": "AdamW", "params": {"lr": 2e-5, "betas": (0.9, 0.95), "weight_decay": 0.1}},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_scatter": True,
        "reduce_bucket_size": 5e9,
        "allgather_bucket_size": 5e9,
    },
    "train_micro_batch_size_per_gpu": 4,
    "gradient_accumulation_steps": 4,
    "gradient_clipping": 1.0,
}

# ---- sft_code.py
deepspeed.init_distributed()
rank = dist.get_rank()
local_rank = int(os.environ["LOCAL_RANK"])
micro_batch = DS_CONFIG["train_micro_batch_size_per_gpu"]
seq_len = 4096
try:
    model = Starcoder2ForCausalLM.from_pretrained("/mnt/models/starcoder2-15b", torch_dtype=torch.bfloat16)
    model.gradient_checkpointing_enable()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=DS_CONFIG)
    if rank == 0:
        print("engine ready: %.1f GiB allocated on rank 0" % (torch.cuda.memory_allocated() / GiB))
    for step in range(2):
        input_ids = torch.empty(micro_batch * seq_len * 8, device="cuda")
        labels = torch.empty(micro_batch * seq_len * 8, device="cuda")
        outputs = engine(input_ids=input_ids, labels=labels, micro_batch=micro_batch, seq_len=seq_len)
        if rank == 0:
            print("step %d forward: %.1f GiB allocated" % (step, torch.cuda.memory_allocated() / GiB))
        engine.backward(outputs.loss)
        engine.step()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
