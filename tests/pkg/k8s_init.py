#!/usr/bin/env python3
"""k8s_init.py K8S_DIR IMAGE_DIR VOLUME_DIR: the Kubernetes example's init container and training
container, mapped onto this machine, for a test of the layout they make.

Prints two lines: the init container's shell command, with the image's oomguard directory
(/opt/oomguard in the Dockerfile) replaced by IMAGE_DIR and the shared volume's mount point
replaced by VOLUME_DIR; then the training container's LD_PRELOAD, mapped the same way."""
import glob
import os
import sys

import yaml

k8s, image, volume = sys.argv[1:4]
docs = [d for f in sorted(glob.glob(os.path.join(k8s, "*.yaml"))) for d in yaml.safe_load_all(open(f)) if d]
pod = next(d for d in docs if d["kind"] == "Job")["spec"]["template"]["spec"]
init, train = pod["initContainers"][0], pod["containers"][0]
assert init["command"][:2] == ["sh", "-c"], init["command"]
cmd = init["command"][2]
preload = next(e["value"] for e in train["env"] if e["name"] == "LD_PRELOAD")
mount = next(m["mountPath"] for m in init["volumeMounts"]
             if preload.startswith(m["mountPath"].rstrip("/") + "/")).rstrip("/")
src = "/opt/oomguard"
assert src + "/liboomguard.so" in cmd, cmd
cmd = cmd.replace(src, "\0").replace(mount, volume).replace("\0", image)
print(cmd)
print(volume + preload[len(mount):])
