"""kokoro_api -- a FastAPI text-to-speech endpoint serving Kokoro-82M (StyleTTS2-style acoustic model +
iSTFTNet vocoder, 82M parameters, fp32) on one Tesla T4 (15 GiB usable) of a g4dn.4xlarge (16 vCPUs),
started by gunicorn with the worker count copied from gunicorn's documentation:

    # gunicorn.conf.py
    import multiprocessing
    workers = multiprocessing.cpu_count() * 2 + 1          # 16 vCPUs -> 33 workers
    worker_class = "uvicorn.workers.UvicornWorker"
    preload_app = False                                    # every worker imports app.py itself

    # app.py (imported by every worker after the fork)
    pipeline = KPipeline(lang_code="a", device="cuda")     # the model's 82M fp32 weights: 322 MiB
    pipeline("Warm-up sentence.", voice="af_heart")       # leaves ~200 MiB in the worker's cache

Every worker is its own process: its own CUDA context (~400 MiB on this T4 with cuBLAS/cuDNN),
its own copy of the weights (322 MiB) and its own caching allocator that keeps what the warm-up used
(~200 MiB): about 0.9 GiB a worker.  Sixteen workers boot (14.5 GiB of the card); the seventeenth gets
its context and fails part way through copying its weights to the GPU.  gunicorn logs the worker's
traceback, sees WORKER_BOOT_ERROR (3), stops the other workers and exits 3 ("Worker failed to boot").

What is on the card at the failure is this job's own workers: sixteen siblings of the failing process
(same command line, same parent: the gunicorn master), each holding ~0.9 GiB.  The failing worker
itself holds a context and part of an 82M model.  Nothing leaks and nothing is fragmented.

An expert says first: the worker count is the problem -- a GPU model server wants one (or two)
worker processes per GPU, with concurrency from async handlers / a batching queue inside the
worker, not cpu_count()*2+1 processes that each pay a CUDA context and a model copy
(`workers = 1` or `2`, WEB_CONCURRENCY=2).  Wrong advice: empty_cache or expandable_segments (the
failing worker caches nothing; the siblings' caches are not its to free), a smaller batch (requests
are one sentence), quantizing an 82M model, gradient checkpointing (no training), "stop the other
processes on the GPU" as if they were strangers (they are this server's own workers: the fix is the
config, not killing them one by one), or a bigger GPU (33 x 0.9 GiB would still be a waste).
"""
import os
import select
import signal
import sys
import time

MiB = 1 << 20
CPU_COUNT = 16                       # multiprocessing.cpu_count() on the g4dn.4xlarge
WORKERS = CPU_COUNT * 2 + 1          # gunicorn.conf.py: the documentation's formula
WORKER_BOOT_ERROR = 3                # gunicorn.arbiter.Arbiter.WORKER_BOOT_ERROR

# Kokoro-82M as KModel holds it: (submodule, [parameter tensors in fp32 elements])
KOKORO_PARAMETERS = [
    ("bert", [3_932_160, 1_572_864, 786_432]),                          # PL-BERT (ALBERT) ~6.3M
    ("bert_encoder", [393_216]),
    ("predictor", [6_291_456, 4_194_304, 3_145_728, 2_359_296, 524_288]),   # duration / F0 / energy
    ("text_encoder", [3_145_728, 2_097_152, 524_288]),
    ("decoder", [12_582_912, 11_534_336, 9_437_184, 8_388_608, 6_291_456, 3_670_016, 1_048_576,
                 262_144, 131_072]),                                   # iSTFTNet generator ~53.3M
]


def worker_main(age):
    """What a gunicorn worker runs after the fork: import the app (model load + warm-up), then serve."""
    import torch
    import scen_truth
    scen_truth.note_every_empty(torch)

    class KModel(torch.nn.Module):
        def __init__(self, device):
            torch.nn.Module.__init__(self)
            for name, shapes in KOKORO_PARAMETERS:
                sub = torch.nn.Module()
                for i, n in enumerate(shapes):
                    # KModel(...).to("cuda"): each fp32 tensor copied to the GPU
                    setattr(sub, "weight_%d" % i, torch.nn.Parameter(torch.empty(n, dtype=torch.float32,
                                                                                 device=device)))
                setattr(self, name, sub)

        def forward(self, phonemes, ref_s):
            # one short sentence: text encoder, prosody predictor, then the iSTFTNet decoder's
            # upsampling stages (freed as the pass goes; the allocator keeps the segments)
            acts = []
            for n in (6 * MiB, 12 * MiB, 24 * MiB, 48 * MiB, 112 * MiB):
                acts.append(torch.empty(n, dtype=torch.uint8, device="cuda"))
            audio = torch.empty(24000 * 4 * 4, dtype=torch.uint8, device="cuda")   # ~4 s at 24 kHz
            del acts
            return audio

    try:
        model = KModel("cuda").eval()                       # KPipeline(lang_code="a", device="cuda")
        voice = torch.empty(510 * 256, dtype=torch.float32, device="cuda")     # voices/af_heart.pt
        with torch.inference_mode():
            wav = model(None, voice)                        # warm-up sentence
            del wav
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        import traceback
        sys.stderr.write("[%d] [ERROR] Exception in worker process\n" % os.getpid())
        traceback.print_exc()
        sys.stderr.flush()
        sys.exit(WORKER_BOOT_ERROR)
    return model


def spawn_worker(age, ready_w):
    pid = os.fork()
    if pid != 0:
        return pid
    # -- the worker (same command line as the master, child of the master)
    stop = []
    signal.signal(signal.SIGTERM, lambda *a: stop.append(1))
    model = worker_main(age)
    os.write(ready_w, b"%d\n" % os.getpid())
    while not stop:                                         # serve requests until the master stops us
        time.sleep(0.05)
    del model
    sys.exit(0)


def main():
    sys.stderr.write("[INFO] Starting gunicorn 23.0.0\n[INFO] Using worker: uvicorn.workers.UvicornWorker\n")
    r, w = os.pipe()
    workers = []
    failed = None
    for age in range(1, WORKERS + 1):
        pid = spawn_worker(age, w)
        sys.stderr.write("[INFO] Booting worker with pid: %d\n" % pid)
        workers.append(pid)
        # the arbiter reaps boot failures as they happen; a booted worker writes its pid
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                failed = (pid, os.waitstatus_to_exitcode(status))
                break
            if select.select([r], [], [], 0.05)[0]:
                os.read(r, 64)
                break
        if failed:
            break
    if failed:
        sys.stderr.write("[ERROR] Worker (pid:%d) exited with code %d\n" % failed)
        sys.stderr.write("[ERROR] Shutting down: Master\n[ERROR] Reason: Worker failed to boot.\n")
        for pid in workers:
            if pid != failed[0]:
                os.kill(pid, signal.SIGTERM)
        for pid in workers:
            if pid != failed[0]:
                os.waitpid(pid, 0)
        sys.exit(WORKER_BOOT_ERROR)
    for pid in workers:
        os.kill(pid, signal.SIGTERM)
        os.waitpid(pid, 0)
    sys.exit(0)


if __name__ == "__main__":
    main()
