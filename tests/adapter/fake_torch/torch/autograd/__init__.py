"""torch.autograd.backward as PyTorch runs it: the caller waits while an engine thread of its own
(no Python frame of the program's on its stack: started with _thread, running the stand-in's
torch/autograd/_engine.py) makes the gradients; an error there is raised in the caller."""
import _thread

from torch.autograd import _engine


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    params = []
    for r in roots:
        for p in (inputs or r._params):
            if all(p is not q for q in params):
                params.append(p)
    done = _thread.allocate_lock()
    done.acquire()
    box = {}
    _thread.start_new_thread(_engine.run, (params, box, done))
    done.acquire()
    if "error" in box:
        raise box["error"]
