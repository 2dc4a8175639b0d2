"""Jobs with the stand-in tensorflow (tests/adapter/fake_tf) for tests/adapter/run_tests.sh.

    python3 job_tf.py MODE [OUT.json]

  limit   a logical device with memory_limit=512 (MB), 64 MiB tensors until the arena refuses
          one (ResourceExhaustedError, no driver failure), caught
  arena   no limit: the arena TensorFlow maps at its first use (90% of the free memory), one 16 MiB
          tensor in it, then a request larger than the arena, caught; `growth` the same with
          memory growth on (the arena taken in regions)
Each writes what the stand-in's arena holds (its regions from the driver, the bytes in use).
"""
import os
import sys

import tensorflow as tf

from jobkit import MiB, here, mode, write

keep = []
lines = {}

if mode == "limit":
    gpu = tf.config.list_physical_devices("GPU")[0]
    tf.config.set_logical_device_configuration(gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=512)])
    try:
        while True:
            lines["failing"] = here() + 1
            keep.append(tf.zeros((16, MiB), tf.float32))
    except tf.errors.ResourceExhaustedError as e:
        print("OOM:", e.message.split(" [")[0])
        info = tf.config.experimental.get_memory_info("GPU:0")
        write({"expected": {"device": 0, "request": 64 * MiB, "cap": 512 * MiB, "current": info["current"],
                            "arena": tf._bfc.arena(0).pool},
               "lines": lines, "file": os.path.abspath(__file__), "version": tf.__version__})
        sys.exit(0)

if mode in ("arena", "growth"):
    gpu = tf.config.list_physical_devices("GPU")[0]
    if mode == "growth":
        tf.config.experimental.set_memory_growth(gpu, True)
    keep.append(tf.zeros((4, MiB), tf.float32))
    try:
        lines["failing"] = here() + 1
        keep.append(tf.zeros((1 << 12, MiB), tf.float32))  # 16 GiB: more than the arena
    except tf.errors.ResourceExhaustedError as e:
        print("OOM:", e.message.split(" [")[0])
        a = tf._bfc.arena(0)
        write({"expected": {"device": 0, "request": 16 << 30, "arena": a.pool, "in_use": a.in_use},
               "lines": lines, "file": os.path.abspath(__file__), "version": tf.__version__})
        sys.exit(0)

print("unknown mode", mode)
sys.exit(2)
