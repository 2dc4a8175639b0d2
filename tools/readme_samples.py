#!/usr/bin/env python3
"""The sample outputs in README.md, made by running what they show, so that they cannot go stale.

    python3 tools/readme_samples.py [--check] [--build B]

Each sample sits in README.md between `<!-- sample NAME: ... -->` and `<!-- /sample NAME -->`;
this script runs the command the sample shows and puts its output there (--check: changes
nothing, prints a diff and exits 1 when README.md is not what the runs give; `make test` runs
that).  The runs use the build B (default build), the simulated GPU (B/sim) and the stand-in
torch of the adapter tests (tests/adapter/fake_torch: a caching allocator like PyTorch's that
reaches the GPU through the CUDA runtime).

What differs between any two runs is written as one fixed value: the process id (4242), the
host name (myhost), the checkout's path (left out: paths are relative to it), the
interpreter's path (python), the time of day, the seconds since the process started and the role
scan's count of Python objects and its milliseconds.

Samples:
  python-run     `oomguard run -- python job.py frag`: what the program and oomguard print.
                 Checked on the way: the plain `LD_PRELOAD=B/liboomguard.so python job.py frag`
                 prints the same and its dump says the same (tests/pkg/same_dump.py).
  python-report  `oomguard report` of that dump, up to the first remedy.
"""
import argparse
import difflib
import glob
import json
import os
import re
import socket
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "pkg"))
import same_dump  # noqa: E402

JOB = os.path.join(ROOT, "tests", "adapter", "scenarios", "job.py")
FAKE_TORCH = os.path.join(ROOT, "tests", "adapter", "fake_torch")


def env_for(build, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OOMGUARD_", "SIMGPU_", "PYTORCH_")) and k not in ("LD_PRELOAD", "PYTHONPATH")}
    env.update(LD_LIBRARY_PATH=os.path.join(build, "sim"), SIMGPU_DEVICES="1", SIMGPU_MEM="2560MiB",
               SIMGPU_CTX_OVERHEAD="512MiB", PYTHONPATH=FAKE_TORCH, PYTHONDONTWRITEBYTECODE="1", NO_COLOR="1",
               OOMGUARD_FRAMEWORK="pytorch",
               # the stand-in calls the runtime from its libc10_cuda.so, as PyTorch does (tests/adapter/adapter.mk)
               FAKE_TORCH_LIBC10=os.path.join(build, "tests", "adapter", "libc10_cuda.so"))
    env.update(extra)
    return env


class Normaliser:
    def __init__(self, work):
        self.work = work
        self.pids = set()
        self.host = socket.gethostname()

    def __call__(self, text):
        for pid in sorted(self.pids, key=lambda p: -len(p)):
            text = re.sub(r"\b%s\b" % pid, "4242", text)
        text = text.replace(self.work + "/", "").replace(ROOT + "/", "")
        text = text.replace(os.path.realpath(sys.executable), "python").replace(sys.executable, "python")
        text = re.sub(r"\boomguard-%s-" % re.escape(self.host), "oomguard-myhost-", text)
        text = re.sub(r"\bon %s\b" % re.escape(self.host), "on myhost", text)
        text = re.sub(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC", "2026-11-30 14:02:11 UTC", text)
        text = re.sub(r"\b\d+\.\d+ s\b", "0.4 s", text)
        # the role scan's own cost: objects in the heap and milliseconds vary from run to run
        text = re.sub(r"the scan: [\d,]+ Python objects in [\d.]+ ms", "the scan: 16,001 Python objects in 4.8 ms", text)
        return "\n".join(line.rstrip() for line in text.splitlines()) + "\n"


def run(cmd, env, cwd):
    p = subprocess.run(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                       universal_newlines=True)
    return p.returncode, p.stdout


def one_dump(d):
    files = glob.glob(os.path.join(d, "oomguard-*.json"))
    if len(files) != 1:
        raise SystemExit("readme_samples: %d dumps in %s" % (len(files), d))
    return files[0]


def samples(build):
    og = os.path.join(build, "oomguard")
    lib = os.path.join(build, "liboomguard.so")
    out = {}
    with tempfile.TemporaryDirectory(prefix="oomguard-readme.") as work:
        work = os.path.realpath(work)
        norm = Normaliser(work)
        # the command, as a user types it
        os.symlink(JOB, os.path.join(work, "job.py"))
        rc, text = run([og, "run", "--dir", "oom", "--", sys.executable, "job.py", "frag"], env_for(build), work)
        dump = one_dump(os.path.join(work, "oom"))
        norm.pids.add(str(json.load(open(dump))["pid"]))
        out["python-run"] = "$ oomguard run --dir oom -- python job.py frag\n" + norm(text)
        # the plain preload: the same lines and the same dump
        os.mkdir(os.path.join(work, "plain"))
        rc2, text2 = run([sys.executable, "job.py", "frag"], env_for(build, LD_PRELOAD=lib, OOMGUARD_DIR="plain"), work)
        dump2 = one_dump(os.path.join(work, "plain"))
        norm.pids.add(str(json.load(open(dump2))["pid"]))
        a, b = (same_dump.norm(json.load(open(f))) for f in (dump, dump2))
        differ = list(same_dump.diff(a, b))
        strip = lambda t: [l for l in norm(t).replace("plain/", "oom/").splitlines() if "dump written" not in l]
        if differ or strip(text) != strip(text2) or rc != rc2:
            raise SystemExit("readme_samples: the plain preload and oomguard run disagree:\n%s\n%s" % (
                "\n".join(differ[:10]), "\n".join(difflib.unified_diff(strip(text), strip(text2), lineterm=""))))
        # the report, up to its first remedy
        _, rep = run([og, "report", os.path.relpath(dump, work)], env_for(build), work)
        lines, cut = norm(rep).splitlines(), None
        for i, line in enumerate(lines):
            if re.match(r"^\s+2\. ", line) and any(l.startswith("What to do") for l in lines[:i]):
                cut = i
                break
        lines = lines[:cut] + ["  ..."] if cut else lines
        out["python-report"] = "$ oomguard report oom/%s\n" % os.path.basename(norm(dump).strip()) + "\n".join(lines) + "\n"
    return out


def fill(readme, made):
    def block(m):
        name = m.group(2)
        if name not in made:
            raise SystemExit("readme_samples: README.md has a sample '%s' this script does not make" % name)
        return "%s\n```\n%s```\n%s" % (m.group(1), made[name], m.group(4))
    pat = re.compile(r"(<!-- sample ([\w-]+):[^>]*-->)\n(.*?)(<!-- /sample \2 -->)", re.S)
    found = {m.group(2) for m in pat.finditer(readme)}
    missing = set(made) - found
    if missing:
        raise SystemExit("readme_samples: README.md lacks the sample(s) %s" % ", ".join(sorted(missing)))
    return pat.sub(block, readme)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 with a diff when README.md is stale")
    ap.add_argument("--build", default="build", help="build directory (default build)")
    args = ap.parse_args()
    build = os.path.abspath(os.path.join(ROOT, args.build))
    path = os.path.join(ROOT, "README.md")
    old = open(path, encoding="utf-8").read()
    new = fill(old, samples(build))
    if args.check:
        if new != old:
            sys.stdout.writelines(difflib.unified_diff(old.splitlines(True), new.splitlines(True), "README.md",
                                                       "README.md (as the runs give it)"))
            print("README.md's samples are stale: python3 tools/readme_samples.py rewrites them")
            return 1
        print("README.md's samples are what the runs give")
        return 0
    if new != old:
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            f.write(new)
        os.replace(path + ".tmp", path)
        print("README.md: samples rewritten")
    else:
        print("README.md: samples unchanged")
    return 0


if __name__ == "__main__":
    sys.exit(main())
