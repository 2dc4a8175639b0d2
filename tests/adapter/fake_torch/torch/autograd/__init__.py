"""torch.autograd.backward as PyTorch runs it: the caller waits while an engine thread of its own
(no Python frame of the program's on its stack: started with _thread, running the stand-in's
torch/autograd/_engine.py) makes the gradients; an error there is raised in the caller.  A tensor
with no graph (it does not require grad and has no grad_fn: made under torch.no_grad or
inference_mode, detached, of frozen parameters only) is refused before the engine starts, on the
caller's thread, with PyTorch's RuntimeError and message, and no gradient is made."""
import _thread

from torch.autograd import _engine


def backward(tensors, grad_tensors=None, retain_graph=None, create_graph=False, inputs=None):
    roots = list(tensors) if isinstance(tensors, (list, tuple)) else [tensors]
    for i, r in enumerate(roots):
        if not r.requires_grad and r.grad_fn is None:
            raise RuntimeError("element %d of tensors does not require grad and does not have a grad_fn" % i)
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
