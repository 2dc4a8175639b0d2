"""train.py -- training a 1B-parameter model (fp32, AdamW) with an EMA of the weights kept on the GPU
and updated every 100 steps by a hand-written foreach update, on a 24 GiB card:

    ema_params = [p.detach().clone() for p in model.parameters()]        # 4 GiB, from the start
    for step, batch in enumerate(loader, 1):
        loss = model(batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=False)
        if step % 100 == 0:
            with torch.no_grad():
                scaled = torch._foreach_mul(ema_params, decay)            # new tensors: 4 GiB
                torch._foreach_add_(scaled, params, alpha=1 - decay)
                ema_params = scaled

Weights 4 GiB + grads 4 GiB + AdamW state 8 GiB + EMA 4 GiB = 20 GiB live; a step's activations
(3 GiB) come and go.  99 steps run flat; at step 100 the out-of-place _foreach_mul needs a second
copy of the EMA (4 GiB) with autograd off and fails part way.  This is training (the optimizer has
stepped 100 times), not inference, and the activations are already freed: a smaller batch changes
nothing.  An expert: update the EMA in place (torch._foreach_lerp_(ema_params, params, 1 - decay)
or mul_/add_), or keep the EMA on the CPU; not a leak, nothing to release, not inference_mode.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Model(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        for i in range(n_layers):
            setattr(self, "w%d" % i, torch.nn.Parameter(torch.empty(128 * MiB, device="cuda")))

    def forward(self, batch):
        h = batch
        for _ in range(12):
            a = torch.empty(256 * MiB, device="cuda")
            a._saved = h
            h = a
        return h


def _foreach_mul(tensors, scalar):
    """torch._foreach_mul(tensors, scalar) (the stand-in torch has no foreach ops): a new tensor
    per input."""
    out = []
    for t in tensors:
        out.append(torch.empty_like(t))
    return out


def _foreach_add_(tensors, others, alpha=1.0):
    """torch._foreach_add_: in place, nothing allocated."""
    return tensors


def main():
    import time
    model = Model().cuda()
    params = model.parameters()
    ema_params = []
    for p in params:
        ema_params.append(torch.empty_like(p))                      # p.detach().clone()
    optimizer = torch.optim.AdamW(params, lr=1e-4)
    decay = 0.999
    for step in range(1, 10001):
        batch = torch.empty(8 * MiB, device="cuda")
        loss = model(batch)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)                      # the story's 4 GiB of grads stay
        del loss, batch
        if step % 100 == 0:
            with torch.no_grad():
                scaled = _foreach_mul(ema_params, decay)
                _foreach_add_(scaled, params, alpha=1 - decay)
                ema_params = scaled
        time.sleep(0.002)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
