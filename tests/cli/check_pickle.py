#!/usr/bin/env python3
"""Checks `oomguard report --format memory-viz` output: it must unpickle with
no globals at all (only plain data) into the layout of
torch.cuda.memory._snapshot().  usage: check_pickle.py FILE.pickle..."""
import io
import pickle
import sys


class PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):  # any class reference is a failure
        raise pickle.UnpicklingError(f"pickle references {module}.{name}")


SEGMENT_KEYS = {"device", "address", "total_size", "allocated_size", "active_size", "requested_size",
                "stream", "segment_type", "segment_pool_id", "is_expandable", "frames", "blocks"}
BLOCK_KEYS = {"address", "size", "requested_size", "state", "frames"}
TRACE_KEYS = {"action", "size", "stream", "time_us", "frames"}   # and addr, or device_free for "oom"
ACTIONS = {"alloc", "free_requested", "free_completed", "segment_alloc", "segment_free", "oom",
           "segment_map", "segment_unmap", "snapshot"}


def check(path):
    data = open(path, "rb").read()
    if data[:2] not in (b"\x80\x02", b"\x80\x03", b"\x80\x04"):
        return "not a protocol 2-4 pickle"
    snap = PlainOnly(io.BytesIO(data)).load()
    if not isinstance(snap, dict) or not {"segments", "device_traces"} <= snap.keys():
        return "top level is not {'segments', 'device_traces'}"
    for s in snap["segments"]:
        if not SEGMENT_KEYS <= s.keys():
            return f"segment lacks {SEGMENT_KEYS - s.keys()}"
        if sum(b["size"] for b in s["blocks"]) > s["total_size"]:
            return "blocks larger than their segment"
        for b in s["blocks"]:
            if not BLOCK_KEYS <= b.keys():
                return f"block lacks {BLOCK_KEYS - b.keys()}"
    if not isinstance(snap["device_traces"], list):
        return "device_traces is not a list"
    for trace in snap["device_traces"]:
        for e in trace:
            if not TRACE_KEYS <= e.keys() or e["action"] not in ACTIONS:
                return f"bad trace entry {e!r}"
            if ("device_free" if e["action"] == "oom" else "addr") not in e:
                return f"trace entry without its address (oom: device_free) {e!r}"
    return None


def main():
    bad = 0
    for path in sys.argv[1:]:
        try:
            err = check(path)
        except Exception as e:  # noqa: BLE001 - any failure to load is the finding
            err = f"{type(e).__name__}: {e}"
        if err:
            print(f"{path}: {err}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
