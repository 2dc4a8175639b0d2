"""check_dump.py DUMP_DIR EXPECTED.json [--primary ID] [--no-framework] [--no-snapshot] [--settings TEXT]

Checks the one oomguard-*.json dump in DUMP_DIR against what the job wrote to EXPECTED.json.
Prints every mismatch; exit status 1 when there is one."""
import glob
import json
import sys

args = sys.argv[1:]
ddir, expf = args[0], args[1]
opts = args[2:]


def opt(name):
    if name in opts:
        i = opts.index(name)
        return opts[i + 1] if i + 1 < len(opts) and not opts[i + 1].startswith("--") else True
    return None


bad = []
dumps = sorted(glob.glob(ddir + "/oomguard-*.json"))
if len(dumps) != 1:
    print("expected one dump in %s, found %d" % (ddir, len(dumps)))
    sys.exit(1)
d = json.load(open(dumps[0]))
e = json.load(open(expf))
exp = e.get("expected", {})
fw = d.get("memory", {}).get("framework")

if d.get("status") != "oom":
    bad.append("status %r" % d.get("status"))
if "device" in exp and d["event"]["device"] != exp["device"]:
    bad.append("event.device %r != %r" % (d["event"]["device"], exp["device"]))

if opt("--no-framework"):
    if fw is not None:
        bad.append("memory.framework should be null, is %r" % (fw,))
else:
    if fw is None:
        bad.append("memory.framework is null")
    else:
        pairs = [("allocated_bytes", "allocated"), ("reserved_bytes", "reserved")]
        if "active" in exp:
            pairs += [("active_bytes", "active"), ("inactive_split_bytes", "inactive_split"),
                      ("num_ooms", "num_ooms"), ("num_alloc_retries", "num_alloc_retries")]
        if "largest_free" in exp:
            if opt("--no-snapshot"):
                if fw["largest_free_block_bytes"] != 0 or fw["private_pool_bytes"] != 0:
                    bad.append("without a snapshot largest_free_block/private_pool should be 0: %r" % (fw,))
            else:
                pairs += [("largest_free_block_bytes", "largest_free"), ("private_pool_bytes", "private")]
        for k, ek in pairs:
            if fw.get(k) != exp.get(ek):
                bad.append("memory.framework.%s = %r, the allocator knew %r" % (k, fw.get(k), exp.get(ek)))
        if fw.get("source") != "torch " + e["version"]:
            bad.append("memory.framework.source = %r" % fw.get("source"))
        s = opt("--settings")
        if s and s not in fw.get("allocator_settings", ""):
            bad.append("memory.framework.allocator_settings = %r lacks %r" % (fw.get("allocator_settings"), s))
        if "reserved" in exp and exp["reserved"] >= exp["allocated"]:
            if d["memory"].get("framework_cached_bytes") != exp["reserved"] - exp["allocated"]:
                bad.append("memory.framework_cached_bytes = %r" % d["memory"].get("framework_cached_bytes"))

p = opt("--primary")
if p and d["diagnosis"]["primary"] != p:
    bad.append("diagnosis.primary = %r, want %r (%s)" % (d["diagnosis"]["primary"], p,
               "; ".join(c["summary"] for c in d["diagnosis"]["causes"][:2])))
np = opt("--not-primary")
if np and d["diagnosis"]["primary"] == np:
    bad.append("diagnosis.primary is %r" % np)

for b in bad:
    print("MISMATCH:", b)
if bad:
    print("dump:", dumps[0])
    sys.exit(1)
print("ok: %s primary=%s framework=%s" % (dumps[0].split("/")[-1], d["diagnosis"]["primary"],
                                           None if fw is None else {k: fw[k] for k in ("allocated_bytes", "reserved_bytes", "largest_free_block_bytes")}))
