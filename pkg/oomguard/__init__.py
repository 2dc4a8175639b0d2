"""oomguard from a wheel: the pieces it ships and where they are.

    library()    liboomguard.so, to preload:  LD_PRELOAD=$(python -m oomguard --library) python train.py
    command()    the native `oomguard` command (the console script `oomguard` and
                 `python -m oomguard` run it in their place)
    adapters()   the Python adapters; the library puts this directory first on PYTHONPATH in
                 every Python process it is preloaded into, so nothing needs importing

Importing this package does nothing else: the adapters are loaded by the library, not from here.
"""
import os

_HERE = os.path.dirname(os.path.abspath(__file__))


def library():
    return os.path.join(_HERE, "liboomguard.so")


def command():
    return os.path.join(_HERE, "bin", "oomguard")


def adapters():
    return os.path.join(_HERE, "python")


def _version():
    try:
        with open(os.path.join(_HERE, "include", "oomguard.h")) as f:
            for line in f:
                words = line.split()
                if words[:2] == ["#define", "OOMGUARD_VERSION"]:
                    return line.split('"')[1]
    except OSError:
        pass
    return "unknown"


__version__ = _version()
