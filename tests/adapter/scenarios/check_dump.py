"""check_dump.py DUMP_DIR EXPECTED.json [--primary ID] [--no-framework] [--no-snapshot] [--settings TEXT]

Checks the one oomguard-*.json dump in DUMP_DIR against what the job wrote to EXPECTED.json.
Prints every mismatch; exit status 1 when there is one."""
import sys

from checkkit import Check

c = Check(sys.argv[1:])
d, e, exp, bad, opt = c.d, c.e, c.exp, c.bad, c.opt
fw = d.get("memory", {}).get("framework")

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
                      ("num_ooms", "num_ooms"), ("num_alloc_retries", "num_alloc_retries"),
                      ("freed_bytes_total", "freed")]      # None (torch without the key): null
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

c.primary()
np = opt("--not-primary")
if np and d["diagnosis"]["primary"] == np:
    bad.append("diagnosis.primary is %r" % np)

c.finish("primary=%s framework=%s" % (d["diagnosis"]["primary"], None if fw is None else
                                      {k: fw[k] for k in ("allocated_bytes", "reserved_bytes", "largest_free_block_bytes")}))
