"""What the dump checkers (check_dump.py, check_fw.py) share: the command line DUMP_DIR
EXPECTED.json [options], the one dump in DUMP_DIR, the checks both make first (status oom, the
device), the primary cause, and the verdict: every mismatch printed, exit status 1 when there is
one."""
import glob
import json
import sys


class Check(object):
    def __init__(self, argv):
        self.ddir, expf = argv[0], argv[1]
        self.opts = argv[2:]
        dumps = sorted(glob.glob(self.ddir + "/oomguard-*.json"))
        if len(dumps) != 1:
            print("expected one dump in %s, found %d" % (self.ddir, len(dumps)))
            sys.exit(1)
        self.path = dumps[0]
        self.d = json.load(open(self.path))
        self.e = json.load(open(expf))
        self.exp = self.e.get("expected", {})
        self.bad = []
        d, exp = self.d, self.exp
        if d.get("status") != "oom":
            self.bad.append("status %r" % d.get("status"))
        if "device" in exp and d["event"]["device"] != exp["device"]:
            self.bad.append("event.device %r != %r" % (d["event"]["device"], exp["device"]))

    def opt(self, name):
        """The value after --name (True for a flag without one), or None."""
        opts = self.opts
        if name in opts:
            i = opts.index(name)
            return opts[i + 1] if i + 1 < len(opts) and not opts[i + 1].startswith("--") else True
        return None

    def primary(self):
        """--primary ID (or ID1,ID2): diagnosis.primary is one of them."""
        p = self.opt("--primary")
        diag = self.d["diagnosis"]
        if p and diag["primary"] not in p.split(","):
            self.bad.append("diagnosis.primary = %r, want %r (%s)" % (diag["primary"], p,
                            "; ".join(c["summary"] for c in diag["causes"][:2])))

    def finish(self, summary):
        """Prints the mismatches and exits 1, or prints "ok: DUMP summary"."""
        for b in self.bad:
            print("MISMATCH:", b)
        if self.bad:
            print("dump:", self.path)
            sys.exit(1)
        print("ok: %s %s" % (self.path.split("/")[-1], summary))
