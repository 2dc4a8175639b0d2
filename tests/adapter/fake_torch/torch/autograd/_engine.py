"""The stand-in's autograd engine thread: one gradient per leaf of the graph that requires one
(torch/autograd/_graph.py), of its size, dtype and device, made at the first backward and
accumulated into in place afterwards (no new memory), as PyTorch's AccumulateGrad does."""
import threading

import torch

_tls = threading.local()


def on_engine_thread():
    """Whether the calling thread is an engine thread (the allocator calls the out-of-memory
    observers from one as PyTorch's C++ does: torch/_alloc.py)."""
    return getattr(_tls, "engine", False)


def run(params, box, done):
    _tls.engine = True
    try:
        for p in params:
            if p.requires_grad and p.grad is None:
                p.grad = torch.empty_like(p)
    except BaseException as e:      # handed to the caller
        box["error"] = e
    finally:
        done.release()
