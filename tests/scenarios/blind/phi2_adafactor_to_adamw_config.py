"""sft.py -- full supervised fine-tuning of Phi-2 (2.7B parameters, fp32 master weights, bf16 autocast,
gradient checkpointing on, batch 4 x 2048) on one A100 40GB, driven by a YAML config.  It ran for
weeks with `optim: adafactor`; a teammate changed the config to `optim: adamw_torch` ("AdamW
converges better on our data") and nothing else:

    optim_name = cfg["optim"]                          # was "adafactor", now "adamw_torch"
    if optim_name == "adafactor":
        optimizer = Adafactor(model.parameters(), lr=1e-5, scale_parameter=False, relative_step=False)
    else:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(**batch).loss
        loss.backward(); optimizer.step(); optimizer.zero_grad(set_to_none=True)

Weights 10.4 GiB, gradients 10.4 GiB, 4 GiB of (checkpointed) activations: the first forward and
backward go through as before.  Adafactor kept factored second moments (a few MiB); AdamW's first
step creates exp_avg and exp_avg_sq, 20.7 GiB, and fails part-way (activations are gone by then).
An expert: the optimizer state is what grew -- go back to Adafactor, or use an 8-bit/paged AdamW
(adamw_bnb_8bit: 5.2 GiB of state), or LoRA, or offload the optimizer to the CPU (ZeRO-Offload);
a smaller batch or checkpointing change nothing (already on, activations gone at the step).
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


# optimizer.step() makes exp_avg and exp_avg_sq of a parameter in one expression: when the second
# fails, the first is dropped as the exception unwinds, before the truth mark in the except block.
# While a step runs, torch.empty (AdamW's) also keeps what it made in _made, so the mark sees the
# memory as it was at the failure.  Compiled as part of torch's own file (as scen_truth does): the
# dump's failing Python line stays the program's.
_KEEP = """
def kept(nbytes, *args, **kw):
    t = noted(nbytes, *args, **kw)
    made.append(t)
    return t
"""
_made = []
_ns = {"noted": torch.empty, "made": _made}
exec(compile(_KEEP, torch.__file__, "exec"), _ns)
_noted, _kept = torch.empty, _ns["kept"]

CONFIG = {"model": "microsoft/phi-2", "optim": "adamw_torch", "lr": 1e-5, "per_device_train_batch_size": 4,
          "max_seq_length": 2048, "bf16": True, "gradient_checkpointing": True}


class Adafactor(torch.optim.Optimizer):
    """transformers.optimization.Adafactor: factored second moments (a row and a column vector per
    matrix), made at the first step."""

    def __init__(self, params, lr=None, scale_parameter=True, relative_step=True, warmup_init=False):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr, scale_parameter=scale_parameter,
                                                          relative_step=relative_step))

    def _update(self):
        for p in self.param_groups[0]["params"]:
            if p not in self.state:
                self.state[p] = {"step": 0, "exp_avg_sq_row": torch.empty(40 * 1024, device=p.device),
                                 "exp_avg_sq_col": torch.empty(40 * 1024, device=p.device)}
            self.state[p]["step"] += 1


class PhiForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=32):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))
        for i in range(n_layers):
            layer = torch.nn.Module()
            layer.self_attn = torch.nn.Parameter(torch.empty(100 * MiB, device="cuda"))
            layer.mlp = torch.nn.Parameter(torch.empty(216 * MiB, device="cuda"))
            setattr(self, "layer%d" % i, layer)
        self.lm_head = torch.nn.Parameter(torch.empty(250 * MiB, device="cuda"))
        self.n_layers = n_layers

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, input_ids):
        h = input_ids
        for _ in range(self.n_layers):
            a = torch.empty(80 * MiB, device="cuda")       # checkpointed: each layer's input only
            a._saved = h
            h = a
        logits = torch.empty(1280 * MiB, device="cuda")    # bf16 logits of the last layer, for the loss
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


def make_optimizer(model, cfg):
    if cfg["optim"] == "adafactor":
        return Adafactor(model.parameters(), lr=cfg["lr"], scale_parameter=False, relative_step=False)
    return torch.optim.AdamW(model.parameters(), lr=cfg["lr"])


def main():
    model = PhiForCausalLM.from_pretrained(CONFIG["model"]).cuda()
    model.train()
    optimizer = make_optimizer(model, CONFIG)
    for step in range(20000):
        input_ids = torch.empty(4 * 2048 * 8, device="cuda")
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids)
        scen_truth.backward(loss)
        torch.empty = _kept
        optimizer.step()
        torch.empty = _noted
        del _made[:]
        optimizer.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        del loss, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
