"""`python -m oomguard kernelspec`: a Jupyter kernel spec (kernel.json) that starts this Python
with liboomguard.so preloaded.  Jupyter gives a kernel the variables of the spec's "env"; the
library then loads the Python adapters itself (it puts them on PYTHONPATH before the interpreter
reads it), so a notebook that runs out of memory gets the same dump as `oomguard run`.
Writes nothing but kernel.json; Jupyter need not be installed to write it."""
import argparse
import json
import os
import sys

from . import library

USAGE_EPILOG = """\
where it goes (as `jupyter kernelspec install` would put it):
  --user (default)   $JUPYTER_DATA_DIR, else $XDG_DATA_HOME/jupyter, else ~/.local/share/jupyter
  --sys-prefix       {sys.prefix}/share/jupyter: this virtual environment's Jupyter only
  --prefix DIR       DIR/share/jupyter
  --dir DIR          DIR/kernel.json exactly
then KERNELS/<name>/kernel.json.  `jupyter kernelspec list` shows it; pick "<display name>" in
the notebook.  OOMGUARD_* options for the kernel: --env OOMGUARD_DIR=/scratch/oom (repeatable).
"""


def data_dir(args):
    if args.prefix:
        return os.path.join(args.prefix, "share", "jupyter")
    if args.sys_prefix:
        return os.path.join(sys.prefix, "share", "jupyter")
    if os.environ.get("JUPYTER_DATA_DIR"):
        return os.environ["JUPYTER_DATA_DIR"]
    xdg = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(xdg, "jupyter")


def spec(python, display_name, extra_env):
    env = {"LD_PRELOAD": library()}
    env.update(extra_env)
    return {
        "argv": [python, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": display_name,
        "language": "python",
        "env": env,
        "metadata": {"debugger": True},
    }


def main(argv):
    p = argparse.ArgumentParser(prog="python -m oomguard kernelspec", epilog=USAGE_EPILOG,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                description="Write a Jupyter kernel spec whose kernels run with liboomguard.so preloaded.")
    p.add_argument("--name", default="oomguard", help="kernel directory name (default: oomguard)")
    p.add_argument("--display-name", default="Python %d (oomguard)" % sys.version_info[0],
                   help="name shown in Jupyter (default: %(default)s)")
    p.add_argument("--python", default=sys.executable, help="interpreter the kernel runs (default: this one)")
    p.add_argument("--env", action="append", default=[], metavar="VAR=VALUE", help="another variable for the kernel")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--user", action="store_true", help="the user's Jupyter data directory (default)")
    where.add_argument("--sys-prefix", action="store_true", help="this environment's Jupyter data directory")
    where.add_argument("--prefix", metavar="DIR", help="DIR/share/jupyter")
    where.add_argument("--dir", metavar="DIR", help="write DIR/kernel.json")
    p.add_argument("--print", action="store_true", help="print kernel.json on stdout instead of writing it")
    args = p.parse_args(argv)
    extra = {}
    for kv in args.env:
        name, eq, value = kv.partition("=")
        if not eq or not name:
            p.error("--env wants VAR=VALUE, not %r" % kv)
        if name == "LD_PRELOAD":
            value = library() + ":" + value      # the library stays first
        extra[name] = value
    text = json.dumps(spec(args.python, args.display_name, extra), indent=1) + "\n"
    if args.print:
        sys.stdout.write(text)
        return 0
    kdir = args.dir or os.path.join(data_dir(args), "kernels", args.name)
    os.makedirs(kdir, exist_ok=True)
    path = os.path.join(kdir, "kernel.json")
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)
    print(path)
    return 0
