#!/usr/bin/env python3
"""Mutation testing of oomguard: does the suite turn red when the code is wrong?

Each mutant in tests/mutate/mutants.txt is one small, plausible bug: an exact snippet of a
file in shim/, analysis/, common/ or tools/ and what replaces it.  For every mutant, alone:

  1. a clean copy of the tree (files git tracks or would track, as they are now, with the
     baseline build) is made in a temporary directory, with its own build directory;
  2. the snippet is replaced (it must occur exactly once, else the mutant is "stale");
  3. the copy is rebuilt (make's timestamps rebuild only what the change touches);
  4. the suites that exercise that file run, one after the other, until one fails.

killed: a suite failed (or hung past its timeout).  survived: every suite passed.
stale: the snippet is not in the file any more (the code changed: update the mutant).
broken: the mutant does not compile (fix the mutant; not counted).
score = killed / (killed + survived).

Usage: tests/mutate/mutate.py [--only ID,ID] [--match REGEX] [--fast] [--check] [--keep]
  --fast    leave out the two slowest suites (scenario corpus, PyTorch adapter: ~20 s each)
  --check   only report which mutants are stale (no build, no tests)
  --jobs N  make -j N (default 2)
  --suites S,S  only these suites (does this suite alone kill the mutant?)
The campaign runs one mutant at a time under `nice`; see tests/README.md."""
import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
B = "build-mutate"

# Which suites exercise which sources, in the order they run (fast and sharp first).
# `stats` (tools/stats.c, ~2 min a run) is not in the list: no mutant is in that file.
SUITES = {
    "shim": ["unit", "regress", "e2e", "limit", "drivers", "stacks", "scenarios", "launcher", "dumps", "corpus",
             "adapter"],
    "tools": ["regress", "cli", "scenarios", "launcher"],
    # the Python adapter: its role and phase code on real torch objects first, then on the stand-in under the shim
    "adapters": ["real_torch", "adapter", "corpus"],
}
SLOW = {"corpus", "adapter", "real_torch"}


def suite_group(path):
    return "tools" if path.startswith("tools/") else "adapters" if path.startswith("adapters/") else "shim"
# FAIL lines that measure the machine, not the code (ignored when deciding a kill)
IGNORE_FAIL = re.compile(r"FAIL\s+(perf:|html renders in headless Chromium)")
EXTRA_TARGETS = [f"{B}/cli-test/og-measure", f"{B}/cli-test/libdummy.so"]


class Mutant:
    def __init__(self, mid, line):
        self.id, self.line = mid, line
        self.file = self.bug = self.note = None
        self.old, self.new = [], []

    @property
    def original(self):
        return "\n".join(self.old)

    @property
    def replacement(self):
        return "\n".join(self.new)


def parse(path):
    """== ID / file: / bug: / note: / '- ' original lines / '+ ' replacement lines."""
    mutants, m = [], None
    for n, raw in enumerate(open(path, encoding="utf-8"), 1):
        line = raw.rstrip("\n")
        if line.startswith("#") or (not line.strip() and m is None):
            continue
        if line.startswith("== "):
            m = Mutant(line[3:].strip(), n)
            mutants.append(m)
        elif m is None:
            sys.exit(f"{path}:{n}: text before the first '== ID'")
        elif line.startswith("file: "):
            m.file = line[6:].strip()
        elif line.startswith("bug: "):
            m.bug = line[5:].strip()
        elif line.startswith("note: "):
            m.note = line[6:].strip()
        elif line == "-" or line.startswith("- "):
            m.old.append(line[2:])
        elif line == "+" or line.startswith("+ "):
            m.new.append(line[2:])
        elif not line.strip():
            continue
        else:
            sys.exit(f"{path}:{n}: cannot read {line!r}")
    ids = set()
    for m in mutants:
        if not (m.file and m.bug and m.old):
            sys.exit(f"{path}:{m.line}: mutant {m.id} needs file:, bug: and '- ' lines")
        if m.id in ids:
            sys.exit(f"{path}:{m.line}: duplicate id {m.id}")
        if m.original == m.replacement:
            sys.exit(f"{path}:{m.line}: mutant {m.id} changes nothing")
        ids.add(m.id)
    return mutants


def occurrences(m, tree):
    try:
        text = open(os.path.join(tree, m.file), encoding="utf-8").read()
    except OSError:
        return 0, None
    return text.count(m.original), text


def tree_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT,
                         capture_output=True, check=True).stdout.decode()
    return [f for f in out.split("\0") if f and os.path.isfile(os.path.join(ROOT, f))]


def sh(cmd, cwd, log, timeout=None):
    t0 = time.time()
    with open(log, "w") as f:
        try:
            p = subprocess.run(["nice", "-n", "10"] + cmd, cwd=cwd, stdout=f, stderr=subprocess.STDOUT,
                               timeout=timeout, start_new_session=True)
            rc = p.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    return rc, time.time() - t0


def build(tree, log, jobs, need):
    """make -k: a target someone else is half-way through editing must not stop the run;
    what counts is that the artifacts built from the mutated sources are up to date."""
    sh(["make", "-k", f"-j{jobs}", f"B={B}", "test-build"] + EXTRA_TARGETS, tree, log)
    rc, _ = sh(["make", "-q", f"B={B}"] + need, tree, log + ".q")
    return rc == 0


def artifacts(path):
    return [f"{B}/oomguard"] if path.startswith("tools/") else [f"{B}/liboomguard.so"]


def fail_keys(log):
    """The failures a suite reported, as keys that survive re-runs (digits dropped: counts,
    sizes and timings in a test's name change from run to run)."""
    keys = set()
    for l in open(log, errors="replace"):
        l = l.strip()
        if re.match(r"(FAIL|\[  FAILED  \] [^0-9])", l) and not IGNORE_FAIL.match(l):
            keys.add(re.sub(r"[0-9]+", "#", l)[:160])
    return keys


def run_suite(tree, suite, log, timeout):
    rc, dt = sh(["env", f"B={B}", "bash", "tests/mutate/suites.sh", suite], tree, log, timeout)
    if rc == "timeout":
        return rc, set(), dt
    return rc, fail_keys(log), dt


def verdict(base, rc, keys):
    """Killed when the mutant fails a test the unmutated tree passes (tests that already fail
    there, e.g. while someone is half-way through a change, are not counted), hangs, or
    makes a suite that passed fail without naming a test (a crash)."""
    if rc == "timeout":
        return "timeout"
    new = keys - base[1]
    if new:
        return sorted(new)[0][:100]
    if rc != 0 and base[0] == 0:
        return f"exit {rc}"
    return ""


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mutants", default=os.path.join(ROOT, "tests/mutate/mutants.txt"))
    ap.add_argument("--only", default="")
    ap.add_argument("--match", default="")
    ap.add_argument("--fast", action="store_true")
    ap.add_argument("--check", action="store_true")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--suites", default="", help="only these suites (comma-separated), e.g. to check that one "
                                                 "suite alone kills a mutant")
    ap.add_argument("--report", default=os.path.join(ROOT, B, "mutate-report.txt"))
    a = ap.parse_args()

    mutants = parse(a.mutants)
    if a.only:
        want = set(a.only.split(","))
        mutants = [m for m in mutants if m.id in want]
    if a.match:
        mutants = [m for m in mutants if re.search(a.match, m.id)]

    if a.check:
        stale = 0
        for m in mutants:
            n, _ = occurrences(m, ROOT)
            if n != 1:
                stale += 1
                print(f"stale  {m.id:40s} {m.file}: snippet found {n} times")
        print(f"{len(mutants)} mutants, {stale} stale")
        return 1 if stale else 0

    tmp = tempfile.mkdtemp(prefix="oomguard-mutate.")
    os.chmod(tmp, 0o755)          # tests run some programs as an unprivileged user
    base, work, logs = (os.path.join(tmp, d) for d in ("base", "work", "logs"))
    os.makedirs(logs)
    print(f"copying the tree to {base}")
    for f in tree_files():
        os.makedirs(os.path.dirname(os.path.join(base, f)), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, f), os.path.join(base, f))
    print(f"baseline: make B={B} test-build")
    if not build(base, os.path.join(logs, "baseline-build.log"), a.jobs, [f"{B}/liboomguard.so", f"{B}/oomguard"]):
        sys.exit(f"the unmutated tree does not build: {logs}/baseline-build.log")

    slow = SLOW if a.fast else set()
    if a.suites:
        slow |= set(sum(SUITES.values(), [])) - set(a.suites.split(","))
    timeouts, baseline, dropped = {}, {}, []
    for suite in dict.fromkeys(sum(SUITES.values(), [])):
        if suite in slow:
            continue
        rc, keys, dt = run_suite(base, suite, os.path.join(logs, f"baseline-{suite}.log"), 900)
        state = "pass" if rc == 0 else f"exit {rc}, {len(keys)} failing test(s) not counted"
        print(f"baseline {suite:10s} {state} ({dt:.1f} s)")
        for k in sorted(keys):
            print(f"    already failing: {k}")
        if rc == "timeout" or (rc != 0 and not keys):
            dropped.append(suite)
        else:
            timeouts[suite] = max(60.0, 4 * dt)
            baseline[suite] = (rc, keys)
    if dropped:
        print(f"WARNING: suites that fail on the unmutated tree without naming a test are left out: "
              f"{' '.join(dropped)}")

    results = []
    t_start = time.time()
    for i, m in enumerate(mutants, 1):
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run(["cp", "-a", base, work], check=True)
        n, text = occurrences(m, work)
        suites = [s for s in SUITES[suite_group(m.file)] if s in timeouts]
        if n != 1:
            results.append((m, "stale", f"snippet found {n} times", 0.0))
        else:
            path = os.path.join(work, m.file)
            with open(path, "w", encoding="utf-8") as f:
                f.write(text.replace(m.original, m.replacement))
            t0 = time.time()
            if not build(work, os.path.join(logs, f"{m.id.replace('/', '_')}-build.log"), a.jobs, artifacts(m.file)):
                results.append((m, "broken", "does not compile", time.time() - t0))
            else:
                verdict_, why = "survived", ""
                for s in suites:
                    rc, keys, _ = run_suite(work, s, os.path.join(logs, f"{m.id.replace('/', '_')}-{s}.log"),
                                            timeouts[s])
                    reason = verdict(baseline[s], rc, keys)
                    if reason and rc != "timeout":
                        # confirm on the unmutated copy: what fails there as well is a flaky test
                        # (a busy machine, a race in the test), not the mutant's doing
                        rc_b, keys_b, _ = run_suite(base, s, os.path.join(logs, f"{m.id.replace('/', '_')}-{s}-"
                                                                          "unmutated.log"), timeouts[s])
                        flaky = (keys - baseline[s][1]) & keys_b
                        if flaky or (rc_b != 0 and not (keys - baseline[s][1])):
                            for k in sorted(flaky):
                                print(f"    flaky (fails unmutated too, no longer counted): {k}")
                            baseline[s] = (baseline[s][0] if rc_b == 0 else rc_b, baseline[s][1] | flaky)
                            reason = verdict(baseline[s], rc, keys)
                    if reason:
                        verdict_, why = "killed", f"{s}: {reason}"
                        break
                results.append((m, verdict_, why, time.time() - t0))
        r = results[-1]
        print(f"[{i:3d}/{len(mutants)}] {r[1]:8s} {m.id:40s} {r[3]:5.0f} s  {r[2]}", flush=True)

    killed = sum(1 for r in results if r[1] == "killed")
    survived = [r for r in results if r[1] == "survived"]
    stale = [r for r in results if r[1] == "stale"]
    broken = [r for r in results if r[1] == "broken"]
    scored = killed + len(survived)
    score = 100.0 * killed / scored if scored else 0.0
    lines = [f"oomguard mutation run, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}, "
             f"{len(results)} mutants, {time.time() - t_start:.0f} s",
             f"suites: shim {' '.join(s for s in SUITES['shim'] if s in timeouts)}; "
             f"tools {' '.join(s for s in SUITES['tools'] if s in timeouts)}; "
             f"adapters {' '.join(s for s in SUITES['adapters'] if s in timeouts)}"
             + (f"; left out (failing unmutated): {' '.join(dropped)}" if dropped else "")
             + ("; --fast: corpus and adapter left out" if a.fast else ""),
             f"killed {killed}, survived {len(survived)}, stale {len(stale)}, broken {len(broken)}",
             f"mutation score: {score:.1f}% ({killed}/{scored})"]
    for title, rows in (("survived", survived), ("stale", stale), ("broken", broken)):
        if rows:
            lines.append(f"{title}:")
            for m, _, why, _ in rows:
                lines.append(f"  {m.id} ({m.file}): {m.bug}" + (f" [{why}]" if why else "")
                             + (f"\n      note: {m.note}" if m.note else ""))
    lines.append("all:")
    for m, v, why, dt in results:
        lines.append(f"  {v:8s} {m.id:40s} {why}")
    report = "\n".join(lines) + "\n"
    print()
    print(report)
    try:
        os.makedirs(os.path.dirname(a.report), exist_ok=True)
        with open(a.report, "w") as f:
            f.write(report)
        print(f"report: {a.report}")
    except OSError as e:
        print(f"cannot write {a.report}: {e}")
    if a.keep:
        print(f"kept: {tmp}")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
