"""`python -m oomguard ARGS` and the console script `oomguard ARGS`: the native command with ARGS,
executed in place of this interpreter (its exit status and signals are the command's own), so
`oomguard run -- python train.py` preloads the wheel's liboomguard.so and its adapters.

Two things are Python's own:
    python -m oomguard kernelspec [...]   a Jupyter kernel whose environment preloads the library
                                          (python -m oomguard kernelspec --help)
    python -m oomguard --library          prints the library's path (for a plain LD_PRELOAD)
"""
import os
import sys

from . import command, library


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["kernelspec"]:
        from . import kernelspec
        return kernelspec.main(argv[1:])
    if argv == ["--library"]:
        print(library())
        return 0
    exe = command()
    try:
        os.execv(exe, ["oomguard"] + argv)
    except OSError as e:
        sys.stderr.write("oomguard: cannot run %s: %s\n" % (exe, e.strerror or e))
        return 125


if __name__ == "__main__":
    sys.exit(main())
