#!/usr/bin/env python3
"""Checks one example's dump against the simulator's ground truth and the expected advice.

usage: check_scenario.py SCENARIO DUMP.json TRUTH.jsonl
Prints one line per check; exits 1 if any failed."""
import json
import sys

GiB = 1 << 30
MiB = 1 << 20

# scenario -> expectations
EXPECT = {
    "too_big": dict(status="oom", requested=12 * GiB, primary="does_not_fit",
                    top3_any=["smaller_batch", "mixed_precision", "gradient_checkpointing"],
                    not_first=["empty_cache"]),
    # the allocator already released its free segments before its retry and got 0 B back
    # (attempts 2): empty_cache would free nothing more, so it must not lead
    "fragmentation": dict(status="oom", requested=40 * MiB, primary="fragmentation",
                          top3_all=["expandable_segments"], not_first=["empty_cache"]),
    "fragmentation_expandable_set": dict(status="oom", requested=40 * MiB, primary="fragmentation",
                                         absent=["expandable_segments"]),
    "other_processes": dict(status="oom", requested=4 * GiB, primary="foreign_memory",
                            top3_all=["foreign_processes"], mentions=("foreign_processes", "4343")),
    "non_framework": dict(status="oom", requested=4 * GiB, primary="non_framework"),
    "growth": dict(status="oom", requested=150 * MiB, cause="growth", top3_all=["release_references"]),
    "cache_held": dict(status="oom", requested=8 * GiB, primary="cache_held", library="libcomm.so"),
    # 10 x 2 GiB cached; 12 GiB fails once; the cache flush frees the 20 GiB; the retry succeeds
    "recovered": dict(status="recovered", requested=12 * GiB,
                      recovery=dict(by=12 * GiB, attempts=1, released=20 * GiB)),
}

failed = 0


def check(ok, what):
    global failed
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failed += 1


def main():
    name, dump_path, truth_path = sys.argv[1:4]
    exp = EXPECT[name]
    d = json.load(open(dump_path))
    truth = [json.loads(l) for l in open(truth_path) if l.strip()]
    dev = d["event"]["device"]
    t = next(x for x in truth if x["device"] == dev)

    check(d["schema"] == "oomguard.dump/1", "schema")
    check(d["status"] == exp["status"], f"status {d['status']} == {exp['status']}")
    check(d["event"]["requested_bytes"] == exp["requested"],
          f"requested {d['event']['requested_bytes']} == {exp['requested']}")
    check(d["device"]["total_bytes"] == t["total_bytes"], "device total == driver")
    check(d["framework"]["name"] == "pytorch", "framework pytorch (OOMGUARD_FRAMEWORK)")
    if exp["status"] == "oom":
        # the process exited right after the failure: the driver's state at exit is the state then
        check(d["device"]["free_bytes"] == t["free_bytes"],
              f"free {d['device']['free_bytes']} == driver {t['free_bytes']}")
        tracked = t["alloc_requested_bytes"] + t["vmm_physical_bytes"] + t["pool_reserved_bytes"]
        check(d["memory"]["process_tracked_bytes"] == tracked,
              f"tracked {d['memory']['process_tracked_bytes']} == driver {tracked}")
        check(d["memory"]["process_used_bytes"] == t["used_bytes"],
              f"process used (NVML) {d['memory']['process_used_bytes']} == driver {t['used_bytes']}")
        check(d["memory"]["other_processes_bytes"] == t["other_process_bytes"],
              f"other processes {d['memory']['other_processes_bytes']} == driver {t['other_process_bytes']}")
        ctx = t["context_bytes"]
        check(d["memory"]["context_bytes_estimate"] == ctx,
              f"context estimate {d['memory']['context_bytes_estimate']} == driver context {ctx}")
        check(d["history"]["peak_bytes"] == t["peak_used_bytes"] - ctx,
              f"peak {d['history']['peak_bytes']} == driver peak - context {t['peak_used_bytes'] - ctx}")
        libsum = sum(x["bytes"] for x in d["memory"]["by_library"])
        check(libsum == tracked, f"by_library sums to tracked ({libsum})")
    ids = [r["id"] for r in d["remedies"]]
    causes = [c["id"] for c in d["diagnosis"]["causes"]]
    if "primary" in exp:
        check(d["diagnosis"]["primary"] == exp["primary"],
              f"primary {d['diagnosis']['primary']} == {exp['primary']} (causes {causes})")
    if "cause" in exp:
        check(exp["cause"] in causes, f"{exp['cause']} among causes {causes}")
    for r in exp.get("top3_all", []):
        check(r in ids[:3], f"{r} in top 3 {ids[:3]}")
    if "top3_any" in exp:
        check(any(r in ids[:3] for r in exp["top3_any"]), f"one of {exp['top3_any']} in top 3 {ids[:3]}")
    for r in exp.get("not_first", []):
        check(not ids or ids[0] != r, f"{r} not ranked first ({ids[:1]})")
    for r in exp.get("absent", []):
        check(r not in ids, f"{r} not suggested (already set) {ids}")
    if "mentions" in exp:
        rid, text = exp["mentions"]
        rem = next((r for r in d["remedies"] if r["id"] == rid), None)
        check(rem is not None and (text in rem["why"] or any(text in h for h in rem["how"])),
              f"{rid} names {text}")
    if "recovery" in exp:
        rv, e = exp["recovery"], d["event"]
        rb = e.get("recovered_by") or {}
        check(rb.get("requested_bytes") == rv["by"], f"recovered_by {rb} == {rv['by']}")
        check(e["attempts"] == rv["attempts"], f"attempts {e['attempts']} == {rv['attempts']}")
        check(e["released_between_attempts_bytes"] == rv["released"],
              f"released between attempts {e['released_between_attempts_bytes']} == {rv['released']}")
        check(d["memory"]["framework_cached_bytes"] == rv["released"]
              and d["memory"].get("framework_cached_source") == "retry_release",
              f"framework cache measured from the retry: {d['memory']['framework_cached_bytes']}")
    if "library" in exp:
        check(d["event"]["library"] == exp["library"], f"failing library {d['event']['library']}")
    check([r["rank"] for r in d["remedies"]] == list(range(1, len(ids) + 1)), "ranks 1..n")
    txt = dump_path[:-5] + ".txt"
    check(open(txt).read().startswith("oomguard"), "text dump next to the JSON")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
