#!/usr/bin/env python3
"""An independent count of the dumps under some directories, to check
`oomguard stats --format json` against: Python's json module, os.walk, and the
rules of docs/cli.md (files named oomguard-*.json; a file that is not a valid
dump object with schema oomguard.dump/1 is skipped; missing values are "none"
for cause and job, "unknown" for host, GPU model and framework).

usage: oracle.py STATS.json DIR...   exits 0 when the counts agree, else prints
the differences and exits 1."""
import collections
import json
import os
import sys

CLS = ["oom", "recovered", "warning", "exit"]


def count(dirs):
    res = {"dumps": 0, "by_status": collections.Counter(), "by_cause": collections.Counter(),
           "recovered_by_cause": collections.Counter(), "first_remedies": collections.Counter()}
    groups = {k: collections.defaultdict(collections.Counter) for k in ("by_job", "by_host", "by_gpu_model", "by_framework")}
    for top in dirs:
        for dirpath, _, files in os.walk(top):
            for name in files:
                if not (name.startswith("oomguard-") and name.endswith(".json") and len(name) > 14):
                    continue
                try:
                    d = json.load(open(os.path.join(dirpath, name)))
                except (ValueError, OSError, RecursionError):
                    continue
                if not isinstance(d, dict) or d.get("schema") != "oomguard.dump/1":
                    continue
                st = d.get("status")
                res["dumps"] += 1
                res["by_status"][st] += 1
                diag = d.get("diagnosis") or {}
                cause = diag.get("primary") or "none"
                if st == "oom":
                    res["by_cause"][cause] += 1
                    rem = [r for r in d.get("remedies") or [] if r.get("id")]
                    if rem:
                        res["first_remedies"][min(rem, key=lambda r: r.get("rank", 1 << 30))["id"]] += 1
                elif st == "recovered":
                    res["recovered_by_cause"][cause] += 1
                keys = {
                    "by_job": d.get("job_id") or "none",
                    "by_host": d.get("host") or "unknown",
                    "by_gpu_model": (d.get("device") or {}).get("name") or "unknown",
                    "by_framework": (d.get("framework") or {}).get("name") or "unknown",
                }
                for g, k in keys.items():
                    groups[g][k]["dumps"] += 1
                    groups[g][k][st if st in CLS else "other"] += 1
    res.update(groups)
    return res


def main():
    got = json.load(open(sys.argv[1]))
    want = count(sys.argv[2:])
    errors = []

    def eq(what, a, b):
        if a != b:
            errors.append("%s: stats says %r, the files say %r" % (what, a, b))

    eq("dumps", got["dumps"], want["dumps"])
    for k in CLS:
        eq("by_status.%s" % k, got["by_status"].get(k), want["by_status"].get(k, 0))
    eq("by_cause", got["by_cause"], dict(want["by_cause"]))
    eq("recovered_by_cause", got["recovered_by_cause"], dict(want["recovered_by_cause"]))
    eq("first_remedies", {r["id"]: r["failures"] for r in got["first_remedies"]}, dict(want["first_remedies"]))
    for g in ("by_job", "by_host", "by_gpu_model", "by_framework"):
        eq(g + " keys", sorted(got[g]), sorted(want[g]))
        for k, c in want[g].items():
            row = got[g].get(k, {})
            for f in ["dumps"] + CLS:
                eq("%s[%r].%s" % (g, k, f), row.get(f), c.get(f, 0))
    for e in errors[:30]:
        print(e)
    ngroups = sum(len(want[g]) for g in ("by_job", "by_host", "by_gpu_model", "by_framework"))
    print("%d dumps, %d groups compared, %d differences" % (want["dumps"], ngroups, len(errors)))
    sys.exit(1 if errors else 0)


if __name__ == "__main__":
    main()
