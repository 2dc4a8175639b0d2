#!/usr/bin/env python3
"""Runs the scenario corpus: every tests/scenarios/cases/NAME.json, in each of its modes
("preload": the plain LD_PRELOAD=liboomguard.so contract; "run": under `oomguard run`), and checks
the dumps with check.py.  Ends with "N passed, N failed, N xfail".

usage: run_scenarios.py [NAME ...]      (default: every case)
environment: B (build directory, default build), PRELOAD (what goes into LD_PRELOAD; default
$B/liboomguard.so), SANITIZE=1, SCEN_STATUS=FILE (also write a status report for the rule
writers), SCEN_KEEP=DIR (keep every run's dumps and logs there)."""
import glob
import json
import re
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
B = os.environ.get("B", "build")
BDIR = B if os.path.isabs(B) else os.path.join(ROOT, B)
BIN = os.path.join(BDIR, "tests", "scenarios")
PRELOAD = os.environ.get("PRELOAD") or os.path.join(BDIR, "liboomguard.so")
if os.environ.get("SANITIZE") == "1" and not os.environ.get("PRELOAD"):
    # the sanitizer runtime must come first in the initial library list (as tests/run_tests.sh does)
    asan = subprocess.run([os.environ.get("CC", "cc"), "-print-file-name=libasan.so"], stdout=subprocess.PIPE,
                          universal_newlines=True).stdout.strip()
    PRELOAD = asan + " " + PRELOAD
    os.environ.setdefault("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1:verify_asan_link_order=0")
    os.environ.setdefault("UBSAN_OPTIONS", "print_stacktrace=1:halt_on_error=1")
elif os.environ.get("SANITIZE") == "thread" and not os.environ.get("PRELOAD"):
    tsan = subprocess.run([os.environ.get("CC", "cc"), "-print-file-name=libtsan.so"], stdout=subprocess.PIPE,
                          universal_newlines=True).stdout.strip()
    PRELOAD = tsan + " " + PRELOAD
    os.environ.setdefault("TSAN_OPTIONS", "halt_on_error=1:exitcode=66:report_signal_unsafe=0:suppressions=%s"
                          % os.path.join(ROOT, "tests", "tsan.supp"))
# TSan's runtime must be the first library of the process and `oomguard run` puts the shim
# first (docs/testing.md): in that build only the plain LD_PRELOAD mode runs
SKIP_MODES = {"run"} if os.environ.get("SANITIZE") == "thread" else set()
PRELOAD = " ".join(p if os.path.isabs(p) else os.path.join(ROOT, p) for p in PRELOAD.split())
OOMGUARD = os.path.join(BDIR, "oomguard")
TIMEOUT = 180

# nothing of the caller's configuration leaks into a scenario
SCRUB = ("OOMGUARD_", "PYTORCH_", "XLA_", "TF_", "SIMGPU_", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
         "MASTER_", "TORCHELASTIC_", "SLURM_", "OMPI_", "PMI_", "CUDA_VISIBLE_DEVICES", "JAX_", "LD_PRELOAD", "SCEN_")


def base_env():
    env = {k: v for k, v in os.environ.items() if not any(k == s or k.startswith(s) for s in SCRUB)}
    sim = os.path.join(BDIR, "sim")
    env["LD_LIBRARY_PATH"] = sim + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["SIMGPU_DEVICES"] = "1"
    env["SIMGPU_MEM"] = "24GiB"
    # the stand-in torch calls the runtime from its libc10_cuda.so, as PyTorch does (tests/adapter/adapter.mk);
    # FAKE_TORCH_LIBC10= (empty) in the caller's environment measures it calling through ctypes (libffi)
    env.setdefault("FAKE_TORCH_LIBC10", os.path.join(BDIR, "tests", "adapter", "libc10_cuda.so"))
    # and so do the stand-in JAX, CuPy and TensorFlow from the libraries their real counterparts allocate from
    env.setdefault("FAKE_JAX_XLA_EXTENSION", os.path.join(BDIR, "tests", "adapter", "jaxlib", "xla_extension.so"))
    env.setdefault("FAKE_CUPY_MEMORY", os.path.join(BDIR, "tests", "adapter", "cupy", "cuda", "memory.so"))
    env.setdefault("FAKE_TF_FRAMEWORK", os.path.join(BDIR, "tests", "adapter", "tensorflow",
                                                     "libtensorflow_framework.so.2"))
    return env


def subst(s, vals):
    for k, v in vals.items():
        s = s.replace("{%s}" % k, v)
    return s


def run_case(name, case, mode, work, cases_dir=None):
    """Runs one case in one mode; returns (ok, lines of detail, summary for the status file).
    cases_dir: where NAME.json lies (default: cases/; the blind set lies in blind/)."""
    dumps, truth, state = (os.path.join(work, x) for x in ("dumps", "truth", "state"))
    for p in (dumps, truth, state):
        os.makedirs(p, exist_ok=True)
    vals = {"bin": BIN, "work": work, "state": state, "src": HERE}
    env = base_env()
    for k, v in case.get("env", {}).items():
        env[k] = subst(str(v), vals)
    env["SCEN_TRUTH"] = truth
    if case.get("hide_libs"):
        # a machine without those libraries (e.g. a container without NVML): the simulator's
        # directory minus them comes first in the library path
        libdir = os.path.join(work, "lib")
        os.makedirs(libdir, exist_ok=True)
        sim = os.path.join(BDIR, "sim")
        for f in os.listdir(sim):
            if f not in case["hide_libs"]:
                os.symlink(os.path.join(sim, f), os.path.join(libdir, f))
        # every entry naming the simulator's directory goes (the test runner exports it too)
        rest = [p for p in env["LD_LIBRARY_PATH"].split(":")
                if p and os.path.realpath(p) != os.path.realpath(sim)]
        env["LD_LIBRARY_PATH"] = ":".join([libdir] + rest)
    detail = []
    bg = None
    extra = []
    if "background" in case:
        b = case["background"]
        benv = dict(env)
        for k, v in b.get("env", {}).items():
            benv[k] = subst(str(v), vals)
        ready = os.path.join(work, "ready")
        benv["SCEN_READY"] = ready
        bg = subprocess.Popen([subst(a, vals) for a in b["argv"]], env=benv, stdout=open(os.path.join(work, "bg.log"), "w"),
                              stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.time()
        while not os.path.exists(ready) and time.time() - t0 < 60 and bg.poll() is None:
            time.sleep(0.02)
        if not os.path.exists(ready):
            bg.kill()
            return False, ["the background process did not get ready: " + open(os.path.join(work, "bg.log")).read()[-500:]], None
        extra.append("bg_pid=%d" % bg.pid)
    argv = [subst(a, vals) for a in case["argv"]]
    if mode == "preload":
        env["LD_PRELOAD"] = PRELOAD
        env["OOMGUARD_DIR"] = dumps
    elif mode == "run":
        if os.environ.get("SANITIZE") == "1":
            env["ASAN_OPTIONS"] = env.get("ASAN_OPTIONS", "detect_leaks=0:abort_on_error=1") + ":verify_asan_link_order=0"
            # a program that does not link the sanitizer runtime (python) gets it preloaded;
            # `oomguard run` puts the shim first and keeps these after it
            rt = " ".join(p for p in PRELOAD.split() if "liboomguard" not in os.path.basename(p))
            if rt:
                env["LD_PRELOAD"] = rt
        argv = [OOMGUARD, "run", "--dir", dumps, "--"] + argv
    else:
        return False, ["unknown mode " + mode], None
    log = os.path.join(work, "out.log")
    p = subprocess.Popen(argv, env=env, stdout=open(log, "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        rc = p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        rc = "timeout"
        try:
            os.killpg(p.pid, signal.SIGKILL)     # the whole job: launcher and ranks
        except OSError:
            pass
        p.wait()
    finally:
        if bg is not None:
            try:
                os.killpg(bg.pid, signal.SIGTERM)
            except OSError:
                pass
            bg.wait()
    ok = True
    want = case.get("exit", 1)
    if rc != want:
        ok = False
        lines = open(log, errors="replace").read().splitlines()
        # a crash or sanitizer report says more than the last lines
        why = [l for l in lines if any(k in l for k in ("runtime error", "SUMMARY:", "malloc()", "free()", "ERROR:",
                                                        "Segmentation", "Aborted", "double free", "corrupted"))]
        detail.append("FAIL exit status %s, expected %s%s" % (rc, want, (": " + " / ".join(why[:3])) if why else ""))
        detail += ["  | " + l for l in lines[-15:]]
    # the stderr summary: at most five remedies in full, the rest named on one "also possible" line
    text = open(log, errors="replace").read()
    if re.search(r"^oomguard:   ([6-9]|\d\d+)\. ", text, re.M):
        ok = False
        detail.append("FAIL the stderr summary prints more than five remedies in full")
    folded = lambda d: [r for r in d.get("remedies", []) if not r.get("shown", r["rank"] <= 5)]
    folds = any(folded(json.load(open(f))) for f in glob.glob(os.path.join(dumps, "oomguard-*.json"))
                if json.load(open(f)).get("status") == "oom")
    if "oomguard: diagnosis:" in text and folds and "oomguard:   also possible: " not in text:
        ok = False
        detail.append("FAIL the stderr summary does not fold the remedies not shown under 'also possible'")
    # the text dump: the remedies not shown (past five, or not enough alone) one line each under "also possible",
    # without their why
    for f in glob.glob(os.path.join(dumps, "oomguard-*.json")):
        d = json.load(open(f))
        txt = open(f[:-5] + ".txt", errors="replace").read() if os.path.exists(f[:-5] + ".txt") else None
        rems = folded(d)
        if txt is None or not d.get("remedies"):
            continue
        if ("\nalso possible\n" in txt) != bool(rems) or any(r["why"] and r["why"] in txt for r in rems):
            ok = False
            detail.append("FAIL the text dump %s does not fold the remedies not shown" % os.path.basename(f))
    top3 = os.path.join(work, "top3")
    chk = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), os.path.join(cases_dir or os.path.join(HERE, "cases"), name + ".json"),
                          mode, dumps, truth, "--top3-out", top3] + extra, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, universal_newlines=True)
    out = chk.stdout.splitlines()
    if chk.returncode != 0:
        ok = False
    detail += [l for l in out if l.startswith(("FAIL", "dump", "checks", "Traceback", "  ", "Error", "KeyError"))
               or "Error" in l]
    got = next((l for l in out if l.startswith("dump ")), "no dump")
    return ok, detail, got


def main():
    names = sys.argv[1:] or sorted(os.path.basename(f)[:-5] for f in glob.glob(os.path.join(HERE, "cases", "*.json")))
    keep = os.environ.get("SCEN_KEEP")
    tmp = keep or tempfile.mkdtemp(prefix="oomguard-scenarios.")
    npass = nfail = nxfail = nxpass = nskip = 0
    status = []
    top3 = {}
    cases = {}
    passed_runs = []
    for name in names:
        case = json.load(open(os.path.join(HERE, "cases", name + ".json")))
        cases[name] = case
        for mode in case.get("modes", ["preload"]):
            if mode in SKIP_MODES:
                nskip += 1
                print("SKIP  %s [%s]: not in the ThreadSanitizer build (oomguard run puts the shim before TSan)"
                      % (name, mode))
                continue
            work = os.path.join(tmp, "%s.%s" % (name, mode))
            shutil.rmtree(work, ignore_errors=True)
            os.makedirs(work)
            t0 = time.time()
            ok, detail, got = run_case(name, case, mode, work)
            try:
                top3[(name, mode)] = open(os.path.join(work, "top3")).read().split()
            except OSError:
                pass
            xf = case.get("xfail")
            if isinstance(xf, dict):
                xf = xf.get(mode)
            label = "%s [%s] (%.1f s)" % (name, mode, time.time() - t0)
            if ok and not xf:
                npass += 1
                print("PASS  " + label)
                passed_runs.append((name, mode, work))
            elif ok and xf:
                npass += 1
                nxpass += 1
                print("XPASS " + label + ": marked as a known failure (%s) but passes now" % xf)
            elif xf:
                nxfail += 1
                print("XFAIL " + label + ": " + xf)
                for l in detail:
                    print("      | " + l)
            else:
                nfail += 1
                print("FAIL  " + label)
                for l in detail:
                    print("      | " + l)
            if not ok:
                status.append((name, mode, case, got, [l for l in detail if l.startswith("FAIL")], xf))
    # the checker itself must be able to fail: doctored copies of a passing run's dump
    if passed_runs:
        name, mode, work = passed_runs[0]
        for what, doctor in DOCTORS:
            ok, why = doctored_check(name, mode, work, doctor)
            label = "checker rejects a doctored dump (%s) of %s [%s]" % (what, name, mode)
            if ok:
                npass += 1
                print("PASS  " + label)
            else:
                nfail += 1
                print("FAIL  " + label + ": " + why)
    # cross-case: a 3% and a 4x shortfall do not get the same advice
    for name, case in cases.items():
        other = case.get("differs_from")
        if not other:
            continue
        for mode in case.get("modes", ["preload"]):
            a, b = top3.get((name, mode)), top3.get((other, mode))
            if a is None or b is None:
                continue
            label = "%s [%s] top 3 differs from %s's" % (name, mode, other)
            if a != b:
                npass += 1
                print("PASS  %s (%s vs %s)" % (label, a, b))
            else:
                xf = case.get("xfail_differs")
                if xf:
                    nxfail += 1
                    print("XFAIL %s: both %s (%s)" % (label, a, xf))
                else:
                    nfail += 1
                    print("FAIL  %s: both %s" % (label, a))
                status.append((name, mode, case, "top3 %s == %s's" % (a, other), ["FAIL the same top 3 as " + other], xf))
    if os.environ.get("SCEN_STATUS"):
        write_status(os.environ["SCEN_STATUS"], status, npass, nfail, nxfail)
    if not keep:
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed, %d xfail%s%s" % (npass, nfail, nxfail, (", %d xpass" % nxpass) if nxpass else "",
                                                (", %d skipped" % nskip) if nskip else ""))
    sys.exit(1 if nfail else 0)


def _bump_free(d):
    d["device"]["free_bytes"] += 2 << 20


def _na_text(d):
    d["remedies"][0]["why"] = (d["remedies"][0].get("why") or "") + " n/a of the cache"


def _wrong_primary(d):
    d["diagnosis"]["primary"] = "no_such_cause"


def _lib_sum(d):
    d["memory"]["by_library"][0]["bytes"] += 1 << 20


DOCTORS = [("free bytes off by 2 MiB", _bump_free), ("'n/a of' in a remedy", _na_text),
           ("a primary no expert accepts", _wrong_primary), ("by_library off by 1 MiB", _lib_sum)]


def doctored_check(name, mode, work, doctor):
    """Copies a passing run's dumps, changes one thing, and expects check.py to fail on it."""
    src = os.path.join(work, "dumps")
    dst = os.path.join(work, "doctored")
    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    for f in glob.glob(os.path.join(dst, "oomguard-*.json")):
        d = json.load(open(f))
        if d.get("status") not in ("oom", "recovered"):
            continue
        doctor(d)
        json.dump(d, open(f, "w"))
    chk = subprocess.run([sys.executable, os.path.join(HERE, "check.py"), os.path.join(HERE, "cases", name + ".json"),
                          mode, dst, os.path.join(work, "truth")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                         universal_newlines=True)
    if chk.returncode == 1 and "FAIL " in chk.stdout:
        return True, ""
    return False, "check.py exit %d: %s" % (chk.returncode, chk.stdout.splitlines()[-1:] if chk.stdout else "")


def write_status(path, status, npass, nfail, nxfail):
    lines = ["# Scenario corpus status (tests/scenarios, written by run_scenarios.py)", "",
             "%s UTC: %d passed, %d failed, %d xfail.  One entry per failing scenario/mode: what the expert "
             "expects, what the dump said, the failed checks.  Re-run one: `B=build-x python3 "
             "tests/scenarios/run_scenarios.py NAME` (SCEN_KEEP=DIR keeps the dumps)." %
             (time.strftime("%H:%M", time.gmtime()), npass, nfail, nxfail), ""]
    # the same check failing in many cases is usually one rule or one text: list those first
    import re
    common = {}
    for name, mode, case, got, fails, xf in status:
        for f in fails:
            key = re.sub(r"\(primary .*$", "", re.sub(r"[0-9][0-9.]*", "N", f)).strip()
            common.setdefault(key, set()).add(name)
    rows = sorted(((len(v), k, v) for k, v in common.items() if len(v) > 1), reverse=True)
    if rows:
        lines.append("## Checks failing in several cases")
        for n, k, v in rows[:12]:
            lines.append("- %d cases: %s  (%s)" % (n, k[:200], ", ".join(sorted(v))[:300]))
        lines.append("")
    for name, mode, case, got, fails, xf in status:
        e = case.get("expect", {})
        want = []
        if "primary" in e:
            want.append("primary in %s" % e["primary"])
        if e.get("top3_required"):
            want.append("top3 has %s" % " and ".join("/".join(x) if isinstance(x, list) else x for x in e["top3_required"]))
        if e.get("top3_forbidden"):
            want.append("top3 without %s" % ",".join(e["top3_forbidden"]))
        if e.get("top3_text_required"):
            want.append("top3 text %s" % e["top3_text_required"])
        lines.append("## %s [%s]%s" % (name, mode, " (XFAIL: %s)" % xf if xf else ""))
        lines.append("- case: %s" % case.get("title", ""))
        lines.append("- expert expects: %s" % ("; ".join(want) or "see cases/%s.json" % name))
        lines.append("- got: %s" % got)
        if case.get("hint"):
            lines.append("- hint: %s" % case["hint"])
        for f in fails[:8]:
            lines.append("- %s" % f)
        lines.append("")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(lines) + "\n")
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    main()
