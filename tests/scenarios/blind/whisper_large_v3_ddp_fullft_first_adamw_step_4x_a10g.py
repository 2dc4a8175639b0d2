"""finetune_whisper_ddp.py -- a speech team fine-tunes openai/whisper-large-v3 (1.54B parameters) on 900 h of
Tagalog/English code-switched call-centre audio, full fine-tuning, on one AWS g5.12xlarge (4x A10G, 24 GB
each, 22.5 GiB usable), launched with

    torchrun --standalone --nproc_per_node 4 finetune_whisper_ddp.py --batch-size 8 --lr 1e-5

A hand-written loop in the style of the HF blog post, moved to DDP "so that each card only has to hold a
quarter of the work":

    model = WhisperForConditionalGeneration.from_pretrained(ckpt).to(device)      # fp32 master weights
    model.gradient_checkpointing_enable()
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_features=..., labels=...).loss
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

What every rank holds: the fp32 weights (5.7 GiB), DDP's gradient buckets (a second copy of the gradients,
5.7 GiB: gradient_as_bucket_view is left at its default), the CUDA context and NCCL's buffers.  The first
forward (8 clips of 30 s, gradient checkpointing on, bf16 autocast) and the first backward (the gradients,
5.7 GiB) go through: 20.1 GiB at the peak.  Then the first optimizer.step() creates AdamW's exp_avg and
exp_avg_sq, 11.5 GiB more, on a card that has about 4 GiB left: it fails a third of the way through the
parameters, on every rank at once.  DDP replicates everything, optimizer state included: four cards hold
four copies of the same 11.5 GiB.

An expert: the failure is in the optimizer step, so only the optimizer state matters here.  Shard it
across the four ranks (ZeroRedundancyOptimizer, FSDP SHARD_GRAD_OP/FULL_SHARD, or DeepSpeed ZeRO-1/2:
2.9 GiB per rank instead of 11.5) or use an 8-bit AdamW (2.9 GiB) / Adafactor (the HF recipe for
whisper-large on 24 GB cards).  gradient_as_bucket_view=True helps (-5.7 GiB) but alone still needs about 24 GiB,
over the card.  Wrong first advice: a smaller batch or gradient checkpointing (activations are freed by
then, checkpointing is already on), mixed precision (already bf16 autocast; the master weights and the
moments stay fp32), inference_mode (this is training, though the step runs with autograd off),
empty_cache / expandable_segments (nothing is cached; the memory is live state).
"""
import ctypes
import os
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
F32 = 4


# ---- torch.distributed as far as this script uses it (the simulator's torch has none).  NCCL's
# communicator is made by the first collective (DDP's broadcast of the weights): libnccl.so.2 allocates its
# channel buffers itself, with cudaMalloc on the rank's device.
def _nccl_library():
    for p in (os.environ.get("SCEN_NCCL", ""),
              os.path.join(os.path.dirname(os.environ.get("FAKE_TORCH_LIBC10", "")), os.pardir, "scenarios", "lib",
                           "libnccl.so.2")):
        if p and os.path.exists(p):
            lib = ctypes.CDLL(p)
            lib.nccl_comm_init_rank.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_size_t, ctypes.c_int]
            return lib
    raise SystemExit("libnccl.so.2 stand-in not found")


class _ProcessGroupNCCL(object):
    def __init__(self, rank, size):
        self.rank, self.size, self._comm = rank, size, False

    def _ensure_comm(self):
        if not self._comm:
            if _nccl_library().nccl_comm_init_rank(self.size, self.rank, 4 * MiB, 16) != 0:
                raise RuntimeError("NCCL error: unhandled cuda error")
            self._comm = True


_pg = []


def _init_process_group(backend="nccl"):
    _pg.append(_ProcessGroupNCCL(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])))


def _broadcast(tensor, src=0):
    _pg[0]._ensure_comm()


dist = types.SimpleNamespace(init_process_group=_init_process_group, broadcast=_broadcast,
                             get_rank=lambda: _pg[0].rank, get_world_size=lambda: _pg[0].size)


class DDP(torch.nn.parallel.DistributedDataParallel):
    """torch.nn.parallel.DistributedDataParallel: the stand-in's reducer buckets, plus the broadcast of the
    module's state from rank 0 that makes NCCL's communicator."""

    def __init__(self, module, device_ids=None, **kw):
        for p in module.parameters():
            dist.broadcast(p, 0)
        torch.nn.parallel.DistributedDataParallel.__init__(self, module, device_ids=device_ids, **kw)


# ---- the model: whisper-large-v3 as transformers lays it out (sizes only)
def _param(n_params):
    return torch.nn.Parameter(torch.empty(n_params * F32, device="cuda"))


class WhisperEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * 1280 * 1280 + 3 * 1280)
        self.fc = _param(2 * 1280 * 5120 + 5120 + 1280)
        self.norms = _param(4 * 1280)

    def forward(self, hidden, batch):
        # gradient checkpointing: only the layer's input is kept for backward, the rest is recomputed
        out = torch.empty(batch * 1500 * 1280 * F32, device="cuda")
        tmp = torch.empty(batch * 1500 * 5120 * 2, device="cuda")       # bf16 MLP intermediate
        del tmp
        out._saved = hidden
        return out


class WhisperDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * 1280 * 1280 + 3 * 1280)
        self.encoder_attn = _param(4 * 1280 * 1280 + 3 * 1280)
        self.fc = _param(2 * 1280 * 5120 + 5120 + 1280)
        self.norms = _param(6 * 1280)

    def forward(self, hidden, enc, batch, tgt_len):
        out = torch.empty(batch * tgt_len * 1280 * F32, device="cuda")
        out._saved = hidden                 # (the encoder output is kept by the first decoder layer's input)
        return out


class WhisperForConditionalGeneration(torch.nn.Module):
    vocab = 51866

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv = _param(128 * 1280 * 3 + 1280 * 1280 * 3 + 2 * 1280)
        self.embed_positions = _param(1500 * 1280)
        self.embed_tokens = _param(self.vocab * 1280)           # tied with proj_out
        self.decoder_positions = _param(448 * 1280)
        for i in range(32):
            setattr(self, "encoder_layer_%d" % i, WhisperEncoderLayer())
        for i in range(32):
            setattr(self, "decoder_layer_%d" % i, WhisperDecoderLayer())
        self.layer_norms = _param(4 * 1280)

    def gradient_checkpointing_enable(self):
        self.gradient_checkpointing = True

    def forward(self, input_features, labels, batch, tgt_len):
        hidden = torch.empty(batch * 1500 * 1280 * F32, device="cuda")
        hidden._saved = input_features
        for i in range(32):
            hidden = getattr(self, "encoder_layer_%d" % i)(hidden, batch)
        enc = hidden
        hidden = torch.empty(batch * tgt_len * 1280 * F32, device="cuda")
        hidden._saved = enc
        for i in range(32):
            hidden = getattr(self, "decoder_layer_%d" % i)(hidden, enc, batch, tgt_len)
        logits = torch.empty(batch * tgt_len * self.vocab * F32, device="cuda")
        logits._saved = hidden
        loss = torch.nn.functional.cross_entropy(logits, labels)
        return types.SimpleNamespace(loss=loss, logits=logits)


# ---- the training script
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl")
batch_size = 8
max_label_len = 128

try:
    model = WhisperForConditionalGeneration()
    model.gradient_checkpointing_enable()
    n_params = sum(p.nbytes for p in model.parameters()) // F32
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.01)
    if dist.get_rank() == 0:
        print("whisper-large-v3: %.2fB parameters; after DDP %.1f GiB allocated"
              % (n_params / 1e9, torch.cuda.memory_allocated() / (1 << 30)))

    for step in range(3):
        input_features = torch.empty(batch_size * 128 * 3000 * F32, device="cuda")   # log-mel, 30 s
        labels = torch.empty(batch_size * max_label_len * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            outputs = model(input_features=input_features, labels=labels, batch=batch_size,
                            tgt_len=max_label_len)
        loss = outputs.loss
        scen_truth.backward(loss)         # loss.backward(); the saved activations go, as in PyTorch
        if dist.get_rank() == 0:
            print("step %d backward done, %.1f GiB allocated" % (step, torch.cuda.memory_allocated() / (1 << 30)))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if dist.get_rank() == 0:
            print("step %d: loss ok, %.1f GiB allocated" % (step, torch.cuda.memory_allocated() / (1 << 30)))
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(local_rank)
    raise
sys.exit(0)
