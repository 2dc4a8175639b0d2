"""A Jupyter notebook fine-tuning a 500M-parameter causal LM (fp32, AdamW, batch 8 x 1024) with a
Hugging Face-style Trainer on a 24 GiB card.  Cell [3] defines the metric, cell [4] trains:

    [3]: def compute_metrics(p):
             preds = p.predictions.argmax(-1); return {"acc": (preds == p.label_ids).mean()}
    [4]: model = AutoModelForCausalLM.from_pretrained(base).cuda()             # 2 GiB
         trainer = Trainer(model, args, train_dataset=train, eval_dataset=val,
                           compute_metrics=compute_metrics)                  # eval every 200 steps
         trainer.train()

Training runs at ~18 GiB (weights, AdamW state, 10 GiB of activations per step).  At step 200 the
evaluation loop gathers the logits of the whole validation set on the GPU (6 GiB; no
eval_accumulation_steps) and then compute_metrics raises a KeyError.  The user fixes cell [3] and
re-runs cell [4].  The KeyError's traceback (sys.last_traceback, kept for %debug) still holds the
frames of the first train(): the old Trainer, with the old model, its AdamW state and the gathered
logits (12 GiB in all), although the globals now name the new objects.  The new model loads; the
first forward of the re-run fails.  Alone, the job fits (it ran 200 steps).  An expert: free the
first run first -- restart the kernel, or del/clear the traceback (%reset, sys.last_traceback =
None), gc.collect(), torch.cuda.empty_cache(); not a smaller batch, not a bigger GPU, not
checkpointing.
"""
import sys
import traceback
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class DecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(76 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(416 * MiB, device="cuda")       # attention and MLP activations, saved
        a._saved = h
        return a


class AutoModelForCausalLM(torch.nn.Module):
    def __init__(self, layers=24):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(224 * MiB, device="cuda"))
        self.layers = [DecoderLayer() for _ in range(layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    @classmethod
    def from_pretrained(cls, path):
        return cls()

    def forward(self, input_ids):
        h = input_ids
        for l in self.layers:
            h = l(h)
        logits = torch.empty(8 * 1024 * 50257 * 2, device="cuda")       # bf16 logits of the batch
        logits._saved, logits._params = h, tuple(self.parameters())
        return logits


class Trainer(object):
    def __init__(self, model, args, compute_metrics):
        self.model, self.args, self.compute_metrics = model, args, compute_metrics
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=args["lr"])

    def training_step(self, input_ids):
        logits = self.model(input_ids)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = logits, logits._params
        scen_truth.backward(loss)
        return loss

    def train(self):
        for step in range(1, self.args["max_steps"] + 1):
            input_ids = torch.empty(8 * 1024 * 8, device="cuda")
            self.training_step(input_ids)
            self.optimizer.step()
            self.model.zero_grad(set_to_none=True)
            del input_ids
            if step % self.args["eval_steps"] == 0:
                self.evaluate()

    def evaluate(self):
        self.model.eval()
        try:
            return self.evaluation_loop()
        finally:
            self.model.train()

    def evaluation_loop(self):
        preds_host = []
        with torch.no_grad():
            for batch in range(8):
                input_ids = torch.empty(8 * 1024 * 8, device="cuda")
                h = input_ids
                for l in self.model.layers:
                    h = torch.empty(64 * MiB, device="cuda")             # no autograd: not kept
                preds_host.append(torch.empty(8 * 1024 * 50257 * 2, device="cuda"))    # logits, gathered
                del h, input_ids
        return self.compute_metrics({"predictions": preds_host, "label_ids": None})


def compute_metrics_v1(p):
    preds = p["predictions"]
    return {"acc": p["labels"]}                     # KeyError: 'labels' (it is label_ids)


def compute_metrics_v2(p):
    return {"acc": 0.41}


CELL_4 = """
model = AutoModelForCausalLM.from_pretrained(base).cuda()
trainer = Trainer(model, args, compute_metrics=compute_metrics)
trainer.train()
"""


def run_cell(source, user_ns, n):
    """What IPython does with a cell: run it in the user namespace; on an exception, print the
    traceback and keep it as sys.last_type/last_value/last_traceback (for %debug)."""
    try:
        exec(compile(source, "<ipython-input-%d>" % n, "exec"), user_ns)
    except KeyError:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        traceback.print_exc(limit=2)


user_ns = {"torch": torch, "AutoModelForCausalLM": AutoModelForCausalLM, "Trainer": Trainer,
           "base": "org/lm-500m", "args": {"lr": 5e-5, "max_steps": 3000, "eval_steps": 200}}
try:
    user_ns["compute_metrics"] = compute_metrics_v1      # cell [3]
    run_cell(CELL_4, user_ns, 4)                         # KeyError at the first evaluation
    user_ns["compute_metrics"] = compute_metrics_v2      # cell [3], fixed
    run_cell(CELL_4, user_ns, 5)                         # cell [4] again
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
