"""A Colab notebook on a 16 GiB T4: fine-tuning roberta-large (355M parameters, fp32: the T4 has no
bf16 and the student did not turn on fp16) for sentiment classification, batch 16 x 512, with the
Hugging Face Trainer.  To compare learning rates the student keeps every run in a list:

    [2]: results = []
    [5]: lr = 1e-5
         model = AutoModelForSequenceClassification.from_pretrained("roberta-large", num_labels=2).to("cuda")
         trainer = Trainer(model=model, args=TrainingArguments("out", learning_rate=lr,
                           per_device_train_batch_size=16, num_train_epochs=1), train_dataset=train_ds)
         trainer.train()
         results.append({"lr": lr, "trainer": trainer, "metrics": trainer.evaluate(val_ds)})

The first run (weights 1.3 GiB, gradients 1.3 GiB, AdamW 2.6 GiB, ~8 GiB of activations) peaks at
~13 GiB and finishes.  The student edits lr = 3e-5 and runs cell [5] again.  results[0]["trainer"]
still holds the first model and its optimizer (the Trainer keeps both: ~4 GiB on the GPU), so a
second copy of roberta-large is loaded next to it; once the re-run's first step has made its own
gradients and AdamW state, the forward of its second step does not fit.  Nothing is wrong with the
batch or the model; the notebook holds two models.  An expert: keep only the metrics in the list
(results.append({"lr": lr, "metrics": ...}); del trainer, model; gc.collect();
torch.cuda.empty_cache()), or restart the kernel between runs; not quantization, not a smaller
batch, not another GPU.
"""
import sys
import time
import traceback
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)


class RobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))     # 4 x 1024 x 1024 fp32
        self.intermediate = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))  # 1024 x 4096
        self.output = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))        # 4096 x 1024

    def forward(self, h):
        a = torch.empty(336 * MiB, device="cuda")       # batch 16 x 512: attention probs, FFN, norms (fp32)
        a._saved = h
        return a


class RobertaForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(197 * MiB, device="cuda"))  # 50265 x 1024 fp32
        self.layers = [RobertaLayer() for _ in range(24)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)
        self.classifier = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, num_labels=2):
        return cls()

    def forward(self, input_ids):
        h = input_ids
        for l in self.layers:
            h = l(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


class Trainer(object):
    """The parts of transformers.Trainer that matter here: it keeps the model and, once train()
    has run, the optimizer it created (and with it AdamW's state)."""

    def __init__(self, model, lr, steps):
        self.model, self.lr, self.steps = model, lr, steps
        self.optimizer = None

    def train(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.lr)
        for step in range(self.steps):
            input_ids = torch.empty(16 * 512 * 8, device="cuda")
            loss = self.model(input_ids)
            scen_truth.backward(loss)
            self.optimizer.step()
            self.model.zero_grad(set_to_none=True)
            del loss, input_ids

    def evaluate(self):
        return {"eval_accuracy": 0.94, "eval_loss": 0.19}


CELL5 = """
model = RobertaForSequenceClassification.from_pretrained("roberta-large", num_labels=2).to("cuda")
trainer = Trainer(model=model, lr=lr, steps=40)
trainer.train()
results.append({"lr": lr, "trainer": trainer, "metrics": trainer.evaluate()})
"""


def run_cell(source, user_ns, n):
    """What IPython does with a cell: run it in the user namespace; on an exception, show the
    traceback, keep it for %debug, and re-raise here so the truth mark is written."""
    try:
        exec(compile(source, "<ipython-input-%d>" % n, "exec"), user_ns)
    except BaseException:
        sys.last_type, sys.last_value, sys.last_traceback = sys.exc_info()
        traceback.print_exc(limit=1)
        raise


user_ns = {"torch": torch, "RobertaForSequenceClassification": RobertaForSequenceClassification,
           "Trainer": Trainer}
try:
    run_cell("results = []", user_ns, 2)
    user_ns["lr"] = 1e-5
    run_cell(CELL5, user_ns, 5)                  # the first run, to the end
    time.sleep(0.05)
    user_ns["lr"] = 3e-5                         # the student edits the cell and runs it again
    run_cell(CELL5, user_ns, 6)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
