#!/usr/bin/env python3
"""Every documented key of memory.framework.roles is read by `oomguard report`.

  python3 check_roles_read.py OOMGUARD FIXTURE.json DUMP_FORMAT.md

The keys come from docs/dump-format.md (the writer's contract, not a list of this test's own): every
key of the `memory.framework.roles` table (its first column), the keys of the objects its arrays and
objects hold (the first `{ "a", "b" }` of the row's meaning), and memory.framework.other_frameworks
with its element keys.  The fixture gives every one of them a value; removing a key (a sub-key: from
every element) must change the text or the HTML report, and removing a key of the table must change
both.  Prints nothing when every key is read; else one line per key that is not."""
import json
import os
import re
import subprocess
import sys
import tempfile


def documented(md):
    """[(key, [sub-keys])] of the roles table, and the other_frameworks element keys."""
    text = open(md, encoding="utf-8").read()
    sec = text.split("### `memory.framework.roles`", 1)[1].split("\n## ", 1)[0]
    keys = []
    for line in sec.splitlines():
        cols = line.split(" | ")
        if not line.startswith("| `") or len(cols) < 3:
            continue
        names = re.findall(r"`([a-z0-9_]+)`", cols[0])
        group = re.search(r"`\{ (\"[a-z0-9_]+\"(?:, \"[a-z0-9_]+\")*) \}`", " | ".join(cols[2:]))
        subs = re.findall(r"\"([a-z0-9_]+)\"", group.group(1)) if group and re.search(r"array|object", cols[1]) else []
        keys += [(n, subs) for n in names]
    row = re.search(r"`other_frameworks` \(array[^`]*`\{ ([^}]*) \}`", text)
    others = re.findall(r"\"([a-z_]+)\"", row.group(1)) if row else []
    return keys, others


def report(og, dump, fmt, tmp):
    path = os.path.join(tmp, "d.json")
    with open(path, "w") as f:
        json.dump(dump, f)
    env = dict(os.environ, OOMGUARD_SYMBOLIZE="0")      # the fixture's binaries are not on this machine
    r = subprocess.run([og, "report", path, "--format", fmt, "--color", "never"], stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, universal_newlines=True, env=env)
    if r.returncode != 0:
        return "exit %d: %s" % (r.returncode, r.stderr.strip())
    # the report names its input and the time it was made: neither is a key's doing
    return re.sub(r"<title>.*?</title>|oomguard report: \S+", "", r.stdout)


def without(dump, where, key, sub=None):
    d = json.loads(json.dumps(dump))
    fw = d["memory"]["framework"]
    holder = fw["roles"] if where == "roles" else fw
    v = holder.get(key)
    if sub is None:
        del holder[key]
    else:
        for el in (v if isinstance(v, list) else [v]):
            el.pop(sub, None)
    return d


def main():
    og, fixture, md = sys.argv[1:4]
    dump = json.load(open(fixture, encoding="utf-8"))
    keys, others = documented(md)
    problems = []
    if len(keys) < 20 or not others:
        problems.append("docs/dump-format.md: the roles table was not found (%d keys, other_frameworks %s)"
                        % (len(keys), others))
    roles = dump["memory"]["framework"]["roles"]
    cases = []
    for k, subs in keys:
        if roles.get(k) in (None, [], {}):
            problems.append("the fixture gives memory.framework.roles.%s no value" % k)
            continue
        cases.append(("roles", k, None))
        for s in subs:
            v = roles[k]
            if not any(isinstance(el, dict) and el.get(s) is not None for el in (v if isinstance(v, list) else [v])):
                problems.append("the fixture gives memory.framework.roles.%s[].%s no value" % (k, s))
                continue
            cases.append(("roles", k, s))
    if not dump["memory"]["framework"].get("other_frameworks"):
        problems.append("the fixture gives memory.framework.other_frameworks no value")
    else:
        cases.append(("framework", "other_frameworks", None))
        cases += [("framework", "other_frameworks", s) for s in others]
    with tempfile.TemporaryDirectory() as tmp:
        base = dict((fmt, report(og, dump, fmt, tmp)) for fmt in ("text", "html"))
        for where, k, s in cases:
            got = dict((fmt, report(og, without(dump, where, k, s), fmt, tmp)) for fmt in ("text", "html"))
            changed = [fmt for fmt in got if got[fmt] != base[fmt]]
            name = "memory.framework.%s%s" % ("roles." + k if where == "roles" else k, "[].%s" % s if s else "")
            if s is None and where == "roles" and len(changed) < 2:
                problems.append("%s: removing it leaves the %s report unchanged" %
                                (name, " and ".join(f for f in ("text", "html") if f not in changed)))
            elif not changed:
                problems.append("%s: removing it changes neither the text nor the HTML report" % name)
    for p in problems:
        print(p)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
