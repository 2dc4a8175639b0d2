"""Continued pretraining of TinyLlama-1.1B with plain DDP on two p4d nodes (16x A100-SXM4-40GB), fp32 weights with
bf16 autocast, AdamW.  Inter-node links flap now and then, and a torchrun restart costs the team ~10 minutes of
rendezvous and dataset warm-up, so the script recovers in-process from NCCL failures:

    failures = []
    for attempt in range(MAX_INPROC_RESTARTS):
        dist.init_process_group("nccl", timeout=timedelta(minutes=10))
        try:
            run_training(args)                                # builds model, DDP, AdamW; resumes from the last ckpt
            break
        except dist.DistBackendError as err:                  # NCCL watchdog timeout / communicator aborted
            failures.append(err)                              # printed in the end-of-job report
            log.warning("attempt %d: NCCL failure, re-forming the process group", attempt)
            dist.destroy_process_group()

What happens: the first attempt trains for a while (in the simulation 40 steps, checkpointing every 25), then the
loss all-reduce used for logging raises DistBackendError.  The exception object kept in `failures` holds its
traceback, and the traceback holds the frame of run_training with all its locals: the first attempt's model, its DDP
wrapper (gradient buckets) and its AdamW state all stay on the GPU.  The second attempt builds a second copy of
everything beside them, resumes from the last checkpoint, and runs out of memory in its first forward pass (layer 14
of 22, a 44 MiB MLP activation).

Sizes per rank (A100 40GB = 40 GiB, 0.5 GiB CUDA context; 1.1B params; micro-batch 2 x 2048 tokens):
  * one attempt's training state: weights fp32 4.1 GiB + DDP reducer buckets (gradient_as_bucket_view=False: a
    second flat copy of the gradients) 4.1 GiB + AdamW exp_avg/exp_avg_sq 8.2 GiB = 16.4 GiB; gradients (4.1 GiB)
    live from backward to zero_grad;
  * activations: ~105 KB per token per layer (fp32 residual stream and RMSNorm upcasts, bf16 q/k/v/attention/MLP
    tensors) x 4096 tokens x 22 layers = 9 GiB, plus the logits (4096 x 32000: bf16 + fp32 log_softmax = 0.73 GiB);
  * first attempt: peaks ~31 GiB, fine;
  * second attempt: 16.4 GiB still held by the first + 0.5 + 8.2 (new weights and buckets) + the steady 8.2 GiB
    AdamW state (resumed from the checkpoint onto the GPU) = 33.5 GiB before the forward; the forward's 9 GiB does
    not fit (~0.8 GiB more sits cached in pieces of the first attempt's freed activations).

What an expert says first: nothing in the model changed; the memory is the previous attempt's objects, alive only
because the exception is kept.  Keep str(err) / traceback.format_exc() instead of the exception (or `del` it), drop
every reference to the old model/optimizer (and gc.collect(); torch.cuda.empty_cache()) before rebuilding -- or let
torchrun restart the worker process (--max-restarts), which frees everything by construction.  Wrong advice: a
smaller batch, gradient checkpointing, mixed precision, ZeRO/FSDP, an 8-bit optimizer, a bigger GPU (the job fits
with room to spare once the first attempt is gone); empty_cache alone (the old tensors are referenced, not cached);
expandable_segments.
"""
import os
import tempfile

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 2048
FFN = 5632
KV = 256                   # 4 kv heads x 64
N_LAYERS = 22
VOCAB = 32000
SEQ_LEN = 2048
MICRO_BATCH = 2
TOTAL_STEPS = 20000
CKPT_EVERY = 25             # the real job: every 500 steps (the simulation shortens the run)
MAX_INPROC_RESTARTS = 3


# ---- torch.distributed, as far as this script uses it (the stand-in torch has none) -------------------------------
class DistBackendError(RuntimeError):
    """torch.distributed.DistBackendError."""


class _ProcessGroupNCCL(object):
    # simulation only: the inter-node link of the first process group drops during step 40 (in the real run: after
    # some hours)
    _link_fails_at_call = [40, None, None, None]
    _groups_made = 0

    def __init__(self):
        self._fail_at = _ProcessGroupNCCL._link_fails_at_call[_ProcessGroupNCCL._groups_made]
        _ProcessGroupNCCL._groups_made += 1
        self._seq = 0

    def allreduce(self, tensor):
        self._seq += 1
        if self._fail_at is not None and self._seq > self._fail_at:
            raise DistBackendError(
                "[Rank %s] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=%d, OpType=ALLREDUCE, "
                "NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for 600012 milliseconds before timing out."
                % (os.environ.get("RANK", "0"), self._seq * 169))


_default_pg = []


def init_process_group(backend="nccl"):
    _default_pg.append(_ProcessGroupNCCL())


def destroy_process_group():
    del _default_pg[:]


def all_reduce(tensor):
    _default_pg[-1].allreduce(tensor)
# ---------------------------------------------------------------------------------------------------------------------


def weight(*dims):
    n = 1
    for d in dims:
        n *= d
    return nn.Parameter(torch.empty(n, dtype=torch.float32))


def act(n, width, saved, dtype=torch.bfloat16):
    t = torch.empty(n * width, dtype=dtype)
    t._saved = saved
    return t


class LlamaDecoderLayer(nn.Module):
    def __init__(self, i):
        nn.Module.__init__(self)
        self.idx = i
        self.q_proj, self.k_proj, self.v_proj = weight(HIDDEN, HIDDEN), weight(HIDDEN, KV), weight(HIDDEN, KV)
        self.o_proj = weight(HIDDEN, HIDDEN)
        self.gate_proj, self.up_proj, self.down_proj = weight(HIDDEN, FFN), weight(HIDDEN, FFN), weight(FFN, HIDDEN)
        self.input_layernorm, self.post_attention_layernorm = weight(HIDDEN), weight(HIDDEN)

    def forward(self, x, T):
        x32 = act(T, HIDDEN, x, torch.float32)                               # LlamaRMSNorm upcast
        normed = act(T, HIDDEN, x32)
        q, k, v = act(T, HIDDEN, normed), act(T, KV, normed), act(T, KV, normed)
        q_rot, k_rot = act(T, HIDDEN, q), act(T, KV, k)
        attn = act(T, HIDDEN, (q_rot, k_rot, v))                               # scaled_dot_product_attention
        o = act(T, HIDDEN, attn)
        h = act(T, HIDDEN, (x, o), torch.float32)                              # residual (fp32 stream)
        h32 = act(T, HIDDEN, h, torch.float32)
        normed2 = act(T, HIDDEN, h32)
        gate, up = act(T, FFN, normed2), act(T, FFN, normed2)
        prod = act(T, FFN, (act(T, FFN, gate), up))                            # silu(gate) * up
        down = act(T, HIDDEN, prod)
        return act(T, HIDDEN, (h, down), torch.float32)


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = weight(VOCAB, HIDDEN)
        self.layers = []
        for i in range(N_LAYERS):
            layer = LlamaDecoderLayer(i)
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = weight(HIDDEN)
        self.lm_head = weight(HIDDEN, VOCAB)

    def forward(self, input_ids, labels):
        T = input_ids.nbytes // 8
        h = act(T, HIDDEN, input_ids, torch.float32)
        for layer in self.layers:
            h = layer(h, T)
        logits = act(T, VOCAB, act(T, HIDDEN, h))
        return F.nll_loss(F.log_softmax(logits, dim=-1, dtype=torch.float32), labels)


def free_saved_tensors(loss):
    """What autograd does once backward has run (retain_graph=False): the tensors the graph saved are released."""
    todo = [loss]
    while todo:
        t = todo.pop()
        saved = getattr(t, "_saved", None)
        t._saved = None
        todo.extend(x for x in (saved if isinstance(saved, tuple) else (saved,)) if isinstance(x, torch.Tensor))


def train_step(ddp_model, optimizer, batch):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = ddp_model(batch["input_ids"], batch["labels"])
    loss.backward()
    free_saved_tensors(loss)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def log_loss(loss, step):
    all_reduce(loss)                    # mean over ranks, for the dashboard
    if step % 10 == 0 and os.environ.get("RANK", "0") == "0":
        pass                            # wandb.log({"loss": loss.item() / world_size}, step=step)


def save_checkpoint(ckpt_dir, model, step):
    torch.save(model.state_dict(), os.path.join(ckpt_dir, "model.pt"))
    with open(os.path.join(ckpt_dir, "step.txt"), "w") as f:
        f.write(str(step))


def resume(ckpt_dir, model, optimizer):
    path = os.path.join(ckpt_dir, "model.pt")
    if not os.path.exists(path):
        return 0
    model.load_state_dict(torch.load(path, map_location="cpu"))
    # optimizer.load_state_dict(torch.load(optim_path, map_location="cpu")): moved onto the params' GPU
    for p in model.parameters():
        optimizer.state[p] = {"step": 1, "exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}
    with open(os.path.join(ckpt_dir, "step.txt")) as f:
        return int(f.read())


def batches():
    while True:
        yield {"input_ids": torch.empty(MICRO_BATCH * SEQ_LEN * 8), "labels": torch.empty(MICRO_BATCH * SEQ_LEN * 8)}


def run_training(ckpt_dir, local_rank):
    model = LlamaForCausalLM()
    ddp_model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=4e-4, betas=(0.9, 0.95), weight_decay=0.1)
    start = resume(ckpt_dir, model, optimizer)
    loader = batches()
    for step in range(start, TOTAL_STEPS):
        batch = next(loader)
        loss = train_step(ddp_model, optimizer, batch)
        log_loss(loss, step)
        if step > 0 and step % CKPT_EVERY == 0:
            save_checkpoint(ckpt_dir, model, step)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    failures = []
    with tempfile.TemporaryDirectory() as ckpt_dir:
        for attempt in range(MAX_INPROC_RESTARTS):
            init_process_group("nccl")
            try:
                run_training(ckpt_dir, local_rank)
                break
            except DistBackendError as err:
                failures.append(err)
                print("attempt %d: NCCL failure (%s), re-forming the process group" % (attempt, err))
                destroy_process_group()
    for err in failures:
        print("recovered from:", err)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
