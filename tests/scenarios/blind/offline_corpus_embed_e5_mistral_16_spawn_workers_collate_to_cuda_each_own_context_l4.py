"""Offline embedding of a 30M-passage corpus with e5-mistral-7b-instruct: the DataLoader's collate_fn
moves each tokenized batch to the GPU, so each of the 16 spawned workers (num_workers=os.cpu_count())
creates its own CUDA context and caching allocator on the card; with the 7B model loaded, the first
forward has ~0.7 GiB left and fails in its first layer (NVIDIA L4 24 GB, AWS g6.4xlarge).

The real script (embed_corpus.py, a batch job on one L4):

    model = AutoModel.from_pretrained("intfloat/e5-mistral-7b-instruct", torch_dtype=torch.float16).cuda().eval()
    tok = AutoTokenizer.from_pretrained("intfloat/e5-mistral-7b-instruct")

    def collate_to_cuda(rows):                     # "overlap tokenization and H2D copies with compute"
        enc = tok([r["text"] for r in rows], max_length=512, truncation=True, padding=True,
                  return_tensors="pt")
        return {k: v.to("cuda", non_blocking=True) for k, v in enc.items()}

    loader = DataLoader(corpus, batch_size=64, num_workers=os.cpu_count(), prefetch_factor=2,
                        collate_fn=collate_to_cuda,
                        multiprocessing_context="spawn", persistent_workers=True)
        # "spawn" because fork gave "Cannot re-initialize CUDA in forked subprocess"
    with torch.inference_mode():
        for batch in loader:
            emb = last_token_pool(model(**batch).last_hidden_state, batch["attention_mask"])
            write_shard(F.normalize(emb, dim=-1).cpu())

The stand-in torch has no torch.utils.data: ShardLoader below does what that DataLoader does, with
spawned processes that run collate_to_cuda and hold their prefetched batches on the GPU (a CUDA tensor
sent to another process stays owned by its producer until the consumer drops it).  In the real job the
sixteen workers are up within a second of each other, before the first forward; the stand-in waits for
every worker's first batch so that the order is fixed.

Sizes (L4: 23034 MiB = 22.49 GiB):
  main process: CUDA context 0.5 GiB + e5-mistral fp16 weights (7.11 B params) 13.24 GiB
  each worker: its own CUDA context ~0.5 GiB + a 2 MiB cache segment for its prefetched batches
    (2 x 64 x 512 int64 ids + mask = 1 MiB)                            -> 16 x 514 MiB = 8.0 GiB
  free for the forward: ~0.72 GiB
  first forward, batch 64 x 512 = 32,768 tokens under inference_mode: embeddings 256 MiB, normed
    256 MiB, then the fused q/k/v output (384 MiB) of layer 0 fails with 94 MiB free; one layer's
    temporaries need ~3.2 GiB at their peak (MLP gate/up/act 896 MiB each).
  Without CUDA in the workers the same forward has ~8.7 GiB free and runs.

What an expert says first: the DataLoader workers are on the GPU -- sixteen child processes of this job
each hold a CUDA context (nvidia-smi lists 17 python processes); keep CUDA out of the workers (collate on
the CPU, pin_memory=True, move the batch to the GPU in the main loop), or at least far fewer workers.
Wrong advice: killing "other processes" as if they were foreign (they are this job's own workers and
come back at the next run), a smaller batch or quantization as the fix (the 8 GiB of worker contexts
stays), expandable_segments / empty_cache (nothing is cached), mixed precision or inference_mode
(already fp16 under inference_mode), a bigger GPU.
"""
import multiprocessing
import queue
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30


def _report_oom_truth(tp, value, tb):
    if issubclass(tp, torch.cuda.OutOfMemoryError):
        scen_truth.torch_oom_mark()
    sys.__excepthook__(tp, value, tb)


sys.excepthook = _report_oom_truth

VOCAB = 32000
HIDDEN = 4096
INTERMEDIATE = 14336
LAYERS = 32
KV_DIM = 8 * 128
BATCH_SIZE = 64
MAX_LENGTH = 512
NUM_WORKERS = 16            # os.cpu_count() on the g6.4xlarge
PREFETCH_FACTOR = 2
CORPUS_PASSAGES = 30_000_000


def collate_to_cuda(rows):
    """tok(texts, max_length=512, truncation=True, padding=True, return_tensors="pt") moved to the GPU:
    int64 input_ids and attention_mask (the stand-in's tensors are sized in bytes)."""
    seq = MAX_LENGTH
    return {"input_ids": torch.empty(len(rows) * seq * 8, device="cuda"),
            "attention_mask": torch.empty(len(rows) * seq * 8, device="cuda"),
            "rows": len(rows), "seq": seq}


def read_rows(batch_idx):
    start = batch_idx * BATCH_SIZE
    return [{"id": start + i, "text": "passage %d" % (start + i)} for i in range(BATCH_SIZE)]


def _worker_loop(worker_id, index_queue, data_queue, done_event):
    """What torch.utils.data._utils.worker._worker_loop does: fetch, collate, send; a CUDA batch stays in
    this process until the main process has used it."""
    in_flight = {}
    while not done_event.is_set():
        try:
            batch_idx = index_queue.get(timeout=0.1)
        except queue.Empty:
            continue
        if batch_idx is None:
            break
        in_flight[batch_idx] = collate_to_cuda(read_rows(batch_idx))
        if len(in_flight) > PREFETCH_FACTOR:          # the consumer is done with the oldest one
            del in_flight[min(in_flight)]
        data_queue.put((batch_idx, worker_id, in_flight[batch_idx]["rows"], in_flight[batch_idx]["seq"]))


class ShardLoader(object):
    """DataLoader(corpus, batch_size=64, num_workers=16, prefetch_factor=2, collate_fn=collate_to_cuda,
    multiprocessing_context="spawn", persistent_workers=True)."""

    def __init__(self, num_batches, num_workers, prefetch_factor):
        self.num_batches = num_batches
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        ctx = multiprocessing.get_context("spawn")
        self._done = ctx.Event()
        self._data_queue = ctx.Queue()
        self._index_queues = []
        self._workers = []
        for w in range(num_workers):
            iq = ctx.Queue()
            p = ctx.Process(target=_worker_loop, args=(w, iq, self._data_queue, self._done), daemon=True)
            p.start()
            self._index_queues.append(iq)
            self._workers.append(p)

    def __iter__(self):
        sent = 0
        for _ in range(self.num_workers * self.prefetch_factor):
            self._index_queues[sent % self.num_workers].put(sent)
            sent += 1
        ready = {}
        started = set()
        while len(started) < self.num_workers:     # every worker's first batch (see the docstring)
            idx, worker_id, rows, seq = self._data_queue.get()
            ready[idx] = (rows, seq)
            started.add(worker_id)
        for idx in range(self.num_batches):
            while idx not in ready:
                got, worker_id, rows, seq = self._data_queue.get()
                ready[got] = (rows, seq)
            rows, seq = ready.pop(idx)
            if sent < self.num_batches:
                self._index_queues[sent % self.num_workers].put(sent)
                sent += 1
            # the CUDA tensors the worker sent (opened in this process through CUDA IPC)
            yield {"input_ids": torch.empty(rows * seq * 8, device="cuda"),
                   "attention_mask": torch.empty(rows * seq * 8, device="cuda"), "rows": rows, "seq": seq}


def _fp16(numel):
    return torch.nn.Parameter(torch.empty(numel, dtype=torch.float16, device="cuda"), requires_grad=False)


class MistralDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.q_proj = _fp16(HIDDEN * HIDDEN)
        self.k_proj = _fp16(HIDDEN * KV_DIM)
        self.v_proj = _fp16(HIDDEN * KV_DIM)
        self.o_proj = _fp16(HIDDEN * HIDDEN)
        self.gate_proj = _fp16(HIDDEN * INTERMEDIATE)
        self.up_proj = _fp16(HIDDEN * INTERMEDIATE)
        self.down_proj = _fp16(INTERMEDIATE * HIDDEN)
        self.input_layernorm = _fp16(HIDDEN)
        self.post_attention_layernorm = _fp16(HIDDEN)

    def forward(self, hidden, tokens):
        normed = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")
        qkv = torch.empty(tokens * (HIDDEN + 2 * KV_DIM), dtype=torch.float16, device="cuda")
        attn = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")
        del qkv
        hidden = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")     # o_proj + residual
        del attn
        normed = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")
        gate = torch.empty(tokens * INTERMEDIATE, dtype=torch.float16, device="cuda")
        up = torch.empty(tokens * INTERMEDIATE, dtype=torch.float16, device="cuda")
        act = torch.empty(tokens * INTERMEDIATE, dtype=torch.float16, device="cuda")  # silu(gate) * up
        del gate, up, normed
        out = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")        # down_proj + residual
        del act
        return out


class BaseModelOutput(object):
    def __init__(self, last_hidden_state):
        self.last_hidden_state = last_hidden_state


class MistralModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embed_tokens = _fp16(VOCAB * HIDDEN)
        self.layers = []
        for i in range(LAYERS):
            layer = MistralDecoderLayer()
            setattr(self, "layers_%d" % i, layer)
            self.layers.append(layer)
        self.norm = _fp16(HIDDEN)

    def forward(self, input_ids, attention_mask, rows, seq):
        tokens = rows * seq
        hidden = torch.empty(tokens * HIDDEN, dtype=torch.float16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        return BaseModelOutput(hidden)


def last_token_pool(last_hidden_state, attention_mask, rows):
    return torch.empty(rows * HIDDEN, dtype=torch.float16, device="cuda")


def write_shard(embeddings):
    pass


def main():
    print("loading intfloat/e5-mistral-7b-instruct (fp16) ...", flush=True)
    model = MistralModel().cuda().eval()
    loader = ShardLoader(CORPUS_PASSAGES // BATCH_SIZE, NUM_WORKERS, PREFETCH_FACTOR)
    done = 0
    with torch.inference_mode():
        for batch in loader:
            out = model(**batch)
            emb = last_token_pool(out.last_hidden_state, batch["attention_mask"], batch["rows"])
            write_shard(emb)
            done += batch["rows"]
            if done % (BATCH_SIZE * 1000) == 0:
                print("embedded %d / %d" % (done, CORPUS_PASSAGES), flush=True)


if __name__ == "__main__":
    main()
