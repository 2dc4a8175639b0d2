"""A 2.7B GPT pretrained from scratch with DDP on one 8x H100 80GB node; the team's new hand-rolled asynchronous
checkpointer snapshots the model and the AdamW state ON THE GPU and writes them from a background thread.

The real program: torchrun --nproc_per_node=8 pretrain.py, a GPT-Neo-2.7B-shaped model (32 layers, d=2560,
vocab 50304, seq 2048, untied head), fp32 master weights, bf16 autocast, DDP (gradient_as_bucket_view left
False), AdamW, micro-batch 2 x 2048.  A synchronous torch.save of the 31 GiB training state to NFS took 4
minutes and once tripped the NCCL watchdog, so the team wrote AsyncCheckpointer:
    snapshot = {"model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()), "step": step}
    threading.Thread(target=self._write, args=(snapshot, path), daemon=True).start()
"so the copy is a fast device-to-device clone and training goes on while the thread writes".  This is the
smoke run that tests it (ckpt_every=10, accumulation 2).

What happens: steps 0-10 run; at step 10 rank 0's save() clones 10.3 GiB of weights and 20.7 GiB of AdamW
state on the GPU (fine: the gradients were just set to None), starts the writer thread, and the first forward
of step 11 dies with CUDA OOM part-way through its activations while the thread is still writing.

Arithmetic (per GPU, GiB): weights 10.33 + DDP buckets 10.33 (+0.4 rounding) + AdamW 20.67 = 41.7, + grads
10.33 during backward, + activations of a 2 x 2048 micro-batch ~11.5 and logits/log_softmax ~1.9: peak ~66
of 79.6 -> the run itself fits.  The GPU snapshot adds 31.0 GiB that stays alive for the whole write: 41.7 +
0.5 context + 31.0 = 73.2 GiB before step 11 starts, ~6 GiB free, the forward needs ~13.

What an expert says first: stage the snapshot in (pinned) host memory, not on the GPU (v.to("cpu",
non_blocking=True) into preallocated pinned buffers, or torch.distributed.checkpoint.async_save, which stages to
CPU), or block until the writer is done before the next step.  Wrong advice: smaller micro-batch, gradient
checkpointing, autocast (the training step fit for 10 steps and is unchanged), empty_cache or
expandable_segments (the 31 GiB are live tensors), a bigger card.
"""
import copy
import os
import tempfile
import threading
import time

import torch
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import scen_truth

scen_truth.note_every_empty(torch)


class TrainConfig:
    n_layer = 32
    d_model = 2560
    vocab_size = 50304
    seq_len = 2048
    micro_batch_size = 2
    grad_accum_steps = 2        # smoke run (production: 16)
    lr = 1.6e-4
    max_steps = 143000
    ckpt_every = 10             # smoke run: exercise the new async checkpointer (production: 1000)
    ckpt_dir = os.path.join(tempfile.gettempdir(), "gpt2b7-smoke-ckpt")


cfg = TrainConfig()
TOKENS = cfg.micro_batch_size * cfg.seq_len


def saved(out, inp):
    """Autograd keeps inp alive for backward while grad is enabled."""
    if torch.is_grad_enabled():
        out._saved = inp
    return out


class Linear(torch.nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d_in * d_out, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d_out, dtype=torch.float32))
        self.d_out = d_out

    def forward(self, x):
        return saved(torch.empty(TOKENS * self.d_out, dtype=torch.bfloat16), x)


class Norm(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.bias = torch.nn.Parameter(torch.empty(d, dtype=torch.float32))
        self.d = d

    def forward(self, x):
        return saved(torch.empty(TOKENS * self.d, dtype=torch.bfloat16), x)


class DecoderLayer(torch.nn.Module):
    def __init__(self, d):
        super().__init__()
        self.input_norm = Norm(d)
        self.qkv_proj = Linear(d, 3 * d)
        self.out_proj = Linear(d, d)
        self.post_attn_norm = Norm(d)
        self.fc_in = Linear(d, 4 * d)
        self.fc_out = Linear(4 * d, d)
        self.d = d

    def forward(self, x):
        qkv = self.qkv_proj(self.input_norm(x))
        attn = saved(torch.empty(TOKENS * self.d, dtype=torch.bfloat16), qkv)          # flash sdpa
        x = saved(torch.empty(TOKENS * self.d, dtype=torch.float32), self.out_proj(attn))  # residual
        h = self.fc_in(self.post_attn_norm(x))
        h = saved(torch.empty(TOKENS * 4 * self.d, dtype=torch.bfloat16), h)           # gelu
        return saved(torch.empty(TOKENS * self.d, dtype=torch.float32), self.fc_out(h))


class GPT(torch.nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.embed_in = torch.nn.Parameter(torch.empty(c.vocab_size * c.d_model, dtype=torch.float32))
        self.layers = [DecoderLayer(c.d_model) for _ in range(c.n_layer)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.final_norm = Norm(c.d_model)
        self.embed_out = torch.nn.Parameter(torch.empty(c.vocab_size * c.d_model, dtype=torch.float32))

    def forward(self, input_ids, labels):
        x = saved(torch.empty(TOKENS * self.c.d_model, dtype=torch.float32), input_ids)
        for layer in self.layers:
            x = layer(x)
        x = self.final_norm(x)
        logits = saved(torch.empty(TOKENS * self.c.vocab_size, dtype=torch.bfloat16), x)
        return F.nll_loss(F.log_softmax(logits, -1, dtype=torch.float32), labels)

    def state_dict(self):
        """As PyTorch's: every parameter under its dotted name."""
        sd = {"embed_in.weight": self.embed_in, "embed_out.weight": self.embed_out}
        for i, layer in enumerate(self.layers):
            for mod_name, mod in layer._modules.items():
                for p_name, p in mod._parameters.items():
                    sd["layers.%d.%s.%s" % (i, mod_name, p_name)] = p
        for p_name, p in self.final_norm._parameters.items():
            sd["final_norm.%s" % p_name] = p
        return sd


class AsyncCheckpointer(object):
    """Snapshot on the GPU (a fast device-to-device copy), write from a background thread."""

    def __init__(self, ckpt_dir):
        self.ckpt_dir = ckpt_dir
        self._thread = None
        self._pending = None

    def save(self, step, model, optimizer):
        self.wait()                      # at most one save in flight
        with torch.no_grad():
            snapshot = {
                "model": {k: v.detach().clone() for k, v in model.module.state_dict().items()},
                "optimizer": copy.deepcopy(optimizer.state_dict()),
                "step": step,
            }
        self._pending = snapshot
        path = os.path.join(self.ckpt_dir, "step_%07d.pt" % step)
        self._thread = threading.Thread(target=self._write, args=(snapshot, path), daemon=True,
                                        name="ckpt-writer")
        self._thread.start()

    def _write(self, snapshot, path):
        # torch.save(snapshot, path): serializing copies each tensor device-to-host and streams it to NFS
        # (~150 MB/s per rank here); the stand-in writes only the sizes, at that pace
        flat = dict(("model/" + k, v) for k, v in snapshot["model"].items())
        for i, st in snapshot["optimizer"]["state"].items():
            flat["optimizer/%d/exp_avg" % i] = st["exp_avg"]
            flat["optimizer/%d/exp_avg_sq" % i] = st["exp_avg_sq"]
        for name, t in flat.items():
            time.sleep(t.nbytes / 150e6)
        os.makedirs(self.ckpt_dir, exist_ok=True)
        torch.save(flat, path + ".tmp")
        os.replace(path + ".tmp", path)
        self._pending = None

    def wait(self):
        if self._thread is not None:
            self._thread.join()
            self._thread = None


def get_batch():
    x = torch.empty(8 * TOKENS)     # int64 input ids, pinned -> .cuda(non_blocking=True)
    y = torch.empty(8 * TOKENS)
    return x, y


def main():
    rank = int(os.environ.get("RANK", 0))
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)

    model = GPT(cfg)
    model = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.1)
    checkpointer = AsyncCheckpointer(cfg.ckpt_dir) if rank == 0 else None

    for step in range(cfg.max_steps):
        for micro in range(cfg.grad_accum_steps):
            x, y = get_batch()
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model(x, y)
            scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

        if step > 0 and step % cfg.ckpt_every == 0 and checkpointer is not None:
            checkpointer.save(step, model, optimizer)
            print("step %d: checkpoint snapshot taken, writing in background" % step)


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
