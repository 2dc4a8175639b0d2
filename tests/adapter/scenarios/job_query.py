"""The shim's query (include/oomguard.h: oomguard_framework_set_query) at a failing cudaMalloc.

    python3 job_query.py held|released OUT.json

held: cudaMalloc is called through ctypes.PyDLL, which keeps the GIL: the shim may ask the
adapter's query, which hands over this file's line.  released: through ctypes.CDLL, which
releases the GIL: the shim must not ask (taking the GIL inside the allocation could deadlock) and
says so in memory.unmeasured.  Either way the call returns its error unchanged."""
import ctypes
import os
import sys

from jobkit import here, mode, write

lib = (ctypes.PyDLL if mode == "held" else ctypes.CDLL)("libcudart.so.13")
lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p(0)
lines = {"failing": here() + 1}
r = lib.cudaMalloc(ctypes.byref(p), 64 << 30)
print("cudaMalloc:", r)
write({"expected": {"device": 0}, "lines": lines, "file": os.path.abspath(__file__), "result": r})
sys.exit(0 if r == 2 else 2)
