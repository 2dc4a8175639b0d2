"""train.py -- an applied-ML team fine-tunes OPT-1.3B (fp32 weights, bf16 autocast, AdamW, DDP) on support
transcripts.  For a year the job ran on GCP a2-highgpu-4g machines (4x A100 40GB) at about 35 GiB per GPU.
This week the quota came through for a2-highgpu-8g (8x A100 40GB) and they launch the same code with

    torchrun --nproc_per_node=8 train.py --config configs/opt13b_sft.yaml

The GPU selection in train.py dates from the 4-GPU machines:

    GPUS_PER_NODE = 4                                   # cluster.yaml, written for a2-highgpu-4g
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank % GPUS_PER_NODE)
    dist.init_process_group("nccl")
    model = OPTForCausalLM.from_pretrained("facebook/opt-1.3b").cuda()
    model = DDP(model, device_ids=[rank % GPUS_PER_NODE])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    for batch in loader:                                # 2 x 2048 tokens per rank
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward()
        ...

On 8 GPUs, ranks 0-3 take GPUs 0-3 and ranks 4-7 take GPUs 0-3 again: two ranks on each of the first four
GPUs, nothing at all on GPUs 4-7.  Loading and wrapping fit (two copies of weights + DDP buckets, 21 GiB per
GPU); in the first forward, rank 5 runs out of memory on GPU 1 while rank 1, on the same GPU, holds its
weights, buckets and a whole forward pass of activations.  torchrun then stops the other seven ranks.

An expert: the ranks are mapped to GPUs with a hard-coded 4; map each rank to its own GPU with the local rank
the launcher gives: torch.cuda.set_device(int(os.environ["LOCAL_RANK"])) (or rank % torch.cuda.device_count()),
and device_ids=[local_rank].  Then every rank has a 40 GB card to itself, as on the old machines.
Wrong first advice: launching fewer ranks (the machine has the 8 GPUs for the 8 ranks), a smaller batch,
gradient checkpointing, ZeRO/FSDP, gradient_as_bucket_view (each squeezes two ranks onto one card and leaves
four cards idle), stopping the other process on GPU 1 (it is rank 1 of this job), a bigger GPU,
expandable_segments / empty_cache (nothing is fragmented or cached to speak of).

(The stand-in: started without RANK, this file plays torchrun -- it starts the eight ranks as children with
torchrun's environment, waits, and stops them all when one fails.  The ranks' memory is shared through the
simulator's state directory; file markers order the ranks the way this run went: rank 1's forward ran
before rank 5's, ranks 4, 6 and 7 were still waiting for their first batch.)
"""
import os
import subprocess
import sys
import time

NPROC = 8
CONFIG = "configs/opt13b_sft.yaml"


def torchrun():
    """torchrun --nproc_per_node=8 train.py --config ... (torch.distributed.run, LocalElasticAgent): one child
    per rank with the elastic environment; when a child fails the agent stops the others and exits 1."""
    import tempfile
    sync = tempfile.mkdtemp(prefix="opt13b-ranks-")
    run_id = "f3a9c1d2-opt13b-sft"
    procs = []
    for r in range(NPROC):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(NPROC), LOCAL_WORLD_SIZE=str(NPROC),
                   GROUP_RANK="0", ROLE_RANK=str(r), ROLE_WORLD_SIZE=str(NPROC), MASTER_ADDR="127.0.0.1",
                   MASTER_PORT="29500", TORCHELASTIC_RUN_ID=run_id, TORCHELASTIC_RESTART_COUNT="0",
                   TORCHELASTIC_MAX_RESTARTS="0", OMP_NUM_THREADS="1", RANK_SYNC_DIR=sync)
        procs.append(subprocess.Popen([sys.executable, "-u", os.path.abspath(__file__), "--config", CONFIG], env=env))
    failed = None
    deadline = time.time() + 90
    while failed is None and time.time() < deadline:
        for r, p in enumerate(procs):
            rc = p.poll()
            if rc is not None and rc != 0:
                failed = (r, rc)
                break
        if all(p.poll() == 0 for p in procs):
            break
        time.sleep(0.05)
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        p.wait()
    import shutil
    shutil.rmtree(sync, ignore_errors=True)
    if failed is not None:
        sys.stderr.write("torch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n"
                         "train.py FAILED\n  rank      : %d (local_rank: %d)\n  exitcode  : %d\n"
                         % (failed[0], failed[0], failed[1]))
        return 1
    return 0


if "RANK" not in os.environ:
    sys.exit(torchrun())

# ------------------------------------------------------------------ one rank: train.py
import torch  # noqa: E402

import scen_truth  # noqa: E402

scen_truth.note_every_empty(torch)

F32, BF16 = torch.float32, torch.bfloat16
SYNC = os.environ["RANK_SYNC_DIR"]


def _mark(name):
    open(os.path.join(SYNC, name), "w").close()


def _wait(name, timeout=60):
    """(stand-in: the order of this run's events across ranks)"""
    t = time.time() + timeout
    while not os.path.exists(os.path.join(SYNC, name)):
        if time.time() > t:
            sys.exit(0)
        time.sleep(0.02)


# ---- stand-in gap: torch.distributed as far as this job uses it (init_process_group's rendezvous as a barrier)
import types  # noqa: E402

dist = types.ModuleType("torch.distributed")


def _init_process_group(backend="nccl", **kw):
    _mark("joined.%s" % os.environ["RANK"])
    for r in range(NPROC):
        _wait("joined.%d" % r)


def _barrier():
    _mark("barrier.%s" % os.environ["RANK"])
    for r in range(NPROC):
        _wait("barrier.%d" % r)


dist.init_process_group = _init_process_group
dist.barrier = _barrier
dist.get_rank = lambda: int(os.environ["RANK"])
dist.get_world_size = lambda: int(os.environ["WORLD_SIZE"])
torch.distributed = dist
sys.modules["torch.distributed"] = dist
# ----


class OPTConfig(object):
    vocab_size = 50272
    hidden_size = 2048
    ffn_dim = 8192
    num_hidden_layers = 24
    num_attention_heads = 32
    max_position_embeddings = 2048


def _param(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=F32, device="cuda"))


class Linear(torch.nn.Module):
    def __init__(self, i, o):
        torch.nn.Module.__init__(self)
        self.weight = _param(i * o)
        self.bias = _param(o)


class LayerNorm(Linear):
    def __init__(self, n):
        torch.nn.Module.__init__(self)
        self.weight = _param(n)
        self.bias = _param(n)


class OPTDecoderLayer(torch.nn.Module):
    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        h = cfg.hidden_size
        self.self_attn = torch.nn.Module()
        for p in ("k_proj", "v_proj", "q_proj", "out_proj"):
            setattr(self.self_attn, p, Linear(h, h))
        self.self_attn_layer_norm = LayerNorm(h)
        self.fc1 = Linear(h, cfg.ffn_dim)
        self.fc2 = Linear(cfg.ffn_dim, h)
        self.final_layer_norm = LayerNorm(h)


class OPTForCausalLM(torch.nn.Module):
    """lm_head tied to embed_tokens, as in the hub checkpoint."""

    def __init__(self, cfg):
        torch.nn.Module.__init__(self)
        self.config = cfg
        h = cfg.hidden_size
        self.model = torch.nn.Module()
        self.model.decoder = torch.nn.Module()
        dec = self.model.decoder
        dec.embed_tokens = torch.nn.Module()
        dec.embed_tokens.weight = _param(cfg.vocab_size * h)
        dec.embed_positions = torch.nn.Module()
        dec.embed_positions.weight = _param((cfg.max_position_embeddings + 2) * h)
        dec.final_layer_norm = LayerNorm(h)
        dec.layers = torch.nn.Module()
        for i in range(cfg.num_hidden_layers):
            setattr(dec.layers, str(i), OPTDecoderLayer(cfg))

    @classmethod
    def from_pretrained(cls, name):
        return cls(OPTConfig())

    def cuda(self, device=None):
        return self

    def forward(self, input_ids=None, labels=None, tokens=0):
        """HF's OPTForCausalLM.forward under bf16 autocast, sdpa attention, dropout 0.1: the bf16 weight
        casts autocast keeps for the pass, each layer's saved activations (layer norms come out in float32),
        the logits, the shifted copy and the float32 log_softmax of the loss."""
        cfg = self.config
        h = cfg.hidden_size
        saved = []

        def act(numel, dtype=BF16):
            t = torch.empty(numel, dtype=dtype, device=torch.cuda.current_device())
            saved.append(t)
            return t

        s = tokens
        for layer_i in range(cfg.num_hidden_layers):
            for _ in range(4):
                act(h * h)                     # bf16 casts of q/k/v/out_proj weights (autocast cache)
            act(h * cfg.ffn_dim)               # fc1 weight cast
            act(h * cfg.ffn_dim)               # fc2 weight cast
            act(s * h, F32)                    # self_attn_layer_norm
            act(3 * s * h)                     # q, k, v
            act(s * h)                         # sdpa output
            act(s * h)                         # out_proj
            act(s * h, torch.uint8)            # dropout mask
            act(s * h, F32)                    # residual
            act(s * h, F32)                    # final_layer_norm
            act(s * cfg.ffn_dim)               # fc1
            act(s * cfg.ffn_dim)               # relu
            act(s * h)                         # fc2
            act(s * h, torch.uint8)            # dropout mask
            act(s * h, F32)                    # residual
        act(cfg.vocab_size * h)                # lm_head weight cast
        act(s * cfg.vocab_size)                # logits
        act((s - 1) * cfg.vocab_size)          # shift_logits.contiguous()
        act((s - 1) * cfg.vocab_size, F32)     # log_softmax (cross_entropy autocasts to float32)
        loss = torch.empty(4, device=torch.cuda.current_device())
        loss._saved_acts = saved
        return loss


class _Batch(object):
    def __init__(self, tokens):
        self.tokens = tokens


def main():
    GPUS_PER_NODE = 4                                   # cluster.yaml, written for a2-highgpu-4g
    rank = int(os.environ["RANK"])
    torch.cuda.set_device(rank % GPUS_PER_NODE)
    dist.init_process_group("nccl")
    model = OPTForCausalLM.from_pretrained("facebook/opt-1.3b").cuda()
    model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank % GPUS_PER_NODE])
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.0)
    dist.barrier()                                      # DDP's constructor broadcasts rank 0's weights
    print("rank %d on cuda:%d: %.1f GiB allocated after DDP" % (
        rank, torch.cuda.current_device(), torch.cuda.memory_allocated() / 2 ** 30), flush=True)
    # (stand-in: this run's order -- rank 1 got its first batch before rank 5; 4, 6, 7 were still waiting)
    if rank == 5:
        _wait("forward_done.1")
    elif rank >= 4:
        _wait("never", timeout=60)
    model.train()
    for step in range(3):
        batch = _Batch(tokens=2 * 2048)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=batch, labels=batch, tokens=batch.tokens)
        _mark("forward_done.%d" % rank)
        _wait("never", timeout=60)                      # loss.backward(): the all-reduce waits for every rank


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(torch.cuda.current_device())
    raise
sys.exit(0)
