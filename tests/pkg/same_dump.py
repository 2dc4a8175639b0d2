#!/usr/bin/env python3
"""same_dump.py A.json B.json: exit 0 when two dumps of the same job say the same thing.

Everything is compared, exactly, except what differs between any two runs of one job: times,
process ids, code addresses (ASLR; each frame's library and offset are compared), the command
line and OOMGUARD_DIR (where the dump went), the snapshot's path, native frames' names (filled in
after the dump is written, within a time bound), the time-bucketed
samples of the usage curve and libraries' bytes by the quarter of the run they were taken in, and the role scan's time and heap size (the interpreter's own
objects differ between a venv and the source tree).  So the cause, the remedies, every byte count, the framework's own
numbers, the Python lines and the stacks must agree."""
import json
import sys

VOLATILE_KEYS = {"time", "pid", "ppid", "cmdline", "t", "t_rel", "peak_t_rel", "ip", "snapshot_file", "samples",
                 "recovered_t", "elapsed_ms", "objects_scanned", "bytes_by_quarter"}
# a native frame's names: filled in by the writing process after the dump is on disk, within a
# time bound (a loaded machine may stop it before), so one run may have them and the other not
FRAME_NAME_KEYS = {"function", "file", "line", "inlined", "inlined_into"}


def is_frame(path):
    return path == ".event.stack[]" or path.endswith(".frames[]")


def norm(x, path=""):
    if isinstance(x, dict):
        out = {}
        for k, v in x.items():
            if k in VOLATILE_KEYS or (path == ".env" and k == "OOMGUARD_DIR") or (is_frame(path) and k in FRAME_NAME_KEYS):
                continue
            out[k] = norm(v, path + "." + k)
        return out
    if isinstance(x, list):
        return [norm(v, path + "[]") for v in x]
    return x


def diff(a, b, path=""):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                yield "%s.%s only in %s" % (path, k, "the first" if k in a else "the second")
            else:
                yield from diff(a[k], b[k], path + "." + k)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        for i, (u, v) in enumerate(zip(a, b)):
            yield from diff(u, v, "%s[%d]" % (path, i))
    elif a != b:
        yield "%s: %s != %s" % (path, json.dumps(a)[:100], json.dumps(b)[:100])


def main():
    a, b = (norm(json.load(open(f))) for f in sys.argv[1:3])
    d = list(diff(a, b))
    for line in d[:20]:
        print(line)
    if d:
        print("%d differences between %s and %s" % (len(d), sys.argv[1], sys.argv[2]))
        return 1
    ev = a.get("event") or {}
    fw = (a.get("memory") or {}).get("framework") or {}
    print("same dump: %s, %s bytes requested, framework reserved %s, %d Python frames" % (
        (a.get("diagnosis") or {}).get("primary"), ev.get("requested_bytes"), fw.get("reserved_bytes"),
        len(ev.get("python_stack") or [])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
