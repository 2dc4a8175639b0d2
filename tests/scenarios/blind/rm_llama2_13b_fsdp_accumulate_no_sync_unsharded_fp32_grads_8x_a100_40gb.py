"""train_rm.py -- reward-model training for an RLHF pipeline: a Llama-2-13B backbone with a scalar score head,
trained on (chosen, rejected) pairs with the Bradley-Terry loss, under PyTorch FSDP (FULL_SHARD, one unit per
decoder layer, activation checkpointing, bf16 autocast, fp32 parameters) through Accelerate, on one node of
8x A100-SXM4-40GB, launched with `accelerate launch --config_file fsdp.yaml train_rm.py` and plain
`LD_PRELOAD=liboomguard.so` in the environment.  This is rank 0 (GPU 0); the seven other ranks run the same
code on GPUs 1-7.

    accelerator = Accelerator(gradient_accumulation_steps=8)       # FSDP plugin from fsdp.yaml
    model = AutoModelForSequenceClassification.from_pretrained("llama-2-13b-sft", num_labels=1)
    model.gradient_checkpointing_enable()
    optimizer = torch.optim.AdamW(model.parameters(), lr=9e-6)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:                                            # one pair, 2 x 2048 tokens
        with accelerator.accumulate(model):                         # <- no_sync() on 7 of 8 micro-batches
            r = model(**batch).logits
            loss = -F.logsigmoid(r[0] - r[1]).mean()
            accelerator.backward(loss)
            optimizer.step(); optimizer.zero_grad()

The sizes (per rank).  13.0B parameters: 40 decoder layers of 317M (5120 hidden, 13824 MLP) and a 164M
embedding.  FULL_SHARD keeps 1/8 of the fp32 flat parameters on each GPU (6.0 GiB); a layer is all-gathered
(1.18 GiB fp32, plus the prefetched next one) only while it runs.  With checkpointing the forward pass keeps
only each layer's input (2 x 2048 x 5120 bf16 = 40 MiB, 1.6 GiB in all).  Synchronised every micro-batch,
the job needs 6 GiB of parameter shards + 6 GiB of gradient shards + 12 GiB of AdamW state (first step) +
~4 GiB of transients: about 29 GiB of the 40.

Why it fails.  Gradient accumulation through `accelerator.accumulate()` enters FSDP's `no_sync()` on the
micro-batches that do not step.  Under no_sync FSDP skips the reduce-scatter and keeps each FlatParameter's
gradient UNSHARDED (PyTorch documents this: "FSDP will accumulate the full model gradients (instead of
gradient shards) until the eventual sync"): every layer's backward leaves a full 1.18 GiB fp32 gradient on
every GPU, 47.5 GiB for the model -- more than the card.  The very first micro-batch's backward fails
after ~23 of the 40 layers, in the gradient of the next layer (or the all-gather of its parameters), before
any optimizer step.  Nothing leaks; the batch (one pair) and checkpointing are not the problem.

What an expert says first: accumulate with sharded gradients -- don't use no_sync with FSDP (Accelerate:
GradientAccumulationPlugin(num_steps=8, sync_each_batch=True); plain FSDP: call backward outside
model.no_sync()), which costs one reduce-scatter per micro-batch and keeps the gradient at 1/8.  There is
no id for it in the catalog: the expectation names `sync_each_batch`.  Wrong advice: a smaller batch (it is
one pair; the unsharded gradient does not depend on the batch), gradient checkpointing (already on), mixed
precision (autocast already on), "use ZeRO-3/FSDP" (it already runs FULL_SHARD), empty_cache or
expandable_segments (nothing is cached or fragmented: live gradients fill the card).
"""
import ctypes
import os
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30

WORLD_SIZE = int(os.environ.get("WORLD_SIZE", "8"))
LOCAL_RANK = int(os.environ.get("LOCAL_RANK", "0"))

HIDDEN, INTER, LAYERS, VOCAB = 5120, 13824, 40, 32000
LAYER_NUMEL = 4 * HIDDEN * HIDDEN + 3 * HIDDEN * INTER + 2 * HIDDEN       # 317,204,480 parameters a layer
ROOT_NUMEL = VOCAB * HIDDEN + HIDDEN + HIDDEN                               # embedding, final norm, score head
SEQS, SEQ_LEN = 2, 2048                                                     # one (chosen, rejected) pair
TOKENS = SEQS * SEQ_LEN


class FlatParameter(nn.Parameter):
    """torch.distributed.fsdp.FlatParameter: this rank's 1/world_size of a unit's parameters, flattened (fp32)."""


class FullyShardedDataParallel(nn.Module):
    """torch.distributed.fsdp.FullyShardedDataParallel (FULL_SHARD), as far as memory goes: the wrapped
    module's parameters live as a sharded FlatParameter; they are all-gathered (unsharded) before the module
    runs and freed after (reshard_after_forward); in backward the gradient of the unsharded parameter is
    reduce-scattered to a shard -- or, under no_sync(), kept unsharded in flat_param.grad."""

    def __init__(self, module, numel, world_size):
        nn.Module.__init__(self)
        self._fsdp_wrapped_module = module
        self._unsharded_numel = numel
        shard = (numel + world_size - 1) // world_size
        self.flat_param = FlatParameter(torch.empty(shard, dtype=torch.float32, device="cuda"))
        self._sync_gradients = True
        self._full = None

    def _unshard(self):
        """all_gather_into_tensor: the unit's full fp32 parameters on this GPU."""
        if self._full is None:
            self._full = torch.empty(self._unsharded_numel, dtype=torch.float32, device="cuda")

    def _reshard(self):
        self._full = None

    def forward(self, hidden):
        self._unshard()
        out = self._fsdp_wrapped_module(hidden)
        self._reshard()
        return out

    def _post_backward_hook(self, unsharded_grad):
        """FSDP's _post_backward_hook: reduce-scatter the unsharded gradient into a shard and accumulate it
        into flat_param.grad -- unless gradients are not being synchronised (no_sync): then the unsharded
        gradient stays in flat_param.grad, full size, until the micro-batch that syncs."""
        if not self._sync_gradients:
            if self.flat_param.grad is None:
                self.flat_param.grad = unsharded_grad
            return
        if self.flat_param.grad is None:
            self.flat_param.grad = torch.empty(self.flat_param.nbytes // 4, dtype=torch.float32, device="cuda")


class LlamaDecoderLayer(nn.Module):
    def forward(self, hidden):
        """Checkpointed: only the layer's input is saved; its output (bf16 under autocast) goes on."""
        out = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")
        out._saved = hidden
        return out

    def recompute(self):
        """torch.utils.checkpoint in backward: the layer's activations again (attention and MLP, bf16),
        freed when its backward is done."""
        return [torch.empty(TOKENS * n, dtype=torch.bfloat16, device="cuda")
                for n in (4 * HIDDEN, 2 * HIDDEN + 2 * 1024, 4 * INTER, 2 * HIDDEN)]


class RewardModel(nn.Module):
    def __init__(self, world_size):
        nn.Module.__init__(self)
        self.layers = [FullyShardedDataParallel(LlamaDecoderLayer(), LAYER_NUMEL, world_size)
                       for _ in range(LAYERS)]
        for i, unit in enumerate(self.layers):
            self._modules["layer%d" % i] = unit
        self.root = FullyShardedDataParallel(nn.Module(), ROOT_NUMEL, world_size)   # embed_tokens, norm, score
        self.boundaries = []

    def forward(self, input_ids):
        self.root._unshard()                           # the root unit stays gathered through forward and backward
        hidden = torch.empty(TOKENS * HIDDEN, dtype=torch.bfloat16, device="cuda")    # embed_tokens
        self.boundaries = [hidden]
        for unit in self.layers:
            hidden = unit(hidden)
            self.boundaries.append(hidden)
        rewards = torch.empty(SEQS, dtype=torch.float32, device="cuda")             # score head, last token
        rewards._saved = hidden
        return rewards


class Accelerator(object):
    """accelerate.Accelerator with the FSDP plugin, as far as memory goes."""

    def __init__(self, gradient_accumulation_steps):
        self.gradient_accumulation_steps = gradient_accumulation_steps
        self.step = 0
        self.sync_gradients = True

    def accumulate(self, model):
        acc = self

        class _Ctx(object):
            def __enter__(self):
                acc.step += 1
                acc.sync_gradients = acc.step % acc.gradient_accumulation_steps == 0
                for unit in model.layers + [model.root]:            # model.no_sync() unless this one steps
                    unit._sync_gradients = acc.sync_gradients

            def __exit__(self, *exc):
                return False
        return _Ctx()

    def backward(self, loss, model):
        """loss.backward() through FSDP: each unit, last first, is all-gathered again (the next one
        prefetched), its checkpointed activations recomputed, the gradient of its unsharded parameters made
        (AccumulateGrad) and handed to FSDP's post-backward hook."""
        t = loss
        while t is not None:                           # the graph: each checkpointed input is now held by
            t._saved, t = None, getattr(t, "_saved", None)   # model.boundaries alone, freed as backward passes it
        prefetched = None
        for i in range(LAYERS - 1, -1, -1):
            unit = model.layers[i]
            unit._unshard()
            if i > 0:
                model.layers[i - 1]._unshard()                      # BACKWARD_PRE prefetch
                prefetched = model.layers[i - 1]
            acts = unit._fsdp_wrapped_module.recompute()
            grad = torch.empty(LAYER_NUMEL, dtype=torch.float32, device="cuda")     # d loss / d unsharded params
            unit._post_backward_hook(grad)
            del grad, acts
            unit._reshard()
            model.boundaries.pop()
        if prefetched is not None:
            prefetched._reshard()
        model.root._post_backward_hook(torch.empty(ROOT_NUMEL, dtype=torch.float32, device="cuda"))
        model.root._reshard()
        model.boundaries = []


def init_process_group():
    """torch.distributed.init_process_group("nccl"): the communicator's channel buffers on this GPU."""
    lib = os.environ.get("SCEN_LIBNCCL")
    if lib:
        ctypes.CDLL(lib).nccl_comm_init_rank(WORLD_SIZE, int(os.environ.get("RANK", "0")), 24 * MiB, 16)


scen_truth.note_every_empty(torch)
torch.cuda.set_device(LOCAL_RANK)
init_process_group()
try:
    model = RewardModel(WORLD_SIZE)                    # accelerator.prepare(): FSDP FULL_SHARD, fp32 shards
    optimizer = torch.optim.AdamW(model.parameters(), lr=9e-6)
    accelerator = Accelerator(gradient_accumulation_steps=8)
    for step in range(4000):
        with accelerator.accumulate(model):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                rewards = model(step)
                loss = torch.empty(1, dtype=torch.float32, device="cuda")       # -logsigmoid(r_c - r_r)
                loss._saved = rewards
            accelerator.backward(loss, model)
            if accelerator.sync_gradients:
                optimizer.step()
                optimizer.zero_grad()
            del rewards, loss
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
