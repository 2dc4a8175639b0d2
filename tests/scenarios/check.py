#!/usr/bin/env python3
"""Checks the dumps of one scenario run against the simulator's ground truth and the expert's
expectations in tests/scenarios/cases/NAME.json.

usage: check.py CASE.json MODE DUMP_DIR TRUTH_DIR [KEY=VALUE ...]
  KEY=VALUE  placeholders for the expectations (e.g. bg_pid=1234: the pid of a background process)
Prints one line per failed check ("FAIL ...") and a last line "checks: N ok, M failed";
exit status 1 when a check failed.  With --top3-out FILE, writes the top-3 remedy ids (for the
cross-case check "differs_from")."""
import glob
import json
import os
import re
import sys

GiB = 1 << 30
MiB = 1 << 20

ok_count = 0
failures = []


def check(cond, what):
    global ok_count
    if cond:
        ok_count += 1
    else:
        failures.append(what)
    return cond


def alts(entry):
    return entry if isinstance(entry, list) else [entry]


def shown_first(d):
    """The remedies the reports show in full, in rank order: the user's first remedy and top three are theirs.
    remedies[].shown (a dump without it: ranks 1-5); one that cannot cover the shortfall alone is folded under
    "also possible" while another can or may, whatever its rank."""
    return [r for r in d.get("remedies", []) if r.get("shown", r.get("rank", 99) <= 5)]


def inference_mode_may_lead(exp):
    """The article's checklist splits inference from training: inference_mode leads only where the job is known to
    be inference / to run without autograd, or where the expert named it an acceptable first remedy (an
    evaluation pass of a training job that should run without autograd)."""
    return bool(exp.get("inference_job")) or "inference_mode" in alts(exp.get("first", []))


UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40,
         "KB": 10 ** 3, "MB": 10 ** 6, "GB": 10 ** 9, "TB": 10 ** 12}
SIZE = r"(\d+(?:\.\d+)?) ?(B|KiB|MiB|GiB|TiB|KB|MB|GB|TB)\b"


def size_of(num, unit):
    return float(num) * UNITS[unit]


def texts_of(d):
    """Every human-readable string of the dump's diagnosis and remedies."""
    out = []
    for c in d.get("diagnosis", {}).get("causes", []):
        out.append(("cause %s summary" % c.get("id"), c.get("summary") or ""))
    for r in d.get("remedies", []):
        for k in ("title", "why", "saving", "cost"):
            out.append(("remedy %s %s" % (r.get("id"), k), r.get(k) or ""))
        for h in r.get("how", []) or []:
            out.append(("remedy %s how" % r.get("id"), h or ""))
    return out


def remedy_text(r):
    return " ".join([r.get("title") or "", r.get("why") or ""] + list(r.get("how") or []))


def generic_text_checks(d, txt):
    """Statements no dump may make, whatever the case."""
    items = texts_of(d) + [("text dump", txt)]
    for where, s in items:
        check("n/a of" not in s, "%s says 'n/a of': %r" % (where, s[:200]))
        m = re.search(r"\b(nan|NaN|inf)\b", s)
        check(not m, "%s has nan/inf: %r" % (where, s[max(0, m.start() - 60):m.end() + 20] if m else ""))
        check(not re.search(r"-\d+(\.\d+)? ?(B|KiB|MiB|GiB|TiB)\b", s), "%s has a negative size: %r" % (where, s[:200]))
        check(not re.search(r"\b0 B over the limit", s), "%s says '0 B over the limit'" % where)
        m = re.search(r"\b1 (processes|blocks|allocations|steps|ranks|contexts|segments|failures|shards|devices|GPUs)\b", s)
        check(not m, "%s: singular/plural: %r" % (where, m.group(0) if m else ""))
        m = re.search(r"\bthey (\w+ ){0,2}its own\b|\bit (\w+ ){0,2}their own\b", s)
        check(not m, "%s: pronoun agreement: %r" % (where, m.group(0) if m else ""))
        # "X of the Y held/reserved/cached": X cannot exceed Y
        for m in re.finditer(SIZE + r" of (?:the |its |their )?" + SIZE, s):
            a, b = size_of(m.group(1), m.group(2)), size_of(m.group(3), m.group(4))
            check(a <= b * 1.005 + 1, "%s: impossible statement %r" % (where, m.group(0)))


UNMEASURED_IDS = re.findall(r'^X\(\w+, "(\w+)"',
                            open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "common",
                                              "unmeasured.def")).read(), re.M)


def evidence_text_checks(d):
    """What the dump says it did not measure, its texts must not state as fact; framework-specific
    lines are labelled with their framework when the framework is unknown."""
    mem = d.get("memory", {})
    um = " ".join(mem.get("unmeasured") or [])
    ids = mem.get("unmeasured_ids")
    check(isinstance(ids, list) and len(ids) == len(mem.get("unmeasured") or []) and
          all(i in UNMEASURED_IDS for i in ids),
          "memory.unmeasured_ids %r: one known id per entry of memory.unmeasured" % (ids,))
    if "framework_cache" in (ids or []):
        for where, s in texts_of(d):
            m = re.search(SIZE + r" (is |are )?(live|in live tensors|held by live tensors)\b", s)
            check(not m, "%s calls bytes live although the framework's cache was not measured: %r"
                  % (where, m.group(0) if m else ""))
    fw = (d.get("framework") or {}).get("name")
    if fw in (None, "", "unknown"):
        labels = {"torch.": "PyTorch", "PYTORCH_": "PyTorch", "jax.": "JAX", "XLA_": "JAX", "tf.": "TensorFlow",
                  "cupy.": "CuPy"}
        for r in d.get("remedies", [])[:3]:
            for h in r.get("how") or []:
                # labelled: "PyTorch: ...", "Other frameworks: ...", or the framework named in it
                if re.match(r"^\s*[A-Za-z][\w ./+()-]{1,40}:\s", h):
                    continue
                for key, label in labels.items():
                    if key in h:
                        check(label.lower() in h.lower() or "xla" in h.lower() and label == "JAX",
                              "remedy %s: %r is %s-specific but not labelled, and the framework is unknown"
                              % (r.get("id"), h[:120], label))


def pick_mark(marks, d):
    """The ground truth that belongs to this dump: the failing call's last failed attempt (an
    OOM that stayed), or the failed attempt before a recovery (a recovered dump)."""
    dev = d["event"]["device"]
    pid = d["pid"]
    mine = [m for m in marks if m["pid"] == pid]
    if d["status"] == "recovered":
        rec = [i for i, m in enumerate(mine) if m["kind"] == "recovered" and m["device"] == dev]
        if not rec:
            return None, None
        # the failed attempts of that sequence (before the recovery, after the last success);
        # the dump must hold the numbers of one of them, not those after the retry
        att = [m for m in mine[:rec[0]] if m["kind"] in ("attempt", "fail") and m["device"] == dev]
        same = [m for m in att if next(x for x in m["truth"] if x["device"] == dev)["free_bytes"]
                == d["device"]["free_bytes"]]
        return (same[-1] if same else att[-1] if att else None), mine[rec[0]]
    fails = [m for m in mine if m["kind"] == "fail" and m["device"] == dev]
    return (fails[-1] if fails else None), None


def truth_checks(d, mark, rec_mark, exp):
    if mark is None:
        check(False, "no ground-truth mark for pid %s device %s (the stand-in did not record the failure)"
              % (d["pid"], d["event"]["device"]))
        return
    dev = d["event"]["device"]
    t = next(x for x in mark["truth"] if x["device"] == dev)
    check(d["event"]["requested_bytes"] == mark["requested"],
          "event.requested_bytes %s == failing request %s" % (d["event"]["requested_bytes"], mark["requested"]))
    check(d["device"]["total_bytes"] == t["total_bytes"],
          "device.total_bytes %s == driver %s" % (d["device"]["total_bytes"], t["total_bytes"]))
    if exp.get("truth_free", True):
        check(d["device"]["free_bytes"] == t["free_bytes"],
              "device.free_bytes %s == driver %s at the failure" % (d["device"]["free_bytes"], t["free_bytes"]))
    m = d["memory"]
    tracked = t["alloc_requested_bytes"] + t["vmm_physical_bytes"] + t["pool_reserved_bytes"]
    check(m["process_tracked_bytes"] == tracked,
          "memory.process_tracked_bytes %s == driver %s" % (m["process_tracked_bytes"], tracked))
    # without NVML a number may be unknown (null) or inferred exactly, never a wrong one (0)
    unk = (None,) if exp.get("nvml_absent") else ()
    check(m["process_used_bytes"] in (t["used_bytes"],) + unk,
          "memory.process_used_bytes %s == driver used %s" % (m["process_used_bytes"], t["used_bytes"]))
    check(m["other_processes_bytes"] in (t["other_process_bytes"],) + unk,
          "memory.other_processes_bytes %s == driver %s%s" % (m["other_processes_bytes"], t["other_process_bytes"],
                                                              " (or unknown)" if unk else ""))
    if exp.get("nvml_absent"):
        # the case hides NVML: the dump must say it was not there (else the hiding failed)
        check("process_list" in (m.get("unmeasured_ids") or []),
              "memory.unmeasured_ids names the process list as missing (%r)" % (m.get("unmeasured"),))
    if not exp.get("nvml_absent"):
        # the list keeps the largest processes (at most 32): whole, it sums to the driver's total; cut, it sums to no
        # more than that, and other_processes_count says how many there were
        listed = m.get("other_processes", [])
        osum = sum(p.get("bytes", 0) for p in listed)
        whole = m.get("other_processes_count") in (None, len(listed))
        check(osum == t["other_process_bytes"] if whole else osum <= t["other_process_bytes"],
              "memory.other_processes[] sum %s %s driver %s (%d listed of %s)"
              % (osum, "==" if whole else "<=", t["other_process_bytes"], len(listed), m.get("other_processes_count")))
    # the estimate is process used - tracked: the contexts plus what the driver added rounding plain requests up to
    # its granule (docs/dump-format.md), which no API reports apart: the simulator's charged - requested
    slack = t["alloc_charged_bytes"] - t["alloc_requested_bytes"]
    check(m["context_bytes_estimate"] in (t["context_bytes"] + slack,) + unk,
          "memory.context_bytes_estimate %s == driver context %s + rounding %s"
          % (m["context_bytes_estimate"], t["context_bytes"], slack))
    # the contexts this process holds on the device: those it made with cuCtxCreate and did not destroy, and its
    # primary one when active (the driver counts the primary once)
    if m.get("contexts_made") is not None and m.get("primary_context") is not None:
        held = m["contexts_made"] + (1 if m["primary_context"] else 0)
        check(held == t["contexts"], "memory.contexts_made %s + primary %s == driver contexts %s"
              % (m["contexts_made"], m["primary_context"], t["contexts"]))
    k = m["by_kind"]
    plain = t["alloc_requested_bytes"] - t["managed_requested_bytes"]
    for key, want in (("plain", plain), ("managed", t["managed_requested_bytes"]),
                      ("pool_reserved", t["pool_reserved_bytes"]), ("pool_used", t["pool_used_bytes"]),
                      ("vmm_physical", t["vmm_physical_bytes"])):
        check(k.get(key) == want, "memory.by_kind.%s %s == driver %s" % (key, k.get(key), want))
    libsum = sum(x["bytes"] for x in m["by_library"])
    check(libsum == tracked, "memory.by_library sums to %s, driver tracked %s" % (libsum, tracked))
    for x in m["by_library"]:
        q = x.get("bytes_by_quarter")
        if q is not None:  # when each library's live bytes were taken: the quarters add up to its bytes
            check(len(q) == 4 and sum(q) == x["bytes"], "memory.by_library %s: bytes_by_quarter %s, bytes %s"
                  % (x["library"], q, x["bytes"]))
        else:
            check(x["library"].startswith("(stream-ordered pool cache"),
                  "memory.by_library %s: no bytes_by_quarter" % x["library"])
    if exp.get("truth_peak", True):
        # the history counts requested bytes, the driver's peak charged ones: less the rounding of the requests
        # not a multiple of the granule (every request of the corpus is one; some users' programs' are not)
        # (the simulator's rounding at its peak, when it says: the blocks live then, not those live at the end)
        want = t["peak_used_bytes"] - t["context_bytes"]
        at_peak = t.get("peak_rounding_bytes", slack)
        # several threads allocating at once: the peak is within 4 MiB per other thread (docs/dump-format.md), the
        # small allocations a thread batches before they reach the device's counter
        batched = 4 * 1024 * 1024 * max(0, t.get("alloc_threads", 1) - 1)
        got = d["history"]["peak_bytes"]
        check(got in (want, want - slack, want - at_peak) or (batched and want - batched < got <= want),
              "history.peak_bytes %s == driver peak - contexts %s (less rounding %s, at the peak %s)"
              % (d["history"]["peak_bytes"], want, slack, at_peak))
    ex = mark.get("extra", {})
    fw = m.get("framework")
    if ex.get("query") or ex.get("fw"):
        # the framework's allocated/reserved are known to the test (a failure outside the framework
        # with the adapter's query registered, or the Python job's own memory_stats()): the dump
        # must carry them, measured, not unknown
        if check(fw is not None, "memory.framework present (the shim could ask the adapter's query)"):
            for key, ek in (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved")):
                check(fw.get(key) == ex.get(ek), "memory.framework.%s %s == allocator %s" % (key, fw.get(key), ex.get(ek)))
            cached = ex["reserved"] - ex["allocated"]
            check(m.get("framework_cached_bytes") == cached,
                  "memory.framework_cached_bytes %s == reserved - allocated %s" % (m.get("framework_cached_bytes"), cached))
    if ex.get("adapter"):
        if check(fw is not None, "memory.framework present (the adapter reported)"):
            for key, ek in (("allocated_bytes", "allocated"), ("reserved_bytes", "reserved"),
                            ("inactive_split_bytes", "inactive_split"), ("largest_free_block_bytes", "largest_free"),
                            ("num_alloc_retries", "retries"), ("num_ooms", "ooms")):
                check(fw.get(key) == ex.get(ek), "memory.framework.%s %s == allocator %s" % (key, fw.get(key), ex.get(ek)))
            cached = ex["reserved"] - ex["allocated"]
            check(m.get("framework_cached_bytes") == cached,
                  "memory.framework_cached_bytes %s == reserved - allocated %s" % (m.get("framework_cached_bytes"), cached))
    if d["status"] == "oom" and "released" in ex and mark["kind"] == "fail":
        # the framework's own release between its failed attempts (PyTorch frees its free segments)
        # (unknown, never wrong, for a refusal inside the framework's allocator that no failed call announced)
        got = d["event"].get("released_between_attempts_bytes")
        check(got == ex["released"] or (got is None and d["event"].get("framework_internal") and d["event"].get("attempts", 0) <= 1),
              "event.released_between_attempts_bytes %s == the framework released %s" % (got, ex["released"]))
    if d["status"] == "recovered" and rec_mark is not None:
        rel = rec_mark.get("extra", {}).get("released", 0)
        got = d["event"].get("released_between_attempts_bytes")
        check(got == rel, "event.released_between_attempts_bytes %s == the framework released %s" % (got, rel))
    sf = d["diagnosis"].get("shortfall_bytes")
    dev = d.get("device") or {}
    if d.get("diagnosis") and all(dev.get(k) is None for k in ("free_bytes", "total_bytes", "limit_bytes")):
        # unknown is not zero: nothing free measured or estimable, nothing short measured
        check(sf is None, "diagnosis.shortfall_bytes %s is null: the device's free memory was not measured" % sf)
    if isinstance(sf, int) and not d["event"].get("caused_by_limit"):
        check(0 <= sf <= d["event"]["requested_bytes"],
              "diagnosis.shortfall_bytes %s within [0, requested %s]" % (sf, d["event"]["requested_bytes"]))
    # "fits a card of N GB" cannot stand next to an OOM that shows the job needs more than N GB:
    # the job needed at least what the process held at the failure plus the request, minus what
    # the framework had cached (known here from the allocator's own books)
    ex_c = mark.get("extra", {})
    if d["status"] == "oom" and not d["device"].get("limit_bytes") and "reserved" in ex_c:
        need = t["used_bytes"] + mark["requested"] - (ex_c["reserved"] - ex_c["allocated"])
        for dv in d.get("summary", {}).get("devices", []) or []:
            if dv.get("index") != dev:
                continue
            for f in dv.get("fits", []) or []:
                if f.get("card_gb") is not None and f["card_gb"] * 1e9 < need:
                    check(f.get("fits") is not True, "summary says the job fits a %s GB card; it needed at least "
                          "%.2f GB (held %.2f GB + requested %.2f GB - cached %.2f GB)"
                          % (f["card_gb"], need / 1e9, t["used_bytes"] / 1e9, mark["requested"] / 1e9,
                             (ex_c["reserved"] - ex_c["allocated"]) / 1e9))
    # "fits" only from a bounded peak: on the device of an unrecovered failure, a card no larger than
    # the device (or the limit) never fits, and nothing fits when the peak was not bounded (then: why)
    if d["status"] == "oom":
        floor = d["device"].get("limit_bytes") or d["device"].get("total_bytes") or 0
        for dv in d.get("summary", {}).get("devices", []) or []:
            if dv.get("index") != d["event"].get("device"):
                continue
            check(isinstance(dv.get("need_bounded"), bool), "summary.devices[].need_bounded is a bool")
            check(dv.get("need_bounded") or bool(dv.get("unbounded_why")),
                  "summary: an unbounded need says why (unbounded_why)")
            for f in dv.get("fits", []) or []:
                if f["card_gb"] * 1e9 <= floor:
                    check(f.get("fits") is False, "summary says a %s GB card, no larger than the failing device, "
                          "fits (or may)" % f["card_gb"])
                if not dv.get("need_bounded"):
                    check(f.get("fits") is not True, "summary says the job fits a %s GB card though its peak was "
                          "not bounded (%s)" % (f["card_gb"], dv.get("unbounded_why")))


def expectation_checks(d, txt, exp, subst):
    def sub(s):
        for k, v in subst.items():
            s = s.replace("{%s}" % k, v)
        return s

    diag = d["diagnosis"]
    causes = [c["id"] for c in diag.get("causes", [])]
    ids = [r["id"] for r in d["remedies"]]
    rem3 = shown_first(d)[:3]
    top3 = [r["id"] for r in rem3]
    desc = "primary %s, causes %s, top3 %s" % (diag.get("primary"), causes, top3)
    if "status" in exp:
        check(d["status"] == exp["status"], "status %s, expected %s" % (d["status"], exp["status"]))
    if "failing_library" in exp:
        check(d["event"].get("library") == exp["failing_library"],
              "event.library %s, expected %s" % (d["event"].get("library"), exp["failing_library"]))
    if "device" in exp:
        check(d["event"]["device"] == exp["device"], "event.device %s, expected %s" % (d["event"]["device"], exp["device"]))
    if "primary" in exp:
        check(diag.get("primary") in alts(exp["primary"]),
              "primary %s not among the acceptable %s (%s)" % (diag.get("primary"), exp["primary"], desc))
    for c in exp.get("causes_forbidden", []):
        check(c not in causes, "cause %s must not be diagnosed (%s)" % (c, desc))
    for c in exp.get("primary_forbidden", []):
        check(diag.get("primary") != c, "primary must not be %s (%s)" % (c, desc))
    for e in exp.get("top3_required", []):
        check(any(a in top3 for a in alts(e)), "top 3 lacks %s (%s)" % (" or ".join(alts(e)), desc))
    for e in exp.get("top3_forbidden", []):
        check(e not in top3, "%s must not be in the top 3 (%s)" % (e, desc))
    if not inference_mode_may_lead(exp):
        check(not ids or ids[0] != "inference_mode", "inference_mode leads, but nothing says this job runs "
              "without autograd (%s)" % desc)
    for e in exp.get("first_forbidden", []):
        check(not ids or ids[0] != e, "%s must not lead (%s)" % (e, desc))
    if "first" in exp:
        check(bool(ids) and ids[0] in alts(exp["first"]), "first remedy %s, expected one of %s (%s)"
              % (ids[:1], exp["first"], desc))
    for e in exp.get("remedies_forbidden", []):
        check(e not in ids, "%s must not be suggested at all (%s)" % (e, desc))
    for rx in exp.get("top3_text_required", []):
        rx = sub(rx)
        check(any(re.search(rx, remedy_text(r)) for r in rem3), "no top-3 remedy says /%s/ (%s)" % (rx, desc))
    for rx in exp.get("top3_text_forbidden", []):
        rx = sub(rx)
        bad = [r["id"] for r in rem3 if re.search(rx, remedy_text(r))]
        check(not bad, "top-3 remedies %s say /%s/" % (bad, rx))
    for rx in exp.get("primary_text_required", []):
        rx = sub(rx)
        c0 = next((c for c in diag.get("causes", []) if c["id"] == diag.get("primary")), {})
        check(bool(re.search(rx, c0.get("summary") or "")), "the primary cause's summary lacks /%s/: %r"
              % (rx, (c0.get("summary") or "")[:300]))
    for rx in exp.get("text_required", []):
        rx = sub(rx)
        check(bool(re.search(rx, txt)), "the text dump lacks /%s/" % rx)
    for rx in exp.get("text_forbidden", []):
        rx = sub(rx)
        m = re.search(rx, txt)
        check(not m, "the text dump says /%s/: %r" % (rx, m.group(0) if m else ""))
    for rx in exp.get("json_text_forbidden", []):
        rx = sub(rx)
        bad = [w for w, s in texts_of(d) if re.search(rx, s)]
        check(not bad, "/%s/ in %s" % (rx, bad[:3]))
    # ["text regex", "remedy id"]: a remedy saying the first must rank above the second one
    for a, b in exp.get("before", []):
        ia = next((i for i, r in enumerate(d["remedies"]) if r["id"] == a or re.search(a, remedy_text(r))), None)
        ib = next((i for i, r in enumerate(d["remedies"]) if r["id"] == b), None)
        check(ia is not None and (ib is None or ia < ib), "a remedy for /%s/ (at %s) must come before %s (at %s); %s"
              % (a, ia, b, ib, desc))
    if "confidence_max" in exp:
        c0 = next((c for c in diag.get("causes", []) if c["id"] == diag.get("primary")), {})
        check((c0.get("confidence") or 0) <= exp["confidence_max"], "primary confidence %s above %s for a case whose "
              "inputs were not all measured" % (c0.get("confidence"), exp["confidence_max"]))
    if "confidence_min" in exp:
        c0 = next((c for c in diag.get("causes", []) if c["id"] == diag.get("primary")), {})
        check((c0.get("confidence") or 0) >= exp["confidence_min"], "primary confidence %s below %s for a certain case"
              % (c0.get("confidence"), exp["confidence_min"]))
    if exp.get("unmeasured"):
        um = d["memory"].get("unmeasured")
        check(bool(um), "memory.unmeasured should name what was not measured, is %r" % (um,))
    for lib in exp.get("libraries", []):
        check(any(x["library"] == lib for x in d["memory"]["by_library"]), "memory.by_library lacks %s (%s)"
              % (lib, [x["library"] for x in d["memory"]["by_library"]]))
    for key, (lo, hi) in exp.get("evidence", {}).items():
        c0 = next((c for c in diag.get("causes", []) if c["id"] == diag.get("primary")), {})
        v = (c0.get("evidence") or {}).get(key)
        check(isinstance(v, (int, float)) and lo <= v <= hi, "evidence %s of the primary cause = %r, expected within "
              "[%s, %s]" % (key, v, lo, hi))
    for path, want in exp.get("fields", {}).items():
        v = d
        for p in path.split("."):               # a number indexes a list: roles.models.0.count
            if isinstance(v, list) and p.isdigit():
                v = v[int(p)] if int(p) < len(v) else None
            else:
                v = v.get(p) if isinstance(v, dict) else None
        check(v == want, "%s = %r, expected %r" % (path, v, want))
    for c in d["diagnosis"].get("causes", []):
        check(0 <= (c.get("confidence") or 0) <= 1, "confidence of %s out of [0,1]" % c["id"])
    check([r["rank"] for r in d["remedies"]] == list(range(1, len(ids) + 1)), "remedy ranks are 1..n")
    # at most five shown in full (the text dump and the stderr summary: run_scenarios.py checks them), none that
    # cannot cover the shortfall alone (ranking tier 3) while another can or may
    tiers = [(r.get("ranking") or {}).get("tier") for r in d["remedies"]]
    covered = any(t is not None and t < 3 for t in tiers)
    check([r.get("shown") for r in d["remedies"]] == [r["rank"] <= 5 and not (r["rank"] > 1 and covered and t == 3)
                                                     for r, t in zip(d["remedies"], tiers)],
          "remedies[].shown is true for ranks 1-5 only, tier 3 past the first folded while another covers")


def main():
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    top3_out = None
    if "--top3-out" in sys.argv:
        top3_out = sys.argv[sys.argv.index("--top3-out") + 1]
        args = [a for a in args if a != top3_out]
    case_path, mode, dump_dir, truth_dir = args[:4]
    subst = dict(a.split("=", 1) for a in args[4:])
    case = json.load(open(case_path))
    exp = dict(case.get("expect", {}))
    exp.update(case.get("expect_" + mode, {}))
    # the dumps of the failure the case is about (a job may recover from earlier ones first)
    want_status = exp.get("status", "oom")
    dumps = sorted(f for f in glob.glob(os.path.join(dump_dir, "oomguard-*.json"))
                   if json.load(open(f)).get("status") == want_status)
    marks = []
    for f in sorted(glob.glob(os.path.join(truth_dir, "truth-*.jsonl"))):
        marks += [json.loads(l) for l in open(f) if l.strip()]
    want = case.get("dumps", 1)
    check(len(dumps) == want, "%d failure dump(s), expected %d" % (len(dumps), want))
    for path in dumps:
        d = json.load(open(path))
        txt_path = path[:-5] + ".txt"
        txt = open(txt_path).read() if os.path.exists(txt_path) else ""
        check(bool(txt), "text dump next to %s" % os.path.basename(path))
        check(d.get("schema") == "oomguard.dump/1", "schema %r" % d.get("schema"))
        mark, rec = pick_mark(marks, d)
        truth_checks(d, mark, rec, exp)
        generic_text_checks(d, txt)
        evidence_text_checks(d)
        expectation_checks(d, txt, exp, subst)
        if top3_out:
            with open(top3_out, "w") as f:
                f.write(" ".join(r["id"] for r in shown_first(d)[:3]))
        print("dump %s: primary=%s causes=%s top3=%s" % (os.path.basename(path), d["diagnosis"].get("primary"),
              [c["id"] for c in d["diagnosis"].get("causes", [])], [r["id"] for r in shown_first(d)[:3]]))
    for f in failures:
        print("FAIL " + f)
    print("checks: %d ok, %d failed" % (ok_count, len(failures)))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
