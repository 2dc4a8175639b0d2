"""Megatron-LM pretraining of a 20B GPT (44 layers, hidden 6144, seq 8192, micro-batch 1, TP=4 with sequence
parallelism, DP=2, distributed optimizer, selective recompute), one node of 8 GPUs, torchrun (PyTorch
2.2.0a0 of the NGC container; rank 0 shown):

    torchrun --nproc-per-node 8 pretrain_gpt.py --tensor-model-parallel-size 4 --sequence-parallel \
        --use-distributed-optimizer --recompute-activations --micro-batch-size 1 --seq-length 8192 \
        --load /ckpt/gpt20b --bf16 ...

The run trained for weeks on an A100 80GB node with this exact configuration (per GPU: bf16 weights 9.4 GiB,
the fp32 gradient buffer 18.9 GiB, the distributed optimizer's fp32 main-parameter shard 9.4 GiB and its Adam
moments 18.9 GiB, activations ~18 GiB: about 77 GiB at the peak).  It was moved, unchanged, to a new H100
80GB SXM node.  On NVSwitch Hopper systems NCCL enables NVLink SHARP (NVLS) by default, and every
communicator of more than two GPUs then maps NVLS buffers of its own (nvlsPerRankSize 288 MiB per peer in
NCCL's INFO log): the world group, the tensor-parallel group, the model-parallel group and the
tensor+data-parallel group that Megatron creates at initialisation take 6.75 GiB of each GPU on top of the
usual 64 MiB of channel buffers apiece.  Resumed from its checkpoint, the first iteration's forward pass
runs out in the 38th of its 44 layers.

An expert: the memory that changed is NCCL's -- run with NCCL_NVLS_ENABLE=0 (what NeMo's launcher and
several serving stacks do for memory), which gives the 6.75 GiB back at a small all-reduce cost; the
configuration itself fit.  Fewer/lazier process groups would help a little; NCCL_BUFFSIZE does not touch
the NVLS buffers.  Smaller micro-batches or full recompute would work around it at a throughput cost; it
is not fragmentation and not another process.
"""
import ctypes
import os
import sys

import torch

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)

rank = int(os.environ.get("RANK", "0"))
local_rank = int(os.environ.get("LOCAL_RANK", "0"))
world = int(os.environ.get("WORLD_SIZE", "1"))
TP, DP = 4, 2
LAYERS, HIDDEN, SEQ, VOCAB = 44, 6144, 8192, 51200

# Optimizer.load_state_dict as PyTorch's does it (the stand-in torch has none): each saved state tensor is
# cast to its parameter's device -- new tensors of the parameter's size on the GPU
_OPT_SRC = '''
def load_state_dict(self, state_dict):
    params = [p for g in self.param_groups for p in g["params"]]
    for i, p in enumerate(params):
        saved = state_dict["state"].get(i)
        if saved is None:
            continue
        self.state[p] = dict((k, empty_like(p) if k.startswith("exp_avg") else v) for k, v in saved.items())
'''
_ns = {"empty_like": torch.empty_like}
exec(compile(_OPT_SRC, os.path.join(os.path.dirname(torch.__file__), "optim", "optimizer.py"), "exec"), _ns)
torch.optim.Optimizer.load_state_dict = _ns["load_state_dict"]


def nccl_library():
    for d in (os.environ.get("SCEN_KIT_LIB", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib")):
        p = os.path.join(d, "libnccl.so.2")
        if d and os.path.exists(p):
            return ctypes.CDLL(p)
    raise SystemExit("libnccl.so.2 stand-in not found")


def new_nccl_comm(nccl, nranks):
    """ncclCommInitRank of one process group on this GPU: channel buffers, and with NVLS (Hopper + NVSwitch,
    more than two ranks, NCCL_NVLS_ENABLE not 0) NVLS buffers of 288 MiB per rank of the group."""
    if nccl.nccl_comm_init_rank(nranks, rank, 4 * MiB, 16) != 0:
        raise RuntimeError("NCCL error: unhandled cuda error")
    if nranks > 2 and os.environ.get("NCCL_NVLS_ENABLE", "1") != "0":
        if nccl.nccl_comm_init_rank(nranks, rank, 288 * MiB, nranks) != 0:
            raise RuntimeError("NCCL error: unhandled cuda error")


def initialize_model_parallel(nccl):
    new_nccl_comm(nccl, world)              # default group (init_process_group(device_id=...))
    new_nccl_comm(nccl, TP)                 # tensor-model-parallel group
    new_nccl_comm(nccl, DP)                 # data-parallel group
    new_nccl_comm(nccl, TP)                 # model-parallel group (TP x PP, PP=1)
    new_nccl_comm(nccl, TP * DP)            # tensor-and-data-parallel group


class ParallelTransformerLayer(torch.nn.Module):
    """This rank's quarter of a layer (12 h^2 / TP parameters) in bf16."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attention = torch.nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN // TP, dtype=torch.bfloat16,
                                                             device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(8 * HIDDEN * HIDDEN // TP, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden):
        # selective recompute with sequence parallelism: what the layer keeps for backward (34 s b h / t)
        kept = torch.empty(34 * SEQ * HIDDEN // TP, device="cuda")
        out = torch.empty(hidden.nbytes // 2, dtype=torch.bfloat16, device="cuda")
        out._saved = [hidden, kept]
        return out


class GPTModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embedding = torch.nn.Parameter(torch.empty(VOCAB // TP * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer%d" % i, ParallelTransformerLayer())

    def forward(self, tokens):
        h = torch.empty(SEQ // TP * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for i in range(LAYERS):
            h = getattr(self, "layer%d" % i)(h)
        logits = torch.empty(SEQ * VOCAB // TP * 4, device="cuda")
        logits._saved = h
        return logits


class MegatronDDP(torch.nn.Module):
    """megatron.core DistributedDataParallel: one contiguous fp32 gradient buffer (main_grad of every
    parameter is a view into it)."""

    def __init__(self, module):
        torch.nn.Module.__init__(self)
        self.module = module
        self.grad_data = torch.empty(sum(p.nbytes for p in module.parameters()) * 2, device="cuda")

    def forward(self, *args):
        return self.module(*args)


torch.cuda.set_device(local_rank)
nccl = nccl_library()
nccl.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
initialize_model_parallel(nccl)

model = MegatronDDP(GPTModel())
# the distributed optimizer: fp32 main parameters for this rank's 1/DP of the weights
main_params = [torch.nn.Parameter(torch.empty(p.nbytes * 2 // DP, device="cuda")) for p in model.parameters()]
optimizer = torch.optim.AdamW(main_params, lr=1.5e-4, betas=(0.9, 0.95), weight_decay=0.1)
# --load: the checkpoint's optimizer shard (read on the CPU), restored onto the GPU
optimizer.load_state_dict({"state": dict((i, {"step": 48000, "exp_avg": None, "exp_avg_sq": None})
                                         for i in range(len(main_params)))})
try:
    for iteration in range(2):
        tokens = torch.empty(SEQ * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits, tokens)
        loss.backward()
        optimizer.step()
        del loss, logits
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
