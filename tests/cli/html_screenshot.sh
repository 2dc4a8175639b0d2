#!/usr/bin/env bash
# tests/cli/html_screenshot.sh — renders a fixture to HTML and loads it in
# headless Chromium: takes a screenshot, and checks from the DOM that the chart,
# the breakdown and the sites table are there and that the page's one script
# ran (it sets <body data-ok="1">; a CSP or script error would leave it unset).
# Console errors are captured and fail the test.
#
# usage: html_screenshot.sh OOMGUARD WORKDIR [FIXTURE] [PNG]
# exit: 0 pass, 1 fail, 77 skipped (no Chromium)
set -u
OG=${1:?usage: html_screenshot.sh OOMGUARD WORKDIR [FIXTURE] [PNG]}
W=${2:?}
FIXTURE=${3:-tests/fixtures/does_not_fit.json}
PNG=${4:-$W/report.png}
mkdir -p "$W"

browser=
for b in chromium chromium-browser google-chrome; do
    command -v "$b" >/dev/null 2>&1 && browser=$b && break
done
if [ -z "$browser" ]; then
    echo "chromium not installed (apt-get install chromium)"
    exit 77
fi

"$OG" report "$FIXTURE" --format html -o "$W/report.html" || { echo "oomguard report failed"; exit 1; }
profile=$(mktemp -d "${TMPDIR:-/tmp}/og-chromium.XXXXXX")
trap 'rm -rf "$profile"' EXIT
flags=(--headless --no-sandbox --disable-gpu --disable-quic --no-first-run --disable-background-networking
    --disable-component-update --disable-sync --hide-scrollbars --user-data-dir="$profile"
    --enable-logging=stderr --v=0)
url="file://$(readlink -f "$W/report.html")"

timeout 90 "$browser" "${flags[@]}" --window-size=1200,1600 --screenshot="$PNG" "$url" >"$W/shot.out" 2>"$W/shot.err"
if [ ! -s "$PNG" ]; then
    echo "no screenshot; chromium said:"
    tail -5 "$W/shot.err"
    exit 1
fi
timeout 90 "$browser" "${flags[@]}" --dump-dom "$url" >"$W/dom.html" 2>"$W/dom.err"

fail=0
check() { if grep -qF -- "$2" "$W/dom.html"; then echo "ok: $1"; else echo "missing: $1 ($2)"; fail=1; fi; }
check "the page's script ran" 'data-ok="1"'
check "memory-over-time chart" '<svg viewBox="0 0 1000 330"'
check "chart line" 'stroke="#3b6fd8"'
check "where-the-memory-is bar" 'id="breakdown"'
check "top sites table" '<table id="sites"'
check "remedy code" '<pre>'
# The chart's labels, measured by the browser: the chart's SVG alone in a page whose script
# compares each label's box with the plot (x 74..984) and the picture, and writes the result.
python3 - "$W/report.html" "$W/chart.html" <<'PY'
import re, sys
svg = re.search(r'<svg viewBox="0 0 1000 330".*?</svg>', open(sys.argv[1]).read(), re.S).group(0)
open(sys.argv[2], "w").write("""<!DOCTYPE html><html><body style="margin:0;width:1000px">%s<script>
const out = [];
for (const t of document.querySelectorAll('#chart text')) {
  const b = t.getBBox(), big = t.getAttribute('font-size') === '12';
  const lo = big ? 74 : 0, hi = big ? 984.5 : 1000;
  if (b.x < lo || b.x + b.width > hi || b.y < 0 || b.y + b.height > 330)
    out.push(t.textContent + ' [' + b.x.toFixed(1) + '..' + (b.x + b.width).toFixed(1) + ']');
}
document.body.setAttribute('data-labels', out.length ? 'outside: ' + out.join('; ') : 'inside');
</script></body></html>""" % svg)
PY
timeout 90 "$browser" "${flags[@]}" --dump-dom "file://$(readlink -f "$W/chart.html")" >"$W/chart-dom.html" 2>"$W/chart-dom.err"
if grep -q 'data-labels="inside"' "$W/chart-dom.html"; then echo "ok: chart labels inside the plot (Chromium's boxes)"
else echo "chart labels: $(grep -o 'data-labels="[^"]*"' "$W/chart-dom.html" || echo 'not measured')"; fail=1; fi
# Chromium reports page script errors and CSP violations as CONSOLE messages.
if grep -E 'CONSOLE|Uncaught|Content Security Policy|Refused to' "$W/shot.err" "$W/dom.err" | grep -v 'dbus' >"$W/console.txt"; then
    echo "console errors:"
    cat "$W/console.txt"
    fail=1
else
    echo "ok: no console errors"
fi
exit $fail
