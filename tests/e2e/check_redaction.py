#!/usr/bin/env python3
"""The table of credential forms (tests/unit/redaction_forms.tsv) through real dumps: one run of the
e2e program under the shim per form, the form's words on its command line or its variable in its
environment; the dump's cmdline / env entry must be the expected one, and no other file written
may hold the secret text.  Usage: check_redaction.py PROG TABLE WORKDIR (LD_PRELOAD set by the
caller's environment as PRELOAD).  Prints "N forms, K as expected"; exit status 1 if K < N."""
import json, os, subprocess, sys

prog, table, work = sys.argv[1:4]
forms = []
for line in open(table, encoding="utf-8"):
    line = line.rstrip("\n")
    if line and not line.startswith("#"):
        forms.append(line.split("\t"))
bad = 0
for n, (kind, given, want) in enumerate(forms, 1):
    d = os.path.join(work, f"form{n}")
    os.makedirs(d, exist_ok=True)
    env = dict(os.environ, OOMGUARD_DIR=d, OOMGUARD_QUIET="1", LD_PRELOAD=os.environ["PRELOAD"])
    argv = [prog, "exit"]
    if kind == "arg":
        argv += given.split("|")
    else:
        name, _, value = given.partition("=")
        env[name] = value
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dumps = [f for f in os.listdir(d) if f.endswith(".json")]
    got = "(no dump)"
    if len(dumps) == 1:
        dump = json.load(open(os.path.join(d, dumps[0]), encoding="utf-8"))
        if kind == "arg":
            got = dump["cmdline"].split(" exit ", 1)[-1]
        else:
            name = given.partition("=")[0]
            got = f"{name}={dump['env'][name]}" if name in dump["env"] else "-"
    if got != want:
        bad += 1
        print(f"form {n} ({kind} {given}):\n   got {got}\n  want {want}")
print(f"{len(forms)} forms, {len(forms) - bad} as expected")
sys.exit(1 if bad else 0)
