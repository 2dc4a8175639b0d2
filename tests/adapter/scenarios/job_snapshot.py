"""A job that `oomguard snapshot` asks for a dump while it runs (tests/adapter/run_tests.sh).

    python3 job_snapshot.py [FRAMEWORK-]fresh|blocked OUT.json     FRAMEWORK: jax, cupy, cupydriver, tf
    python3 job_snapshot.py unused OUT.json

The framework (PyTorch without a prefix) reports its numbers once -- PyTorch by hand
(oomguard_torch.report()), JAX, CuPy and TensorFlow at a failure the job catches (a request far
over the arena, the pool's limit, the logical device's limit; cupydriver: 8 GiB, which cudaMalloc
refuses, so the driver's failure stays open: nothing as large succeeds) -- then the job takes 64 MiB more,
so the adapter's last report is stale, and writes OUT.json: the pid, the framework's own numbers
of the last report ("reported") and now ("now").  fresh: then
runs Python code (short sleeps) until the file OUT.json.stop appears, so the interpreter can be
asked for fresh numbers.  blocked: then sits in one long C call (libc's sleep through ctypes,
6 s) where the interpreter cannot be asked.

unused: JAX, CuPy and TensorFlow imported and never used; the device memory is the job's own
(cudaMalloc through ctypes).  At OUT.json.stop it adds to OUT.json whether the refreshers were
asked ("asked") and whether any framework's backend came up ("up"); "refreshers" = how many were
registered before and after the imports."""
import ctypes
import os
import sys
import time

sys.path.append(os.path.dirname(os.path.abspath(__file__)))
from jobkit import MiB, mode, out, write  # noqa: E402

fw, _, how = mode.rpartition("-")
keep = []


def torch_job():
    import torch
    import oomguard_torch
    keep.append(torch.empty(32 * MiB))
    assert oomguard_torch.report() is not None, "the adapter did not report"
    return (lambda: {"allocated": torch.cuda.memory_allocated(0), "reserved": torch.cuda.memory_reserved(0),
                     "peak": torch.cuda.max_memory_allocated(0)},
            lambda: keep.append(torch.empty(64 * MiB)))


def jax_job():
    import jax
    import jax.numpy as jnp
    dev = jax.devices()[0]

    def books():
        st = dev.memory_stats()
        return {"allocated": st["bytes_in_use"], "reserved": st["pool_bytes"], "peak": st["peak_bytes_in_use"],
                "largest_free": st["largest_free_block_bytes"]}
    keep.append(jnp.zeros((32 * MiB // 4,), jnp.float32))
    try:
        jnp.zeros((8 << 30) // 4, jnp.float32)
        raise SystemExit("no RESOURCE_EXHAUSTED")
    except jax.errors.JaxRuntimeError:
        pass
    return books, lambda: keep.append(jnp.zeros((64 * MiB // 4,), jnp.float32))


def cupy_job(limit=256 * MiB, request=512 * MiB):
    import cupy
    import oomguard_cupy
    pool = cupy.get_default_memory_pool()
    pool.set_limit(size=limit)
    keep.append(cupy.zeros((32 * MiB // 4,), cupy.float32))
    try:
        cupy.zeros((request // 4,), cupy.float32)
        raise SystemExit("no OutOfMemoryError")
    except cupy.cuda.memory.OutOfMemoryError:
        oomguard_cupy.flush()
    return (lambda: {"allocated": pool.used_bytes(), "reserved": pool.total_bytes()},
            lambda: keep.append(cupy.zeros((64 * MiB // 4,), cupy.float32)))


def tf_job():
    import tensorflow as tf
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=512)])

    def books():
        if not hasattr(tf.config.experimental, "get_memory_info"):       # TensorFlow 2.4
            return {"allocated": tf.config.experimental.get_memory_usage("GPU:0")}
        info = tf.config.experimental.get_memory_info("GPU:0")
        return {"allocated": info["current"], "peak": info["peak"]}
    keep.append(tf.zeros((8, MiB), tf.float32))
    try:
        tf.zeros((256, MiB), tf.float32)
        raise SystemExit("no ResourceExhaustedError")
    except tf.errors.ResourceExhaustedError:
        pass
    return books, lambda: keep.append(tf.zeros((16, MiB), tf.float32))


def wait_for_stop():
    deadline = time.time() + 60
    while not os.path.exists(out + ".stop") and time.time() < deadline:
        time.sleep(0.01)


if how == "unused":
    import oomguard_core
    before = len(oomguard_core._refreshers)
    import cupy  # noqa: F401
    import jax  # noqa: F401
    import tensorflow  # noqa: F401
    after = len(oomguard_core._refreshers)
    asked = []
    oomguard_core.on_refresh(lambda device: asked.append(device))
    rt = ctypes.CDLL("libcudart.so.13")
    rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
    p = ctypes.c_void_p(0)
    assert rt.cudaMalloc(ctypes.byref(p), 64 * MiB) == 0
    doc = {"pid": os.getpid(), "refreshers": [before, after]}
    write(doc)
    wait_for_stop()
    from jax._src import xla_bridge
    from tensorflow.python.eager import context
    ctx = context.context_safe()
    doc["asked"] = asked
    doc["up"] = {"jax": xla_bridge.backends_are_initialized(),
                 "cupy": bool(cupy.get_default_memory_pool()._pools) or cupy._fake_cuda._rt is not None,
                 "tensorflow": bool(ctx is not None and ctx._initialized)}
    write(doc)
    sys.exit(0)

books, grow = {"": torch_job, "jax": jax_job, "cupy": cupy_job, "tf": tf_job,
                "cupydriver": lambda: cupy_job(0, 8 << 30)}[fw]()
reported = books()
grow()
now = books()
write({"pid": os.getpid(), "reported": reported, "now": now})
if how == "fresh":
    wait_for_stop()
else:
    ctypes.CDLL(None).sleep(6)
