"""What the test jobs (job.py, job_jax.py, job_cupy.py, job_tf.py, job_query.py) share: MODE and
OUT.json from the command line, here(), and writing OUT.json.  Standard library only, imported
from the jobs' own directory: the jobs run unchanged with the real frameworks on a real GPU."""
import json
import sys

MiB = 1 << 20
mode = sys.argv[1]
out = sys.argv[2] if len(sys.argv) > 2 else None


def here():
    """The caller's line (the test finds it in event.python_stack / python_sites)."""
    return sys._getframe(1).f_lineno


def write(doc):
    """Writes doc to OUT.json, if the command line named one."""
    if not out:
        return
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
