#!/usr/bin/env python3
"""Checks the wiring of the Kubernetes example (examples/kubernetes/*.yaml), since no
cluster is at hand: the init container copies liboomguard.so, lib/ and the Python adapters
into a volume that the training container mounts where LD_PRELOAD points; OOMGUARD_DIR lies on a persistent
volume claim that the directory defines; every $(VAR) in env and args is defined before
use; every volume mounted is declared.  Exits 0 when all hold, 77 without PyYAML."""
import glob
import os
import re
import sys

try:
    import yaml
except ImportError:
    print("PyYAML not installed (apt-get install python3-yaml)")
    sys.exit(77)

root = sys.argv[1] if len(sys.argv) > 1 else "examples/kubernetes"
docs = [d for f in sorted(glob.glob(os.path.join(root, "*.yaml"))) for d in yaml.safe_load_all(open(f)) if d]
kinds = {d["kind"]: d for d in docs}
claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
job = kinds["Job"]
pod = job["spec"]["template"]["spec"]
volumes = {v["name"]: v for v in pod["volumes"]}


def envmap(c):
    env, seen = {}, set()
    for e in c.get("env", []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", str(e.get("value", ""))):
            assert ref in seen, "%s: $(%s) used before it is defined" % (c["name"], ref)
        seen.add(e["name"])
        env[e["name"]] = e
    for a in c.get("args", []):
        for ref in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", a):
            assert ref in seen or (ref == "JOB_COMPLETION_INDEX" and job["spec"].get("completionMode") == "Indexed"), \
                "%s: $(%s) in args is not defined" % (c["name"], ref)
    return env


def mount_of(c, path):
    """The volume mounted at the longest prefix of path in container c."""
    best = None
    for m in c.get("volumeMounts", []):
        assert m["name"] in volumes, "%s mounts undeclared volume %s" % (c["name"], m["name"])
        mp = m["mountPath"].rstrip("/")
        if path == mp or path.startswith(mp + "/"):
            if not best or len(mp) > len(best["mountPath"]):
                best = m
    return best


init = pod["initContainers"][0]
train = pod["containers"][0]
ienv, tenv = envmap(init), envmap(train)
preload = tenv["LD_PRELOAD"]["value"]
m = mount_of(train, preload)
assert m, "LD_PRELOAD %s is on no volume of the training container" % preload
lib_vol = m["name"]
assert "emptyDir" in volumes[lib_vol], "the library volume should be an emptyDir"
im = mount_of(init, preload)
assert im and im["name"] == lib_vol, "the init container does not mount the library volume at %s" % preload
cmd = " ".join(init["command"])
assert "liboomguard.so" in cmd and os.path.dirname(preload) in cmd, "the init container does not copy the library there: %s" % cmd
odir = tenv["OOMGUARD_DIR"]["value"]
om = mount_of(train, odir)
assert om and "persistentVolumeClaim" in volumes[om["name"]], "OOMGUARD_DIR %s is not on a persistent volume" % odir
assert volumes[om["name"]]["persistentVolumeClaim"]["claimName"] in claims, "the claim is not defined in the example"
assert ienv["OOMGUARD_DIR"]["value"] == odir and "mkdir -p" in cmd, "the init container does not create OOMGUARD_DIR"
assert not om.get("readOnly"), "the dump volume is read-only"
# The image the init container copies from has the bundle (pkg/bundle.sh) where the command expects
# it, and the init container copies what the library needs next to it: lib/ and the adapters.
dockerfile = open(os.path.join(root, "Dockerfile")).read()
src = re.search(r"(/\S+)/liboomguard\.so", cmd).group(1)
assert re.search(r"^RUN make B=build bundle$", dockerfile, re.M) and \
    "COPY --from=build /src/build/bundle %s" % src in dockerfile, "the Dockerfile does not put the bundle in %s" % src
for part in ("lib", "python"):
    assert "%s/%s " % (src, part) in cmd, "the init container does not copy %s/ (%s)" % (part, cmd)
# the build stage installs what the library and the command link (shim/shim.mk, tools/tools.mk)
build_stage = dockerfile.split("\nFROM ")[1]
for pkg in ("libunwind-dev", "libcjson-dev", "libdw-dev", "libelf-dev", "patchelf"):
    assert pkg in build_stage, "the build stage does not install %s" % pkg
tenv_names = set(tenv)
assert "NODE_NAME" in tenv_names and "spec.nodeName" in str(tenv["NODE_NAME"]), "NODE_NAME (the dump's node) is not set"
print("kubernetes example: init container -> %s (%s) -> LD_PRELOAD=%s; OOMGUARD_DIR=%s on claim %s"
      % (lib_vol, "emptyDir", preload, odir, volumes[om["name"]]["persistentVolumeClaim"]["claimName"]))
