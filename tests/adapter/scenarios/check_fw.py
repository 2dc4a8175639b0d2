"""check_fw.py DUMP_DIR EXPECTED.json [checks...]

Checks the one oomguard-*.json dump in DUMP_DIR against what a job wrote to EXPECTED.json (the jobs
of job.py, job_jax.py, job_cupy.py).  Checks:
  --framework NAME     memory.framework.framework == NAME and memory.framework is filled
  --internal           a failure inside the framework's allocator: event.framework_internal, no
                       driver API, event.api == --api
  --driver             a failing driver call: event.driver_api set, not framework_internal
  --api NAME           event.api (with --internal) / memory.framework.api
  --request N          event.requested_bytes == memory.framework.requested_bytes == N ("exp" = expected.request)
  --cap N              memory.framework.cap_bytes == N ("exp" = expected.cap / limit / stats.bytes_limit)
  --cap-source TEXT    memory.framework.cap_source contains TEXT
  --numbers KIND       memory.framework numbers == the job's: jax (memory_stats) | cupy (pool) | torch
  --line NAME          the job file's line lines[NAME] is in event.python_stack
  --site NAME          python_sites[0] is the job file's line lines[NAME]
  --primary ID         diagnosis.primary == ID (or one of ID1,ID2)
  --cause ID           ID is among diagnosis.causes
  --remedy-mentions T  some remedy's title/why/how mentions T
  --unmeasured TEXT    memory.unmeasured has an entry containing TEXT
Prints every mismatch; exit status 1 when there is one."""
import json
import sys

from checkkit import Check

chk = Check(sys.argv[1:])
d, e, exp, bad, opt = chk.d, chk.e, chk.exp, chk.bad, chk.opt
ev = d["event"]
fw = d["memory"].get("framework")

name = opt("--framework")
if name:
    if fw is None:
        bad.append("memory.framework is null")
    elif fw.get("framework") != name:
        bad.append("memory.framework.framework = %r, want %r" % (fw.get("framework"), name))
fw = fw or {}

api = opt("--api")
if opt("--internal"):
    if ev.get("framework_internal") is not True:
        bad.append("event.framework_internal = %r" % ev.get("framework_internal"))
    if ev.get("driver_api"):
        bad.append("event.driver_api = %r, want none" % ev.get("driver_api"))
    if api and ev.get("api") != api:
        bad.append("event.api = %r, want %r" % (ev.get("api"), api))
if opt("--driver"):
    if ev.get("framework_internal") or not ev.get("driver_api"):
        bad.append("not a driver failure: framework_internal %r, driver_api %r" % (ev.get("framework_internal"),
                                                                                    ev.get("driver_api")))
if api and fw.get("api") != api:
    bad.append("memory.framework.api = %r, want %r" % (fw.get("api"), api))

req = opt("--request")
if req:
    want = exp.get("request") if req == "exp" else int(req)
    if ev.get("requested_bytes") != want:
        bad.append("event.requested_bytes = %r, want %r" % (ev.get("requested_bytes"), want))
    if fw.get("requested_bytes") != want:
        bad.append("memory.framework.requested_bytes = %r, want %r" % (fw.get("requested_bytes"), want))

cap = opt("--cap")
if cap:
    if cap == "exp":
        want = exp.get("cap") or exp.get("limit") or (exp.get("stats") or {}).get("bytes_limit")
    else:
        want = int(cap)
    if fw.get("cap_bytes") != (want or None):   # no cap in force: null
        bad.append("memory.framework.cap_bytes = %r, want %r" % (fw.get("cap_bytes"), want))
cs = opt("--cap-source")
if cs and cs not in (fw.get("cap_source") or ""):
    bad.append("memory.framework.cap_source = %r lacks %r" % (fw.get("cap_source"), cs))

kind = opt("--numbers")
if kind == "jax":
    st = exp["stats"]
    pairs = [("allocated_bytes", st["bytes_in_use"]), ("reserved_bytes", st.get("pool_bytes") or st["bytes_in_use"]),
             ("largest_free_block_bytes", st.get("largest_free_block_bytes", 0)),
             ("peak_bytes", st.get("peak_bytes_in_use", 0))]
    if (fw.get("source") or "") != "jax " + e["version"]:
        bad.append("memory.framework.source = %r" % fw.get("source"))
elif kind == "cupy":
    pairs = [("allocated_bytes", exp["used"]), ("reserved_bytes", exp["total"])]
    if (fw.get("source") or "") != "cupy " + e["version"]:
        bad.append("memory.framework.source = %r" % fw.get("source"))
elif kind == "torch":
    pairs = [("allocated_bytes", exp["allocated"]), ("reserved_bytes", exp["reserved"])]
else:
    pairs = []
for k, v in pairs:
    # the dump writes null, not 0, for a peak the framework did not report
    if fw.get(k) != (None if k == "peak_bytes" and v == 0 else v):
        bad.append("memory.framework.%s = %r, the framework knew %r" % (k, fw.get(k), v))
if pairs and fw and d["memory"].get("framework_cached_bytes") != fw["reserved_bytes"] - fw["allocated_bytes"]:
    bad.append("memory.framework_cached_bytes = %r" % d["memory"].get("framework_cached_bytes"))

ln = opt("--line")
if ln:
    want = (e["file"], e["lines"][ln])
    got = [(f["file"], f["line"]) for f in ev.get("python_stack", [])]
    if want not in got:
        bad.append("event.python_stack lacks %s:%d (%s): %r" % (want[0], want[1], ln, got))
site = opt("--site")
if site:
    want = (e["file"], e["lines"][site])
    sites = d.get("python_sites") or []
    if not sites or (sites[0]["file"], sites[0]["line"]) != want:
        bad.append("python_sites[0] = %r, want %s:%d (%s)" % (sites[:1], want[0], want[1], site))
    elif not (sites[0]["bytes"] > 0 and sites[0]["blocks"] > 0 and
              all(sites[i]["bytes"] >= sites[i + 1]["bytes"] for i in range(len(sites) - 1))):
        bad.append("python_sites not largest first / empty: %r" % sites)

causes = [c["id"] for c in d["diagnosis"]["causes"]]
chk.primary()
c = opt("--cause")
if c and c not in causes:
    bad.append("cause %r not among %r" % (c, causes))
rm = opt("--remedy-mentions")
if rm:
    text = json.dumps(d.get("remedies", []))
    if rm not in text:
        bad.append("no remedy mentions %r: %r" % (rm, [r["id"] for r in d.get("remedies", [])]))
um = opt("--unmeasured")
if um and not any(um in u for u in d["memory"].get("unmeasured", [])):
    bad.append("memory.unmeasured lacks %r: %r" % (um, d["memory"].get("unmeasured")))

chk.finish("primary=%s api=%s internal=%s" % (d["diagnosis"]["primary"], ev.get("api"), ev.get("framework_internal")))
