"""512k-token needle-in-a-haystack eval with ring attention over 4 ranks, started by the script's own spawn
launcher on a 4x H100 80GB node: no rank ever selects its GPU, so all four land on cuda:0.

The real program (niah_ring.py) shards one 524,288-token haystack over 4 ranks (131,072 tokens each) and runs
the prefill with ring attention (ring-flash-attn's llama3 varlen ring, K/V blocks passed rank to rank):

    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        local_rank = int(os.environ["LOCAL_RANK"])
        model = AutoModelForCausalLM.from_pretrained("meta-llama/Meta-Llama-3.1-8B-Instruct",
                    torch_dtype=torch.bfloat16, attn_implementation="flash_attention_2").to("cuda")
        substitute_hf_flash_attn(process_group, heads_k_stride=4)      # ring attention inside each layer
        shard = scatter_haystack(rank)                                 # rank 0 tokenizes and scatters
        with torch.inference_mode():
            out = model(shard.to("cuda"), use_cache=True)
        ...
    def launch(fn, world_size):                    # the lab's own launcher (no torchrun on this box)
        ctx = mp.get_context("spawn")
        for rank in range(world_size):
            os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size))
            ctx.Process(target=fn, args=(rank, world_size)).start()
        ...

"cuda" is the current device, and nothing sets it: no torch.cuda.set_device(local_rank), no
device=f"cuda:{local_rank}".  (The job never reaches its first NCCL collective, which would have refused
two ranks on one GPU.)  All four ranks put their weights and activations on GPU 0; GPUs 1-3 stay empty.

Sizes (per rank: Llama-3.1-8B bf16 15 GiB + CUDA context 0.5 GiB; one 131,072-token shard):
  * four replicas on GPU 0: 62 GiB;
  * layer 0 of the prefill, per rank: hidden states, RMSNorm output, q and the attention output 1 GiB each
    (131,072 x 4096 x 2 B), local K and V 256 MiB each, the ring's receive buffers for the next block's
    K and V 512 MiB; MLP gate / up / SiLU(gate)*up 3.5 GiB each (131,072 x 14,336 x 2 B);
  * ranks 1-3 are ahead (rank 0 tokenized and scattered the haystack) and wait in layer 0's ring exchange
    for rank 0's K/V block, holding ~4 GiB of activations each (hidden states, q, K/V, the local attention
    output, the receive buffers): 19.5 GiB per rank with weights and context; rank 0 gets to the MLP of
    layer 0 with 18.5 GiB of its own and fails on a 3.5 GiB intermediate (the gate projection's output)
    with 2.2 GiB free of 80.
On its own H100 a rank peaks at ~15 GiB of weights + 16 GiB of KV cache for its shard + ~12 GiB of
prefill transients: ~45 GiB of 80.  Exit status 1: the launcher stops the other ranks and re-raises.

What an expert says first: the other processes on GPU 0 are this job's own ranks (same launcher, RANK
1-3) and GPUs 1-3 are idle -- call torch.cuda.set_device(local_rank) (or load to f"cuda:{local_rank}")
before anything touches CUDA.  Wrong advice: stopping "the other processes" (they are the job), a
smaller batch or shorter haystack, quantization, expandable_segments / empty_cache (nothing is cached),
a bigger GPU, sharding (ZeRO/FSDP) -- each rank fits on its own card.
"""
import multiprocessing as mp
import multiprocessing.connection
import os
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

MODEL_ID = "meta-llama/Meta-Llama-3.1-8B-Instruct"
HIDDEN = 4096
INTERMEDIATE = 14336
NUM_LAYERS = 32
KV_DIM = 8 * 128
VOCAB = 128256
HAYSTACK_TOKENS = 524288
WORLD_SIZE = 4
MASTER_PORT = "29511"


class ModuleList(nn.Module):
    """torch.nn.ModuleList (the stand-in torch has none)."""

    def __init__(self, modules):
        nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(self._modules.values())


class RingComm(object):
    """ring-flash-attn's RingComm as far as the stand-in needs it: send_recv of the next K/V block.  The
    receive of a rank whose predecessor has not sent waits (a multiprocessing barrier here: nobody passes
    it before every rank arrived)."""

    def __init__(self, rank, world_size, ring_barrier, ahead):
        self.rank, self.world_size = rank, world_size
        self._barrier, self._ahead = ring_barrier, ahead

    def wait_for_scatter(self):
        """Rank 0 tokenized and scattered the haystack: it starts its own shard last (the stand-in lets the
        other ranks reach their first exchange first, as they did on the node)."""
        if self.rank == 0:
            for _ in range(self.world_size - 1):
                self._ahead.acquire()

    def send_recv(self, k, v):
        recv_k = torch.empty(k.nbytes // 2, dtype=torch.bfloat16, device="cuda")
        recv_v = torch.empty(v.nbytes // 2, dtype=torch.bfloat16, device="cuda")
        if self.rank != 0:
            self._ahead.release()
        self._barrier.wait()
        return recv_k, recv_v


def bf16_weight(numel):
    return nn.Parameter(torch.empty(numel, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


class LlamaDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.q_proj = bf16_weight(HIDDEN * HIDDEN)
        self.k_proj = bf16_weight(HIDDEN * KV_DIM)
        self.v_proj = bf16_weight(HIDDEN * KV_DIM)
        self.o_proj = bf16_weight(HIDDEN * HIDDEN)
        self.gate_proj = bf16_weight(HIDDEN * INTERMEDIATE)
        self.up_proj = bf16_weight(HIDDEN * INTERMEDIATE)
        self.down_proj = bf16_weight(INTERMEDIATE * HIDDEN)
        self.ring = None

    def forward(self, hidden_states, tokens):
        residual = hidden_states
        x = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")        # input_layernorm
        q = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(tokens * KV_DIM, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(tokens * KV_DIM, dtype=torch.bfloat16, device="cuda")
        del x
        # ring attention: the local block first, then the blocks passed around the ring
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        if self.ring.rank != 0:                  # causal, contiguous shards: rank 0 needs no other rank's K/V
            for _step in range(self.ring.rank):
                k_next, v_next = self.ring.send_recv(k, v)
        del q
        h = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")        # o_proj
        del out
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")   # residual + h
        del h, residual
        x = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")        # post_attention_layernorm
        gate = torch.empty(tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        up = torch.empty(tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")
        act = torch.empty(tokens * INTERMEDIATE, dtype=torch.bfloat16, device="cuda")  # act_fn(gate) * up
        del gate, up, x
        down = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del act
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        self.ring.send_recv(k, v)               # pass this rank's K/V on for the next ranks
        return out


class LlamaForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = bf16_weight(VOCAB * HIDDEN)
        self.layers = ModuleList([LlamaDecoderLayer() for _ in range(NUM_LAYERS)])
        self.norm = bf16_weight(HIDDEN)
        self.lm_head = bf16_weight(HIDDEN * VOCAB)

    def forward(self, input_ids):
        tokens = input_ids.nbytes // 8
        hidden_states = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")   # embed_tokens
        for layer in self.layers:
            hidden_states = layer(hidden_states, tokens)
        return torch.empty(VOCAB, dtype=torch.float32, device="cuda")       # logits of the last position


def substitute_ring_flash_attn(model, comm):
    for layer in model.layers:
        layer.ring = comm


def run(rank, world_size, ring_barrier, ahead):
    # dist.init_process_group("nccl", rank=rank, world_size=world_size)
    local_rank = int(os.environ["LOCAL_RANK"])
    comm = RingComm(rank, world_size, ring_barrier, ahead)
    model = LlamaForCausalLM()                 # from_pretrained(..., torch_dtype=torch.bfloat16).to("cuda")
    substitute_ring_flash_attn(model, comm)
    model.eval()
    comm.wait_for_scatter()
    shard_tokens = HAYSTACK_TOKENS // world_size
    with torch.inference_mode():
        input_ids = torch.empty(shard_tokens * 8, device="cuda")          # this rank's shard, int64 ids
        out = model(input_ids)
    print("rank %d (local %d) done" % (rank, local_rank), flush=True)
    return out


def _worker(fn, rank, world_size, ring_barrier, ahead):
    try:
        fn(rank, world_size, ring_barrier, ahead)
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise


class ProcessRaisedException(Exception):
    pass


def launch(fn, world_size):
    ctx = mp.get_context("spawn")
    ring_barrier = ctx.Barrier(world_size)
    ahead = ctx.Semaphore(0)
    procs = []
    for rank in range(world_size):
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=MASTER_PORT)
        p = ctx.Process(target=_worker, args=(fn, rank, world_size, ring_barrier, ahead), daemon=False)
        p.start()
        procs.append(p)
    alive = list(procs)
    while alive:
        ready = multiprocessing.connection.wait([p.sentinel for p in alive])
        for p in [p for p in alive if p.sentinel in ready]:
            p.join()
            alive.remove(p)
            if p.exitcode != 0:
                for q in alive:
                    q.terminate()
                for q in alive:
                    q.join()
                raise ProcessRaisedException("process %d terminated with exit code %d"
                                             % (procs.index(p), p.exitcode))


if __name__ == "__main__":
    launch(run, WORLD_SIZE)
