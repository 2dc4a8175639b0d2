"""dpo.py -- full-parameter DPO of Llama-3.1-8B-Instruct with TRL's DPOTrainer on a 4x RTX 4090 (24 GB)
workstation, Accelerate FSDP: FULL_SHARD, transformer auto-wrap (one unit per LlamaDecoderLayer), bf16
mixed precision, and `fsdp_offload_params: true` -- turned on "to make the 8B fit" -- but
`fsdp_activation_checkpointing: false` (the default of `accelerate config`) and no gradient_checkpointing in
DPOConfig.  Launched with `accelerate launch --config_file fsdp_offload.yaml dpo.py`, plain
`LD_PRELOAD=liboomguard.so`; this is rank 0 (GPU 0), ranks 1-3 on GPUs 1-3.

    args = DPOConfig(per_device_train_batch_size=2, gradient_accumulation_steps=8, max_length=2048,
                     bf16=True, beta=0.1)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=pairs, processing_class=tok)
    trainer.train()

Sizes per rank.  8.03B parameters (32 layers of 218M, 4096 hidden, 14336 MLP, 128256 vocabulary, untied
lm_head).  With CPU offload the parameter shards, gradients and AdamW state all live in host RAM; the GPU holds
the unit being run (a layer all-gathered in bf16: 416 MiB) and the root unit (embedding, lm_head, norm:
1.96 GiB, kept gathered through the step), the CUDA context and NCCL's buffers: ~3 GiB.  The batch: 2 pairs,
chosen and rejected concatenated, padded to 2048 -> 4 x 2048 = 8192 tokens.

Why it fails.  Without activation checkpointing every decoder layer keeps its activations for backward:
the norms' inputs and outputs, q/k/v, the attention output, and the MLP's gate/up/SiLU/product tensors at
8192 x 14336 each -- about 1.4 GiB a layer in bf16, 44 GiB for the 32 layers.  The reference pass (no_grad)
goes through; the policy's forward fails at about layer 15 of 32.  Offloading took the parameters off the GPU
already; what fills it is activations.

What an expert says first: turn on activation checkpointing (`fsdp_activation_checkpointing: true`, or
gradient_checkpointing=True in DPOConfig): the forward then keeps one 64 MiB input per layer (2 GiB) and the step
peaks around 17 GiB.  Wrong advice: more CPU offload or "use FSDP/ZeRO" (parameters, gradients and optimizer
are already sharded and offloaded), batch size 1 alone (still ~0.7 GiB a layer, 22 GiB: does not fit),
mixed precision (bf16 already), an 8-bit optimizer or quantization (the optimizer and weights are not on the
GPU), empty_cache / expandable_segments (live activations), inference_mode (training).
"""
import ctypes
import os
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "4"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 4096, 14336, 32, 128256, 1024
LAYER_NUMEL = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * INTER + 2 * HIDDEN    # 218,112,000
ROOT_NUMEL = 2 * VOCAB * HIDDEN + HIDDEN                                                     # embed, lm_head, norm
PAIRS, MAX_LENGTH = 2, 2048
TOKENS = 2 * PAIRS * MAX_LENGTH                                                               # chosen + rejected


class HostShard(object):
    """CPUOffload(offload_params=True): this rank's fp32 FlatParameter shard, in pinned host memory."""

    def __init__(self, numel, world_size):
        self.numel = (numel + world_size - 1) // world_size


class FullyShardedDataParallel(nn.Module):
    """FSDP FULL_SHARD with CPU offload and MixedPrecision(param_dtype=bf16), as far as GPU memory goes:
    before the wrapped module runs, the shard is copied to the GPU, cast to bf16 and all-gathered into the
    unit's full bf16 parameters; after it runs they are freed (the root unit stays gathered)."""

    def __init__(self, module, numel, world_size, root=False):
        nn.Module.__init__(self)
        self._fsdp_wrapped_module = module
        self._unsharded_numel = numel
        self._shard = HostShard(numel, world_size)
        self._full_param_padded = None
        self._is_root = root

    def _unshard(self):
        if self._full_param_padded is None:
            staged = torch.empty(self._shard.numel, dtype=torch.float32, device="cuda")   # H2D copy of the shard
            low = torch.empty(self._shard.numel, dtype=torch.bfloat16, device="cuda")     # cast to param_dtype
            del staged
            self._full_param_padded = torch.empty(self._unsharded_numel, dtype=torch.bfloat16, device="cuda")
            del low

    def _reshard(self, force=False):
        if force or not self._is_root:
            self._full_param_padded = None

    def forward(self, *args):
        self._unshard()
        out = self._fsdp_wrapped_module(*args)
        self._reshard()
        return out


class LlamaDecoderLayer(nn.Module):
    # what one layer saves for backward, in units of TOKENS x bf16 elements: input_layernorm in/out, q, k, v,
    # rotated q and k, attention output, post_attention_layernorm in/out, gate, up, SiLU(gate), product
    SAVED = (HIDDEN, HIDDEN, HIDDEN, KV_DIM, KV_DIM, HIDDEN, KV_DIM, HIDDEN, HIDDEN, HIDDEN,
             INTER, INTER, INTER, INTER)

    def forward(self, hidden):
        if torch.is_grad_enabled():
            saved = [torch.empty(TOKENS * n, dtype=torch.bfloat16, device="cuda") for n in self.SAVED]
        else:
            saved = None
            tmp = torch.empty(TOKENS * INTER, dtype=torch.bfloat16, device="cuda")           # the MLP's widest
            del tmp
        out = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")
        if saved is not None:
            out._saved = hidden
            out._acts = saved
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self, world_size):
        nn.Module.__init__(self)
        self.layers = [FullyShardedDataParallel(LlamaDecoderLayer(), LAYER_NUMEL, world_size) for _ in range(LAYERS)]
        for i, unit in enumerate(self.layers):
            self._modules["layers.%d" % i] = unit
        self.root = FullyShardedDataParallel(nn.Module(), ROOT_NUMEL, world_size, root=True)

    def forward(self, tokens):
        self.root._unshard()
        hidden = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")        # embed_tokens
        for unit in self.layers:
            hidden = unit(hidden)
        logits = torch.empty(TOKENS * VOCAB, dtype=torch.bfloat16, device="cuda")         # lm_head
        if torch.is_grad_enabled():
            logits._saved = hidden
        else:
            self.root._reshard(force=True)          # no backward to come: the root unit is freed too
        return logits


def concatenated_forward(model, batch):
    """DPOTrainer.concatenated_forward: chosen and rejected in one pass; the per-token log-probs of the
    labels (logits upcast to fp32, log_softmax, gather), summed per sequence."""
    logits = model(batch)
    logps = torch.empty(TOKENS * VOCAB, dtype=torch.float32, device="cuda")       # logits.float().log_softmax(-1)
    if torch.is_grad_enabled():
        logps._saved = logits
    del logits
    out = torch.empty(2 * PAIRS, dtype=torch.float32, device="cuda")
    if torch.is_grad_enabled():
        out._saved = logps
    del logps
    return out


def backward(loss):
    """loss.backward() under FSDP with CPU offload: each unit is gathered again, its gradient reduce-scattered
    and the shard copied to the host; on the GPU the saved activations are freed as it goes."""
    t = loss
    while t is not None:
        t._saved, t = None, getattr(t, "_saved", None)
    policy.root._reshard(force=True)


def init_process_group():
    lib = os.environ.get("SCEN_LIBNCCL")
    if lib:
        ctypes.CDLL(lib).nccl_comm_init_rank(WORLD_SIZE, int(os.environ.get("RANK", "0")), 16 * MiB, 16)


scen_truth.note_every_empty(torch)
torch.cuda.set_device(LOCAL_RANK)
init_process_group()
try:
    policy = LlamaForCausalLM(WORLD_SIZE)          # accelerator.prepare: FSDP, params offloaded to the CPU
    ref = LlamaForCausalLM(WORLD_SIZE)             # DPOTrainer prepares the reference the same way
    for step in range(2000):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            with torch.no_grad():
                ref_logps = concatenated_forward(ref, step)
            policy_logps = concatenated_forward(policy, step)
            loss = torch.empty(1, dtype=torch.float32, device="cuda")                 # -logsigmoid(beta * ...)
            loss._saved = policy_logps
        backward(loss)
        del ref_logps, policy_logps, loss
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
