#!/usr/bin/env python3
"""Writes large but valid dumps for the performance test.
usage: gen_large.py sites N OUT     a dump with N top_sites entries
       gen_large.py events N OUT    a dump with N history events and N samples"""
import json
import sys

GiB = 1 << 30


def header(status="oom"):
    return {
        "schema": "oomguard.dump/1", "status": status, "generator": "oomguard 0.1.0",
        "time": 1764431103.5, "pid": 4242, "ppid": 1, "host": "perf-host",
        "rank": None, "local_rank": None, "world_size": None, "job_id": None,
        "cmdline": "python big.py", "framework": {"name": "pytorch", "libraries": ["libc10_cuda.so"]},
        "env": {}, "visible_devices": 1,
        "event": {"requested_bytes": 2 * GiB, "api": "cudaMalloc", "driver_api": "cuMemAlloc_v2", "device": 0,
                  "stream_ordered": False, "result": 2, "caused_by_limit": False, "library": "libc10_cuda.so",
                  "stack": [], "t": 1764431103.4, "t_rel": 999.0, "attempts": 1,
                  "released_between_attempts_bytes": 0, "recovered_by": None},
        "device": {"index": 0, "name": "NVIDIA H100 80GB HBM3", "pci_bus_id": "00000000:19:00.0",
                   "compute_capability": "9.0", "total_bytes": 85520809984, "free_bytes": GiB,
                   "limit_bytes": None},
        "memory": {"process_tracked_bytes": 80 * GiB, "process_used_bytes": 81 * GiB,
                   "framework_bytes": 80 * GiB, "framework_cached_bytes": 0, "non_framework_bytes": GiB,
                   "other_processes": [], "other_processes_bytes": 0, "unmeasured": []},
        "diagnosis": {"primary": "does_not_fit", "shortfall_bytes": GiB,
                      "causes": [{"id": "does_not_fit", "confidence": 0.9, "summary": "too big",
                                  "evidence": {"requested_bytes": 2 * GiB}}]},
        "remedies": [{"id": "smaller_batch", "rank": 1, "title": "Smaller batch", "why": "x",
                      "how": ["--batch-size 1"], "saving": "a lot", "cost": "speed"}],
    }


def write_with(out, doc, key, items):
    """Writes doc with `key` (top level, or "history.X") filled by the iterator
    `items` of JSON texts, without building one big string."""
    body = json.dumps(doc)[:-1]  # drop the closing brace
    out.write(body + ", ")
    out.write(items)


def sites(n, path):
    with open(path, "w") as out:
        out.write(json.dumps(header())[:-1] + ', "top_sites": [')
        frames = json.dumps([{"ip": "0x7f00%08x" % i, "symbol": "frame_%d" % i, "library": "libx.so"}
                             for i in range(3)])
        chunk = []
        for i in range(n):
            fr = frames if i < 20 else "[]"
            chunk.append('{"bytes":%d,"blocks":%d,"library":"libc10_cuda.so","api":"cudaMalloc","frames":%s}'
                         % (n * 4096 - i * 4096, 1 + i % 7, fr))
            if len(chunk) == 10000:
                out.write(("," if i >= 10000 else "") + ",".join(chunk))
                chunk = []
        if chunk:
            out.write(("," if n > len(chunk) else "") + ",".join(chunk))
        out.write("]}\n")


def events(n, path):
    with open(path, "w") as out:
        out.write(json.dumps(header())[:-1] + ', "history": {"peak_bytes": %d, "peak_t_rel": 998.0, '
                  '"peak_library": "libc10_cuda.so", "counters": {"allocs": %d, "frees": %d, "failures": 1, '
                  '"unknown_frees": 0}, "events": [' % (60 * GiB, n, n))
        live = 0
        parts = []
        for i in range(n):
            op = "alloc" if i % 3 != 2 else "free"
            size = (1 + i % 16) << 20
            live = live + size if op == "alloc" else max(0, live - size)
            parts.append('{"t_rel":%.6f,"op":"%s","bytes":%d,"device":0,"api":"cudaMalloc","live_bytes":%d}'
                         % (i * 999.0 / n, op, size, live))
        out.write(",".join(parts))
        out.write('], "samples": [')
        out.write(",".join('{"t_rel":%.6f,"live_bytes":%d}' % (i * 999.0 / n, (i * 7919) % (60 * GiB))
                           for i in range(n)))
        out.write("]}}\n")


if __name__ == "__main__":
    kind, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    {"sites": sites, "events": events}[kind](n, out)
