"""rerank_server.py -- a search team's reranking API behind a pre-fork server, started as
`gunicorn -w 3 rerank_server:app` on a single 24 GB card, with plain `LD_PRELOAD=liboomguard.so`:

    # rerank_server.py, imported by every worker (no --preload: the master never touches CUDA)
    model = CrossEncoder.from_pretrained("/models/reranker-3b", torch_dtype=torch.float16).to("cuda")
    model.eval()
    warmup(model)                            # one batch under inference_mode, caches the kernels
    app = make_app(model)

Each worker is its own process and loads its own copy of the model: 7.5 GiB of fp16 weights, plus a
CUDA context and a warm-up batch, about 8.1 GiB per worker.  Two workers fit; the third one to boot
finds 7.8 GiB free (7.3 GiB after its own context) and runs out in the 29th of its 30 layers (the
master then reports "Worker failed to boot" and shuts the server down, exit status 3).  The program below is that server: the master
forks the workers one after another (each announces itself once its model is loaded, as a slow
boot makes it in practice) and stops when one dies.

An expert: the card holds two copies of this model, not three: fewer workers per GPU (one or two,
with threads or an async batching queue inside the worker, or a model server that shares one copy
between requests).  The other processes on the card are this server's own workers: there is no
stranger to stop and no second GPU to pick with set_device; a smaller batch, checkpointing or
inference_mode change nothing while weights load.
"""
import os
import signal
import sys
import time

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

WORKERS = int(os.environ.get("WEB_CONCURRENCY", "3"))
WORKER_BOOT_ERROR = 3          # gunicorn's exit status when a worker fails to boot


class CrossEncoderLayer(torch.nn.Module):
    def __init__(self, nbytes, dtype):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(nbytes // 3, dtype=dtype, device="cuda"))
        self.ffn = torch.nn.Parameter(torch.empty(nbytes - nbytes // 3, dtype=dtype, device="cuda"))

    def forward(self, x):
        out = torch.empty(24 * MiB, device="cuda")
        return out


class CrossEncoder(torch.nn.Module):
    def __init__(self, layers, layer_elems, dtype):
        torch.nn.Module.__init__(self)
        self.layers = []
        for i in range(layers):
            layer = CrossEncoderLayer(layer_elems, dtype)
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    @classmethod
    def from_pretrained(cls, path, torch_dtype=None):
        # 3.75B parameters: 30 layers of 125M, fp16 -> 7.5 GiB
        return cls(30, 128 * MiB, torch_dtype or torch.get_default_dtype())

    def forward(self, pairs):
        x = pairs
        for layer in self.layers:
            x = layer(x)
        return x


def warmup(model):
    with torch.inference_mode():
        scores = model(torch.empty(64 * 512 * 8, device="cuda"))
    return scores


def make_app(model):
    def app(environ, start_response):
        start_response("200 OK", [("Content-Type", "application/json")])
        return [b"{}"]
    app.model = model
    return app


def load_app():
    """What `import rerank_server` does in each worker."""
    model = CrossEncoder.from_pretrained("/models/reranker-3b", torch_dtype=torch.float16).to("cuda")
    model.eval()
    warmup(model)
    return make_app(model)


def worker(ready_fd):
    signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
    try:
        app = load_app()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    os.write(ready_fd, b"1")
    while True:                     # serve requests until the master stops us
        time.sleep(0.2)
    return app


def master():
    children = []
    failed = False
    for n in range(WORKERS):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            code = 0
            try:
                worker(w)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 0
            except BaseException:
                import traceback
                traceback.print_exc()
                code = 1
            sys.stdout.flush()
            sys.stderr.flush()
            sys.exit(code)
        os.close(w)
        children.append(pid)
        booted = os.read(r, 1)
        os.close(r)
        if not booted:
            sys.stderr.write("[ERROR] Worker (pid:%d) exited when booting\n" % pid)
            os.waitpid(pid, 0)
            children.remove(pid)
            failed = True
            break
        sys.stderr.write("[INFO] Booting worker with pid: %d\n" % pid)
    for pid in children:
        os.kill(pid, signal.SIGTERM)
    for pid in children:
        os.waitpid(pid, 0)
    if failed:
        sys.stderr.write("[ERROR] Worker failed to boot.\n[INFO] Shutting down: Master\n")
        sys.exit(WORKER_BOOT_ERROR)
    sys.exit(0)


if __name__ == "__main__":
    master()
