"""torch.optim.AdamW: exp_avg and exp_avg_sq, each the size of its parameter, made at the first step."""
import torch
from torch.optim.optimizer import Optimizer


class AdamW(Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=1e-2, amsgrad=False):
        Optimizer.__init__(self, params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                                              amsgrad=amsgrad))

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                self.state[p] = {"step": 0,
                             "exp_avg": torch.empty(p.nbytes, device=p.device),
                                     "exp_avg_sq": torch.empty(p.nbytes, device=p.device)}
            self.state[p]["step"] += 1
