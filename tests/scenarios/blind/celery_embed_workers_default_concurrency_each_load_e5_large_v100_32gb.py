"""embed_tasks.py -- the nightly re-embedding of a document store, run as Celery tasks so that the ingestion
service can also enqueue single documents during the day.  One V100-SXM2-32GB box with 16 vCPUs; the worker
is started with the command from the tutorial, `celery -A embed_tasks worker --loglevel=info`, which forks
as many pool processes as the machine has CPUs (16).  Each pool process loads its own model when it starts,
as the Celery docs suggest for per-process resources:

    @worker_process_init.connect
    def load_model(**kw):
        global model
        model = AutoModel.from_pretrained("intfloat/multilingual-e5-large", torch_dtype=torch.float16).cuda()
    @app.task
    def embed_batch(texts):                    # 128 passages, truncated to 512 tokens
        with torch.inference_mode():
            return pool(model(**tok(texts, ...))).cpu().numpy()

Every pool process holds a CUDA context (0.5 GiB), its own copy of the weights (1.04 GiB) and, once it has run
a batch, ~2.3 GiB in its caching allocator: 3.8 GiB each.  Eight of them fit on the card; the ninth dies with
CUDA out of memory while it loads its copy of the weights, while eight siblings -- pool processes of the same
worker, forked by the same master -- hold 31 GiB.  (Here the master starts the pool processes one after the
other and stops the worker at the first that dies, as a supervisor would after the crash loop.)

An expert: one GPU, one model -- run the worker with --concurrency=1 (or --pool=solo / threads) and let
that single process batch the work; or a single inference server that the workers call.  Not a smaller batch
(each process would still hold a context and a copy of the weights), not quantization, not empty_cache; the
memory is not held by other people's programs but by this worker's own pool.
"""
import os
import signal
import sys

import torch

import scen_truth

MiB = 1 << 20
CONCURRENCY = 16                                    # celery's default: os.cpu_count() of the box
BATCH, SEQ, HIDDEN, HEADS = 128, 512, 1024, 16


class XLMRobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(4 * HIDDEN * HIDDEN, dtype=torch.float16, device="cuda"))
        self.ffn = torch.nn.Parameter(torch.empty(2 * HIDDEN * 4096, dtype=torch.float16, device="cuda"))

    def forward(self, h):
        scores = torch.empty(BATCH * HEADS * SEQ * SEQ, dtype=torch.float16, device="cuda")   # 1 GiB
        ctx = torch.empty(BATCH * SEQ * HIDDEN, dtype=torch.float16, device="cuda")
        del scores
        inter = torch.empty(BATCH * SEQ * 4096, dtype=torch.float16, device="cuda")           # 512 MiB
        out = torch.empty(BATCH * SEQ * HIDDEN, dtype=torch.float16, device="cuda")
        del inter, ctx
        return out


class XLMRobertaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(250002 * HIDDEN, dtype=torch.float16, device="cuda"))
        for i in range(24):
            setattr(self, "layer_%d" % i, XLMRobertaLayer())

    def forward(self, input_ids, attention_mask):
        h = torch.empty(BATCH * SEQ * HIDDEN, dtype=torch.float16, device="cuda")
        for i in range(24):
            h = getattr(self, "layer_%d" % i)(h)
        return h


model = None


def load_model(**kw):                          # @worker_process_init.connect
    global model
    model = XLMRobertaModel().cuda().eval()


def embed_batch(texts):                        # @app.task
    with torch.inference_mode():
        input_ids = torch.empty(len(texts) * SEQ * 8, device="cuda")
        attention_mask = torch.empty(len(texts) * SEQ * 8, device="cuda")
        last_hidden = model(input_ids, attention_mask)
        emb = torch.empty(len(texts) * HIDDEN * 4, device="cuda")          # mean pooling, fp32
        return emb.nbytes


def pool_process(ready_w, go_r):
    """A prefork pool process: init, then take tasks (test scaffolding: tell the master after the first)."""
    scen_truth.note_every_empty(torch)
    try:
        load_model()
        embed_batch(["passage: ..."] * BATCH)
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        import traceback
        traceback.print_exc()
        os._exit(1)                            # billiard's pool process ends with os._exit
    os.write(ready_w, b"r")
    os.read(go_r, 1)                           # keeps serving until the master stops it
    os._exit(0)


def main():
    children = []
    go_r, go_w = os.pipe()
    status = 0
    for i in range(CONCURRENCY):
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(ready_r)
            pool_process(ready_w, go_r)
        os.close(ready_w)
        children.append(pid)
        ok = os.read(ready_r, 1)
        os.close(ready_r)
        if not ok:                              # the pool process died before its first task was done
            _, st = os.waitpid(pid, 0)
            children.remove(pid)
            print("worker: Process 'ForkPoolWorker-%d' pid:%d exited with 'exitcode %d'"
                  % (i + 1, pid, os.waitstatus_to_exitcode(st)), file=sys.stderr)
            status = 1
            break
    for pid in children:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    return status


sys.exit(main())
