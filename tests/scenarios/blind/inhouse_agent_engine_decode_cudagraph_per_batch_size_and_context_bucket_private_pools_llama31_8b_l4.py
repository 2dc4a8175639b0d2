"""engine/runner.py -- a startup's own LLM engine behind its customer-support agent (tool calls to the
order, refund and shipping APIs), written because vLLM's wheels did not fit their base image:
Llama-3.1-8B-Instruct in bf16 (14.96 GiB) on one NVIDIA L4 (24 GB; 23034 MiB as nvidia-smi shows it), a
paged KV cache preallocated at start (2560 blocks of 16 tokens: 5.0 GiB), continuous batching by their own
scheduler (up to 48 sequences; a sequence that emits a tool call leaves the batch until the tool's result
is prefilled), eager chunked prefill (2048 tokens a chunk).  To cut the launch overhead of the decode
step they capture it in CUDA graphs -- the whole step, sampling included -- keyed by what the kernels'
static shapes depend on: the batch size and the block-table width (the longest sequence in the batch,
rounded up to 128, 256, 512 or 1024 blocks):

    key = (len(batch), table_bucket(max_blocks))
    if key not in self.graphs:
        g = torch.cuda.CUDAGraph()
        static = self._make_static_inputs(*key)
        self._decode_step(static)                          # warm-up
        with torch.cuda.graph(g):                          # no pool= argument
            static.next_tokens = self._decode_step(static) # logits (fp32), top-p sampling, next tokens
        self.graphs[key] = (g, static)
    g, static = self.graphs[key]; ...; g.replay()

In the load test (a fixed batch of 32) it captured four graphs.  In production the batch size changes
with every tool call and every (batch, bucket) pair gets its own graph, each with its own private memory
pool (torch.cuda.graph without pool= makes a new one): the logits, probabilities, sorted probabilities
and int64 indices of every capture stay reserved for that graph's replays.  75 minutes into the lunch
peak, 33 graphs hold 1.85 GiB of private pools, 1.6 GiB of it in blocks no live tensor uses (kept for
replays), and an ordinary eager prefill chunk (gate_up_proj output: 2048 x 28672 bf16, 112 MiB) fails
with 56 MiB free on the card; PyTorch's default pool has under 0.1 GiB cached.

An expert: the graph pools are the memory, and they grow with the number of distinct shapes, not with
traffic.  Capture a fixed set of batch sizes (1, 2, 4, 8, 16, 24, 32, 40, 48) and pad each batch up to
the next one, one block-table width (or a few) with the real lengths in static tensors, and capture all
of them at start, largest first, into one shared pool (pool=torch.cuda.graph_pool_handle(), as vLLM
does): then the graphs cost about one pool plus their static outputs, a few hundred MiB known at start.
Wrong first advice: torch.cuda.empty_cache() (it does not release graph-private pools; the allocator
already gave back every free block it could before raising), expandable_segments (the pools' memory is
reserved for replays, not fragmented), a smaller KV cache (room made by cutting concurrency, taken again
by the next new shapes), a smaller batch or shorter sequences (the cost is the number of captures),
quantizing the weights, stopping other processes (there are none), a bigger GPU (the same growth on any
card, only later), restarting the engine (the same graphs come back within the hour).
"""
import random
import sys
import threading

import torch

import scen_truth

# ---- stand-in gaps: torch.cuda.CUDAGraph, torch.cuda.graph (the capture context) and
# torch.cuda.graph_pool_handle, as PyTorch's: inside `with torch.cuda.graph(g, pool=None)` every
# allocation comes from the graph's private pool (a new one unless pool= names one); the pool keeps
# its memory while the graph lives.  Also torch.cat.  Compiled as part of torch's file so that the
# failing line of the program stays the program's own.
_GAPS = """
import threading as _th
_capture = _th.local()
_next_pool = [0]
_plain_empty = torch.empty

def graph_pool_handle():
    _next_pool[0] += 1
    return (1, _next_pool[0])

class CUDAGraph(object):
    def __init__(self):
        self.pool_id = None
    def replay(self):
        pass
    def pool(self):
        return self.pool_id

class graph(object):
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph
        self.pool = pool if pool is not None else graph_pool_handle()
    def __enter__(self):
        self.cuda_graph.pool_id = self.pool
        _capture.pool = self.pool
        return self
    def __exit__(self, *exc):
        _capture.pool = None
        return False

def empty(n, dtype=None, device=None, pool_id=(0, 0)):
    p = getattr(_capture, "pool", None)
    return _plain_empty(n, dtype=dtype, device=device, pool_id=p if p is not None else pool_id)
"""
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
if not hasattr(torch.cuda, "CUDAGraph"):
    torch.cuda.CUDAGraph = _ns["CUDAGraph"]
    torch.cuda.graph = _ns["graph"]
    torch.cuda.graph_pool_handle = _ns["graph_pool_handle"]
    torch.empty = _ns["empty"]
# ----
scen_truth.note_every_empty(torch)

HIDDEN, INTER, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB = 4096, 14336, 32, 32, 8, 128, 128256
BLOCK_SIZE, NUM_BLOCKS, MAX_NUM_SEQS, PREFILL_CHUNK, MAX_MODEL_LEN = 16, 2560, 48, 2048, 16384
TABLE_BUCKETS = (128, 256, 512, 1024)


def _weight(n):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.bfloat16, device="cuda"), requires_grad=False)


def _act(n, dtype=torch.bfloat16):
    return torch.empty(n, dtype=dtype, device="cuda")


class LlamaModel(torch.nn.Module):
    """Fused projections, as the engine loads them: qkv_proj and gate_up_proj."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _weight(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = torch.nn.Module()
            for name, n in (("qkv_proj", HIDDEN * (HEADS + 2 * KV_HEADS) * HEAD_DIM), ("o_proj", HIDDEN * HIDDEN),
                            ("gate_up_proj", HIDDEN * 2 * INTER), ("down_proj", INTER * HIDDEN),
                            ("input_layernorm", HIDDEN), ("post_attention_layernorm", HIDDEN)):
                setattr(layer, name, _weight(n))
            setattr(self, "layer_%d" % i, layer)
            self.layers.append(layer)
        self.norm = _weight(HIDDEN)
        self.lm_head = _weight(HIDDEN * VOCAB)


class Static(object):
    pass


class ModelRunner(object):
    def __init__(self):
        self.model = LlamaModel()
        # paged KV cache: per layer [2, num_blocks, block_size, kv_heads, head_dim] bf16
        self.kv_cache = [_act(2 * NUM_BLOCKS * BLOCK_SIZE * KV_HEADS * HEAD_DIM) for _ in range(LAYERS)]
        self.graphs = {}

    # -- the decode step, as captured: every layer's temporaries, then logits, sampling
    def _decode_step(self, st):
        bs, splits = st.bs, st.table // 16            # split-K paged attention: one split per 256 tokens
        hidden = _act(bs * HIDDEN)
        for _ in range(LAYERS):
            qkv = _act(bs * (HEADS + 2 * KV_HEADS) * HEAD_DIM)
            partial = _act(bs * HEADS * splits * HEAD_DIM, torch.float32)   # flash-decoding partial outputs
            attn = _act(bs * HEADS * HEAD_DIM)
            del qkv, partial
            gate_up = _act(bs * 2 * INTER)
            del attn
            inter = _act(bs * INTER)                  # SiluAndMul
            del gate_up
            hidden = _act(bs * HIDDEN)                # down_proj + residual
            del inter
        hidden = _act(bs * HIDDEN)                    # norm
        st.logits = _act(bs * VOCAB, torch.float32)   # lm_head(...).float(): kept (the server logs logprobs)
        probs = _act(bs * VOCAB, torch.float32)       # softmax(logits / temperature)
        sorted_probs = _act(bs * VOCAB, torch.float32)
        sorted_idx = _act(bs * VOCAB, torch.float64)  # int64 indices of torch.sort
        cumsum = _act(bs * VOCAB, torch.float32)
        del cumsum, sorted_probs
        next_tokens = _act(bs, torch.float64)         # torch.multinomial(...) -> int64
        del probs, sorted_idx, hidden
        return next_tokens

    def _make_static_inputs(self, bs, table):
        st = Static()
        st.bs, st.table = bs, table
        st.input_ids = _act(bs, torch.float64)
        st.positions = _act(bs, torch.float64)
        st.block_table = _act(bs * table, torch.float32)   # int32
        st.seq_lens = _act(bs, torch.float32)
        return st

    def decode(self, batch):
        max_blocks = max((n + BLOCK_SIZE - 1) // BLOCK_SIZE for n in batch)
        key = (len(batch), next(b for b in TABLE_BUCKETS if b >= max_blocks))
        if key not in self.graphs:
            g = torch.cuda.CUDAGraph()
            static = self._make_static_inputs(*key)
            self._decode_step(static)                 # warm-up (side stream), outside the capture
            with torch.cuda.graph(g):                 # no pool= argument
                static.next_tokens = self._decode_step(static)
            self.graphs[key] = (g, static)
        g, static = self.graphs[key]
        g.replay()
        return static.next_tokens

    def prefill(self, n_tokens):
        """Eager, chunked: the KV goes into the preallocated pages; the temporaries are freed."""
        done = 0
        while done < n_tokens:
            n = min(PREFILL_CHUNK, n_tokens - done)
            hidden = _act(n * HIDDEN)
            for _ in range(LAYERS):
                qkv = _act(n * (HEADS + 2 * KV_HEADS) * HEAD_DIM)
                attn = _act(n * HEADS * HEAD_DIM)     # flash-attention varlen over the pages
                del qkv
                gate_up = _act(n * 2 * INTER)
                del attn
                inter = _act(n * INTER)
                del gate_up
                hidden = _act(n * HIDDEN)
                del inter
            last = _act(HIDDEN)
            logits = _act(VOCAB, torch.float32)      # the last position's only
            del hidden, last, logits
            done += n


def serve():
    runner = ModelRunner()
    print("engine ready: weights + KV pages; %d graphs" % len(runner.graphs))
    rng = random.Random(20241113)
    running = []            # context lengths of the conversations in the decode batch
    on_tool = []            # [context, minutes until the tool's result] of conversations waiting on a tool
    minute = 0
    with torch.inference_mode():
        while True:
            minute += 1
            # new conversations (system prompt + tool schemas + the customer's message, prefilled whole);
            # the lunch peak ramps up from 11:30
            target = min(MAX_NUM_SEQS, 6 + minute // 3)
            while len(running) + len(on_tool) < target:
                ctx = rng.choice((2900, 3300, 4100))
                runner.prefill(ctx)
                running.append(ctx)
            # tool results come back (order status, refund policy, tracking): prefill the result only
            back = [c for c in on_tool if c[1] <= 0]
            on_tool = [[c[0], c[1] - 1] for c in on_tool if c[1] > 0]
            for ctx, _ in back:
                n = rng.choice((180, 420, 900, 1700, 3600))
                runner.prefill(n)
                running.append(ctx + n)
            # decode; a sequence that emits a tool call leaves the batch until its result is back,
            # one that answers the customer (or reaches 12k tokens) finishes
            for _ in range(8):
                if not running:
                    break
                running = [n + 24 for n in running]
                runner.decode(running)
                for i in range(len(running) - 1, -1, -1):
                    if running[i] >= MAX_MODEL_LEN - 1024:
                        running.pop(i)                # handed over to a human agent
                    elif rng.random() < 0.02:
                        ctx = running.pop(i)
                        if rng.random() < 0.75 and ctx < 12000:
                            on_tool.append([ctx, rng.randint(0, 1)])
            if minute % 15 == 0:
                private = sum(s["total_size"] for s in torch.cuda.memory._snapshot()["segments"]
                              if s["segment_pool_id"] != (0, 0))
                print("t+%d min: %d running, %d waiting on tools, %d graphs, graph pools %.2f GiB" % (
                    minute, len(running), len(on_tool), len(runner.graphs), private / 2.0 ** 30))


try:
    serve()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
