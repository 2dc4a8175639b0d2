#!/usr/bin/env python3
"""Checks memory_viz exports with PyTorch's own functions and the page's replay.

usage: check_memviz.py [--total BYTES] FILE.pickle...
  --total   the device's memory: the replayed live bytes must never exceed it

For each pickle (a `report --format memory-viz` export, or the adapter's own snapshot pickle):
  1. torch.cuda._memory_viz's functions accept it: segments(), memory(), compare() and stats()
     (stats() asserts that every segment's blocks add up to its total_size); those of PyTorch 1.13
     take the list of segments, later ones the snapshot dict: both are tried.  The module is
     imported from torch when that imports, else loaded from Debian's python3-torch file (it
     needs nothing of torch); flame graphs are not drawn (the text they are drawn from is
     checked instead: no flamegraph.pl, no network).
  2. trace() as PyTorch 2.x reads it: "oom" entries carry device_free, the others addr.
  3. the memory_viz page's replay (MemoryViz.js, process_alloc_data), for both of its views:
     trace allocations still live at the end are matched to the segments' blocks by address,
     blocks not in the trace were allocated before it, frees of unknown addresses too.  An
     address allocated twice while live is counted twice: that, or live bytes above --total, fail;
     for oomguard's own exports the bytes live at the end must be the segments' own.
Exit 0 all good, 1 a finding, 77 when no _memory_viz module is available."""
import contextlib
import importlib.util
import io
import pickle
import sys


class PlainOnly(pickle.Unpickler):
    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"pickle references {module}.{name}")


def memory_viz():
    try:
        import torch.cuda._memory_viz as m   # noqa: PLC0415
        return m
    except Exception:   # noqa: BLE001 - no torch here: the file alone
        pass
    for path in ("/usr/lib/python3/dist-packages/torch/cuda/_memory_viz.py",):
        try:
            spec = importlib.util.spec_from_file_location("_memory_viz", path)
            m = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(m)
            return m
        except (OSError, ImportError):
            continue
    return None


def pytorch_functions(m, snap):
    """segments/memory/compare/stats, in the calling convention the module has."""
    flame = lambda text: text   # noqa: E731 - the flame graph's input
    last = None
    for arg in (snap["segments"], snap):
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                outs = [m.segments(arg, format_flamegraph=flame), m.memory(arg, format_flamegraph=flame),
                        m.compare(arg, arg, format_flamegraph=flame)]
            st = m.stats(arg) if hasattr(m, "stats") else None
        except (KeyError, TypeError, AssertionError) as e:
            last = e
            continue
        total = sum(s["total_size"] for s in snap["segments"])
        if st is not None and st["total_size"].value != total:
            raise AssertionError(f"stats total {st['total_size'].value} != {total}")
        # each flame graph line: "path size"; memory()'s sizes add up to the blocks' sizes
        mem = sum(int(line.rsplit(" ", 1)[1]) for line in outs[1].splitlines() if line.strip())
        blocks = sum(b["size"] for s in snap["segments"] for b in s["blocks"])
        if mem != blocks:
            raise AssertionError(f"memory() lines add up to {mem}, blocks to {blocks}")
        return
    raise AssertionError(f"_memory_viz functions refuse it: {type(last).__name__}: {last}")


def trace_entries(snap):
    for d, trace in enumerate(snap["device_traces"]):
        for e in trace:
            if e["action"] == "oom":
                assert "device_free" in e and "addr" not in e, f"device {d}: oom entry {e}"
            else:
                assert "addr" in e, f"device {d}: entry without addr {e}"


def replay(snap, device, plot_segments, total):
    """MemoryViz.js's process_alloc_data: the live bytes over the trace; raises on double counting."""
    alloc = "segment_alloc" if plot_segments else "alloc"
    frees = ("segment_free",) if plot_segments else ("free", "free_completed")
    elements, initially, actions, addr_to_alloc = [], [], [], {}
    trace = snap["device_traces"][device] if device < len(snap["device_traces"]) else []
    for e in trace:
        if e["action"] == alloc:
            elements.append(e)
            addr_to_alloc[e["addr"]] = len(elements) - 1
            actions.append(len(elements) - 1)
        elif e["action"] in frees:
            if e["addr"] in addr_to_alloc:
                actions.append(addr_to_alloc.pop(e["addr"]))
            else:
                elements.append(e)
                initially.append(len(elements) - 1)
                actions.append(len(elements) - 1)
    for seg in snap["segments"]:
        if seg["device"] != device:
            continue
        if plot_segments:
            if seg["address"] not in addr_to_alloc:
                elements.append({"addr": seg["address"], "size": seg["total_size"]})
                initially.append(len(elements) - 1)
        else:
            addr = seg["address"]   # the page's annotate_snapshot: blocks follow each other
            for b in seg["blocks"]:
                if b.get("address", addr) != addr:
                    raise AssertionError(f"block address {b['address']:#x} is not its place {addr:#x}")
                if b["state"] == "active_allocated" and addr not in addr_to_alloc:
                    elements.append({"addr": addr, "size": b["requested_size"]})
                    initially.append(len(elements) - 1)
                addr += b["size"]
    live, live_addr, peak = 0, {}, 0

    def add(i):
        nonlocal live, peak
        a = elements[i]["addr"]
        if a in live_addr:
            raise AssertionError(f"{'segment' if plot_segments else 'block'} {a:#x} counted twice")
        live_addr[a] = i
        live += elements[i]["size"]
        peak = max(peak, live)

    for i in initially:
        add(i)
    seen = set(initially)
    for i in actions:
        if i in seen:
            a = elements[i]["addr"]
            if live_addr.get(a) == i:
                del live_addr[a]
                live -= elements[i]["size"]
            seen.discard(i)
        else:
            seen.add(i)
            add(i)
    if total is not None and peak > total:
        raise AssertionError(f"replayed live bytes {peak} exceed the device's {total}")
    # oomguard's own exports (segments named by library): at the end of the replay exactly the
    # segments' memory is live, nothing twice (PyTorch's own sizes round trace vs blocks apart)
    segs = [s for s in snap["segments"] if s["device"] == device]
    if segs and all("library" in s for s in segs):
        want = sum(s["total_size"] if plot_segments else
                   sum(b["requested_size"] for b in s["blocks"] if b["state"] == "active_allocated") for s in segs)
        if live != want:
            raise AssertionError(f"{'segments' if plot_segments else 'blocks'}: {live} bytes live after the replay, "
                                 f"the segments hold {want}: counted twice")
    return peak


def check(path, m, total):
    snap = PlainOnly(open(path, "rb")).load()
    assert isinstance(snap, dict) and {"segments", "device_traces"} <= snap.keys(), "not a snapshot dict"
    pytorch_functions(m, snap)
    trace_entries(snap)
    devices = {s["device"] for s in snap["segments"]} | set(range(len(snap["device_traces"])))
    return {d: (replay(snap, d, False, total), replay(snap, d, True, total)) for d in sorted(devices)}


def main():
    args, total = sys.argv[1:], None
    if args[:1] == ["--total"]:
        total, args = int(args[1]), args[2:]
    m = memory_viz()
    if m is None:
        print("no torch.cuda._memory_viz (install python3-torch)")
        sys.exit(77)
    bad = 0
    for path in args:
        try:
            peaks = check(path, m, total)
            print(f"ok {path}: peak live bytes per device (blocks, segments) {peaks}")
        except Exception as e:   # noqa: BLE001 - any failure is the finding
            print(f"FAIL {path}: {type(e).__name__}: {e}")
            bad += 1
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
