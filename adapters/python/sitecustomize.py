"""oomguard's sitecustomize: `oomguard run` puts this directory first on PYTHONPATH, so every
Python process of the job imports this file at startup (site.py does, before the script runs).

The plain `LD_PRELOAD=liboomguard.so python ...` puts this directory first on PYTHONPATH too
(liboomguard's constructor, before the interpreter reads its environment), so both usages load it.

It enables the adapters (oomguard_torch, oomguard_jax, oomguard_cupy: each waits for its
framework's import and does nothing without liboomguard preloaded) unless
OOMGUARD_PYTHON_ADAPTER=0, and then runs the sitecustomize
that this file shadows -- the next one on sys.path (a later PYTHONPATH entry, the distribution's
in the standard library directory, site-packages) -- under the name `sitecustomize`, so that
`import sitecustomize` afterwards gives that module, as it would without oomguard.

An exception from that sitecustomize propagates unchanged: site.py reports it exactly as it would
have without oomguard ("Error in sitecustomize; set PYTHONVERBOSE for traceback:") and the
program goes on.
"""


def _oomguard_enable():
    import os
    if os.environ.get("OOMGUARD_PYTHON_ADAPTER", "1").strip().lower() in ("0", "false", "no", "off"):
        return
    for name in ("oomguard_torch", "oomguard_jax", "oomguard_cupy", "oomguard_tf"):
        try:
            __import__(name)      # each activates itself: waits for its framework's import
        except Exception as e:   # never let an adapter break start-up
            if os.environ.get("OOMGUARD_VERBOSE", "").strip().lower() in ("1", "true", "yes", "on"):
                try:
                    import sys
                    sys.stderr.write("oomguard: %s: not enabled: %s: %s\n" % (name, type(e).__name__, e))
                except Exception:
                    pass


def _oomguard_shadowed_spec():
    """The spec of the sitecustomize that Python would have found after this directory, or None."""
    import os
    import sys
    from importlib.machinery import PathFinder

    def norm(p):
        try:
            return os.path.normcase(os.path.realpath(p or os.getcwd()))
        except Exception:
            return p

    here_file = norm(__file__)
    here = os.path.dirname(here_file)
    entries = list(sys.path)
    start = None
    for i, entry in enumerate(entries):
        if isinstance(entry, str) and norm(entry) == here:
            start = i + 1
            break
    if start is None:
        return None       # imported some other way: nothing is shadowed
    for entry in entries[start:]:
        if not isinstance(entry, str) or norm(entry) == here:
            continue
        try:
            spec = PathFinder.find_spec("sitecustomize", [entry])
        except Exception:
            continue
        if spec is None or spec.loader is None:
            continue
        origin = getattr(spec, "origin", None)
        if origin and norm(origin) == here_file:
            continue
        return spec
    return None


def _oomguard_chain():
    import sys
    import importlib.util
    spec = _oomguard_shadowed_spec()
    if spec is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module      # what `import sitecustomize` yields from now on
    spec.loader.exec_module(module)            # its exceptions reach site.py unchanged


_oomguard_enable()
_oomguard_chain()
