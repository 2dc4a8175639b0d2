#!/usr/bin/env python3
"""A line-by-line validator of the Prometheus text exposition format (0.0.4), written
from the format's specification, with the extra rule of node_exporter's textfile
collector (no timestamps).

usage: check_prom.py FILE        prints each problem as "line N: ..." and exits 1 if any
       check_prom.py --self-test runs the validator over broken inputs it must reject

Rules checked:
- the input is UTF-8, lines end with LF (the last one too), no CR;
- "# HELP name text" and "# TYPE name type": name matches [a-zA-Z_:][a-zA-Z0-9_:]*,
  type is counter, gauge, histogram, summary or untyped; HELP text escapes only \\\\ and \\n;
  at most one HELP and one TYPE per family, both before the family's first sample;
  other lines starting with # are comments;
- samples: name{label="value",...} value [timestamp]; label names match
  [a-zA-Z_][a-zA-Z0-9_]* and do not start with __; a label appears once per sample;
  values escape only \\\\, \\" and \\n; the value is a float (or NaN, +Inf, -Inf);
- all samples of a family form one group (a family does not come back later);
- no two samples have the same name and label set;
- counters are not negative; textfile collector: no timestamp."""
import re
import sys

METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|Inf|inf|NaN|nan)")
TYPES = {"counter", "gauge", "histogram", "summary", "untyped"}
SUFFIXES = {"histogram": ("_bucket", "_sum", "_count"), "summary": ("_sum", "_count")}


def family_of(name, types):
    for fam, t in types.items():
        for suf in SUFFIXES.get(t, ()):
            if name == fam + suf:
                return fam
    return name


def parse_labels(s, i, errs, n):
    """Parses {...} starting at s[i] == '{'; returns (labels tuple, index after '}') or (None, i)."""
    i += 1
    labels = []
    while True:
        if i < len(s) and s[i] == "}":
            return tuple(labels), i + 1
        m = LABEL.match(s, i)
        if not m:
            errs.append("line %d: bad label name at column %d" % (n, i + 1))
            return None, i
        name = m.group(0)
        if name.startswith("__"):
            errs.append("line %d: label name %s is reserved (starts with __)" % (n, name))
        if any(k == name for k, _ in labels):
            errs.append("line %d: label %s appears twice" % (n, name))
        i = m.end()
        if s[i:i + 2] != '="':
            errs.append("line %d: expected =\" after label %s" % (n, name))
            return None, i
        i += 2
        val = []
        while True:
            if i >= len(s):
                errs.append("line %d: label value of %s not closed" % (n, name))
                return None, i
            c = s[i]
            if c == '"':
                i += 1
                break
            if c == "\\":
                nx = s[i + 1:i + 2]
                if nx not in ("\\", '"', "n"):
                    errs.append("line %d: bad escape \\%s in the value of %s" % (n, nx, name))
                    return None, i
                val.append({"\\": "\\", '"': '"', "n": "\n"}[nx])
                i += 2
                continue
            if c == "\n":
                errs.append("line %d: raw line feed in a label value" % n)
                return None, i
            val.append(c)
            i += 1
        labels.append((name, "".join(val)))
        if i < len(s) and s[i] == ",":
            i += 1
            continue
        if i < len(s) and s[i] == "}":
            return tuple(labels), i + 1
        errs.append("line %d: expected , or } after the value of %s" % (n, name))
        return None, i


def validate(data, textfile=True):
    errs = []
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        return ["not UTF-8: %s" % e]
    if "\r" in text:
        errs.append("carriage return in the input")
    if text and not text.endswith("\n"):
        errs.append("the last line does not end with a line feed")
    types, helps, seen_samples, closed, series = {}, set(), set(), set(), set()
    current = None
    for n, line in enumerate(text.split("\n")[:-1] if text.endswith("\n") else text.split("\n"), 1):
        if line == "":
            continue
        if line.startswith("#"):
            parts = line.split(" ", 3)
            if len(parts) >= 2 and parts[0] == "#" and parts[1] in ("HELP", "TYPE"):
                if len(parts) < 3 or not METRIC.fullmatch(parts[2]):
                    errs.append("line %d: %s without a valid metric name" % (n, parts[1]))
                    continue
                name = parts[2]
                if name in seen_samples:
                    errs.append("line %d: %s for %s after its samples" % (n, parts[1], name))
                if parts[1] == "TYPE":
                    t = parts[3] if len(parts) > 3 else ""
                    if t not in TYPES:
                        errs.append("line %d: unknown type %r" % (n, t))
                    if name in types:
                        errs.append("line %d: second TYPE line for %s" % (n, name))
                    types[name] = t
                else:
                    doc = parts[3] if len(parts) > 3 else ""
                    if not re.fullmatch(r"(?:[^\\]|\\[\\n])*", doc):
                        errs.append("line %d: bad escape in HELP text" % n)
                    if name in helps:
                        errs.append("line %d: second HELP line for %s" % (n, name))
                    helps.add(name)
                if current is not None and name != current:
                    closed.add(current)
                    current = None
                if name in closed:
                    errs.append("line %d: family %s appears again after other families" % (n, name))
            continue
        m = METRIC.match(line)
        if not m:
            errs.append("line %d: bad metric name" % n)
            continue
        name = m.group(0)
        i = m.end()
        labels = ()
        if i < len(line) and line[i] == "{":
            labels, i = parse_labels(line, i, errs, n)
            if labels is None:
                continue
        rest = line[i:]
        if not rest.startswith(" "):
            errs.append("line %d: expected a space before the value" % n)
            continue
        fields = rest.strip(" ").split(" ")
        if not FLOAT.fullmatch(fields[0]):
            errs.append("line %d: bad value %r" % (n, fields[0]))
        if len(fields) > 2 or (len(fields) == 2 and not re.fullmatch(r"-?[0-9]+", fields[1])):
            errs.append("line %d: junk after the value" % n)
        elif len(fields) == 2 and textfile:
            errs.append("line %d: timestamp (node_exporter's textfile collector refuses them)" % n)
        fam = family_of(name, types)
        if fam in closed:
            errs.append("line %d: samples of %s are not one group" % (n, fam))
        if current is not None and fam != current:
            closed.add(current)
        current = fam
        seen_samples.add(fam)
        key = (name, tuple(sorted(labels)))
        if key in series:
            errs.append("line %d: duplicate series %s%s" % (n, name, dict(labels)))
        series.add(key)
        if types.get(fam) == "counter" and FLOAT.fullmatch(fields[0]):
            v = float(fields[0].replace("Inf", "inf"))
            if v < 0 or v != v:
                errs.append("line %d: counter %s is %s" % (n, name, fields[0]))
    return errs


GOOD = b'# HELP a_total Things, \\\\ and \\n.\n# TYPE a_total counter\na_total{x="q\\"\\\\\\n",y="2"} 3\n' \
       b'a_total{x="r"} 1e3\n# TYPE g gauge\ng -Inf\n'
BAD = {
    "bad metric name": b"9a 1\n",
    "bad label name": b'a{9x="1"} 1\n',
    "reserved label": b'a{__x="1"} 1\n',
    "bad escape": b'a{x="\\t"} 1\n',
    "unclosed value": b'a{x="1} 1\n',
    "duplicate series": b'a{x="1",y="2"} 1\na{y="2",x="1"} 2\n',
    "two TYPE lines": b"# TYPE a counter\n# TYPE a counter\na 1\n",
    "TYPE after samples": b"a 1\n# TYPE a counter\n",
    "unknown type": b"# TYPE a countr\na 1\n",
    "family split": b"a 1\nb 1\na{x=\"1\"} 2\n",
    "bad value": b"a one\n",
    "timestamp": b"a 1 1700000000000\n",
    "no final newline": b"a 1",
    "not UTF-8": b'a{x="\xff"} 1\n',
    "negative counter": b"# TYPE a counter\na -1\n",
    "HELP escape": b"# HELP a bad \\x escape\na 1\n",
    "label twice": b'a{x="1",x="2"} 1\n',
}


def self_test():
    fails = 0
    if validate(GOOD):
        print("FAIL  a valid exposition was rejected: %s" % validate(GOOD))
        fails += 1
    for what, data in BAD.items():
        if validate(data):
            print("ok    rejects: %s" % what)
        else:
            print("FAIL  accepted: %s" % what)
            fails += 1
    return fails


def main():
    if sys.argv[1:] == ["--self-test"]:
        sys.exit(1 if self_test() else 0)
    errs = validate(open(sys.argv[1], "rb").read())
    for e in errs[:40]:
        print(e)
    sys.exit(1 if errs else 0)


if __name__ == "__main__":
    main()
