"""Checks the memory-over-time chart of `oomguard report --format html` (tests/cli/run_tests.sh).

usage: check_chart.py OOMGUARD FIXTURE WORKDIR

The fixture's times are scaled to spans from milliseconds to hours, its last samples cut
before the failure; for each, the chart's SVG is read back and checked: the axis unit fits
the span (ms, s, min, h) and tick labels are round numbers in it; the usage line reaches the
failure line; every label lies inside the plot (estimated width at 0.6 em per character,
the renderer's own estimate, checked in Chromium by html_screenshot.sh)."""
import json, re, subprocess, sys

og, fixture, work = sys.argv[1:4]
L, R, W = 74, 16, 1000   # the renderer's plot margins
base = json.load(open(fixture))


def chart(d, name):
    path = f"{work}/{name}.json"
    json.dump(d, open(path, "w"))
    html = subprocess.run([og, "report", path, "-fhtml"], check=True, capture_output=True, text=True).stdout
    m = re.search(r'<svg viewBox="0 0 1000 330"[^>]*id="chart">(.*?)</svg>', html, re.S)
    assert m, "no chart"
    return m.group(1)


def scaled(factor, cut_tail):
    d = json.loads(json.dumps(base))
    h = d["history"]
    for e in h["events"] + h["samples"]:
        e["t_rel"] *= factor
    h["peak_t_rel"] *= factor
    d["event"]["t_rel"] *= factor
    if cut_tail:   # the last samples long before the failure: the line must still reach it
        h["events"] = []
        h["samples"] = h["samples"][: len(h["samples"]) // 2]
    return d


cases = [(0.0023 / 412.73, "ms"), (1.0, "min"), (30 / 412.73, "s"), (3 * 3600 / 412.73, "h")]
for factor, unit in cases:
    for cut in (False, True):
        svg = chart(scaled(factor, cut), f"chart-{unit}-{int(cut)}")
        ticks = re.findall(r'<text x="([\d.]+)" y="307.0"[^>]*>([^<]*)</text>', svg)
        assert ticks, svg[:400]
        for x, label in ticks:
            num, u = label.split(" ")
            assert u == unit, (factor, label)
            assert len(num.split(".")[-1]) <= 2 or "." not in num, (factor, label)
        # the failure line, and the usage line's last point on it
        fail_x = float(re.search(r'<line x1="([\d.]+)" y1="16.0" x2="\1" y2="[\d.]+" stroke="#d93636"', svg).group(1))
        line = re.search(r'<path fill="none" stroke="#3b6fd8"[^>]* d="([^"]+)"', svg).group(1)
        last_x = float(re.findall(r'[ML]([\d.]+) [\d.]+', line)[-1])
        assert abs(last_x - fail_x) < 0.2, (factor, cut, last_x, fail_x)
        # labels inside the plot
        for m in re.finditer(r'<text ([^>]*)>([^<]*)</text>', svg):
            a = dict(re.findall(r'([\w-]+)="([^"]*)"', m.group(1)))
            x, size, anchor = float(a["x"]), float(a["font-size"]), a.get("text-anchor", "start")
            text = m.group(2).replace("&amp;", "&")
            w = 0.6 * size * len(text)
            lo = x - w if anchor == "end" else x - w / 2 if anchor == "middle" else x
            if size == 12:   # the plot's own labels: inside the plot
                assert L <= lo and lo + w <= W - R + 0.5, (factor, text, lo, lo + w)
            else:            # axis labels: inside the picture
                assert 0 <= lo and lo + w <= W, (factor, text, lo, lo + w)
print("chart ok:", len(cases) * 2, "variants")
