"""server.py -- a model server under a pre-fork process manager (gunicorn -w 5 with the model loaded
in each worker's post_fork hook), on one 24 GiB card:

    def post_fork(server, worker):
        worker.model = load_model().to("cuda").eval()       # 4.5 GiB of weights per worker

Every worker is a separate process with its own CUDA context (0.5 GiB) and its own copy of the
weights: 4 workers hold 20 GiB, the fifth fails loading.  The other processes on the card are this
job's own workers: killing them is not a fix.  An expert: fewer workers per GPU (one model process
fed by the HTTP workers through a queue, or batching in one process).
"""
import os
import sys
import time
import torch
import scen_truth

MiB = 1 << 20


def alloc_n(n, nbytes):
    """n tensors of nbytes; a list local to this frame, so a failure's traceback keeps the partial
    list alive in the except block, as the tensors of a real forward pass are (for the truth mark)."""
    got = []
    for _ in range(n):
        got.append(scen_truth.torch_empty(nbytes, device="cuda"))
    return got
WORKERS = 5


def worker(k):
    try:
        with torch.inference_mode():
            weights = alloc_n(16, 288 * MiB)
        open(os.path.join(os.environ["SCEN_STATE"], "ready-%d" % k), "w").close()
        time.sleep(3.0)                       # serving
    except torch.OutOfMemoryError as e:
        scen_truth.torch_oom_mark()
        sys.stderr.write("[worker %d] Exception in worker process: %s\n" % (k, e))
        os._exit(1)
    os._exit(0)


pids = []
done = {}
for k in range(WORKERS):
    pid = os.fork()
    if pid == 0:
        worker(k)
    pids.append(pid)
    t0 = time.time()                          # gunicorn spawns workers one by one
    while not os.path.exists(os.path.join(os.environ["SCEN_STATE"], "ready-%d" % k)) and time.time() - t0 < 20:
        r, st = os.waitpid(pid, os.WNOHANG)
        if r:
            done[pid] = st
            break
        time.sleep(0.02)
rc = 0
for pid in pids:
    st = done[pid] if pid in done else os.waitpid(pid, 0)[1]
    rc |= os.WEXITSTATUS(st)
sys.exit(rc)
