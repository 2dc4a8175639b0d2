#!/usr/bin/env python3
"""Writes N dumps of many jobs, hosts, GPU models, frameworks, statuses and causes
for `oomguard stats` tests, starting from the fixtures (one per status) and
changing the fields stats groups by.

usage: gen_dumps.py OUTDIR N [SEED]

Dumps go to OUTDIR/<job>/<host>/ for most jobs, and a few straight into OUTDIR
and two levels deeper, so that the walk is recursive.  Which values each dump
gets follows from a seeded random generator; the test counts what was written
with its own reader (oracle.py) rather than trusting this script."""
import json
import os
import random
import sys

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures")
TEMPLATES = {
    "oom": "does_not_fit.json",
    "recovered": "recovered.json",
    "warning": "warning.json",
    "exit": "exit_summary.json",
}
CAUSES = ["does_not_fit", "fragmentation", "foreign_memory", "non_framework", "growth", "cache_held", "limit"]
REMEDIES = ["expandable_segments", "mixed_precision", "smaller_batch", "foreign_processes", "empty_cache",
            "gradient_checkpointing", "raise_limit"]
GPUS = ["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3", "NVIDIA L4", "NVIDIA GeForce RTX 4090"]
FRAMEWORKS = ["pytorch", "jax", "cupy", "unknown"]
DAY = 86400.0
START = 1764000000.0  # 2025-11-24


def render(d):
    """The template as text with @@NAME@@ holes: json.dumps once per status, then
    string substitution per dump (10,000 deep copies would make the test slow)."""
    return json.dumps(d)


def main():
    out, n = sys.argv[1], int(sys.argv[2])
    rng = random.Random(int(sys.argv[3]) if len(sys.argv) > 3 else 1)
    texts = {}
    for k, v in TEMPLATES.items():
        d = json.load(open(os.path.join(ROOT, v)))
        d["host"], d["job_id"], d["pid"], d["rank"], d["time"] = "@@HOST@@", "@@JOB@@", "@@PID@@", "@@RANK@@", "@@TIME@@"
        d["device"]["name"], d["framework"]["name"] = "@@GPU@@", "@@FW@@"
        if d.get("event"):
            d["event"]["t"] = "@@EVT@@"
        if k in ("oom", "recovered"):
            d["diagnosis"]["primary"] = d["diagnosis"]["causes"][0]["id"] = "@@CAUSE@@"
            d["remedies"][0]["id"], d["remedies"][0]["title"] = "@@REM@@", "@@REMTITLE@@"
        texts[k] = render(d)
    njobs = max(3, n // 40)
    hosts = ["node-%02d" % i for i in range(max(2, n // 100))]
    for i in range(n):
        job = rng.randrange(njobs)
        status = rng.choices(["oom", "recovered", "warning", "exit"], [6, 2, 1, 3])[0]
        host = hosts[(job * 7 + rng.randrange(2)) % len(hosts)]
        t = START + rng.uniform(0, 14 * DAY)
        sub = {
            "HOST": json.dumps(host),
            "JOB": "null" if job == 0 else json.dumps("job-%04d" % job),
            "PID": str(1000 + i),
            "RANK": str(i % 8),
            "GPU": json.dumps(GPUS[(job + (1 if host.endswith("1") else 0)) % len(GPUS)]),
            "FW": json.dumps(FRAMEWORKS[job % len(FRAMEWORKS)]),
        }
        if status in ("oom", "recovered"):
            cause = rng.choice(CAUSES)
            first = REMEDIES[CAUSES.index(cause) % len(REMEDIES)] if rng.random() < 0.8 else rng.choice(REMEDIES)
            sub.update(CAUSE=json.dumps(cause), REM=json.dumps(first), REMTITLE=json.dumps("Title of " + first))
        if rng.random() < 0.05:
            t = 12.5  # not a plausible epoch time: counted as undated
        sub["TIME"], sub["EVT"] = repr(t), repr(t - 0.25)
        text = texts[status]
        for k, v in sub.items():
            text = text.replace('"@@%s@@"' % k, v)
        if job % 5 == 1:
            path = out  # flat
        elif job % 5 == 2:
            path = os.path.join(out, "deep", "x", "job-%04d" % job)
        else:
            path = os.path.join(out, "job-%04d" % job, host)
        os.makedirs(path, exist_ok=True)
        with open(os.path.join(path, "oomguard-%s-%d-rank%d.json" % (host, 1000 + i, i % 8)), "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
