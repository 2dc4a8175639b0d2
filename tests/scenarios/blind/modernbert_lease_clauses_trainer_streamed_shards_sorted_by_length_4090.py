"""train_lease_clauses.py -- a legal-tech company fine-tunes ModernBERT-large (395M parameters, 8,192-token
context) to tag 41 risk clauses in commercial lease agreements (multi-label), on 1.2M leases, with the
Hugging Face Trainer on a workstation RTX 4090 (24 GB): fp32 weights, bf16 autocast, SDPA attention,
batch 8, max_length 8192 with dynamic padding (DataCollatorWithPadding: each batch padded to its longest
lease).  The corpus was tokenized once by a preprocessing job, which sorted it by token count to pick the
truncation length from the histogram and then wrote it out as 64 contiguous Parquet shards; the training
script streams those shards because the tokenized corpus does not fit the workstation's RAM:

    stream = load_dataset("parquet", data_files=sorted(glob("tok/leases-*.parquet")), split="train",
                          streaming=True)                          # an IterableDataset
    args = TrainingArguments("out/modernbert-leases", per_device_train_batch_size=8, bf16=True,
                             learning_rate=3e-5, max_steps=150_000, logging_steps=500, save_steps=5_000)
    trainer = Trainer(model=model, args=args, train_dataset=stream,
                      data_collator=DataCollatorWithPadding(tok), compute_metrics=f1_micro)
    trainer.train()

The Trainer shuffles a map-style dataset with a RandomSampler, but an IterableDataset is read in the
order it yields, and this one yields the leases shortest first.  So the padded batch length climbs slowly
for the whole run: ~200 tokens at the start, 1,000 at 40% of the run, 2,300 at two thirds.  nvidia-smi's
number climbs with it, step after step, and the team suspects a leak in the Trainer.  Nothing is kept
between steps: after each optimizer step only the weights and AdamW's state are allocated (4.4 GiB), the
same at step 500 and at step 100,000; what grows is one step's activations, ~0.86 MiB per token of the
batch (28 layers, no activation checkpointing).  Around step 108,500 (72% of the run) the batches reach
~2,700 tokens (8 x 2,700 x 0.86 MiB = 18.2 GiB of activations): the forward pass still fits, and the
backward fails as it makes the gradients.  The remaining 28% are longer still, up to 8 x 8,192 tokens:
55 GiB of activations.

An expert: not a leak -- the stream is sorted by length, and the long tail simply does not fit at batch 8
without checkpointing.  Make the longest batch fit: gradient checkpointing (gradient_checkpointing=True:
28 layer inputs plus one layer's recompute, ~9 GiB at 8 x 8,192), or batch by a token budget (e.g. 16k
tokens per batch, with gradient accumulation to keep the effective batch), or a smaller per-device batch
with accumulation; and shuffle the stream (stream.shuffle(buffer_size=10_000, seed=0)) so training does not
see the leases by length -- shuffling alone only moves the failure earlier, to the first random long batch.
Wrong first advice: releasing references / looking for a leak (nothing is held across steps),
empty_cache or expandable_segments (the failing request is small and 0.75 GiB sits cached in pieces, so
they might let this one batch through, but the batches behind it are longer still), restarting, an 8-bit
optimizer (AdamW's 2.9 GiB is not what grows), length bucketing (the stream is already one long bucket
sequence: it is the long buckets that do not fit).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH, HIDDEN, LAYERS, MAX_LEN = 8, 1024, 28, 8192
MAX_STEPS = 150_000
STRIDE = 500            # the simulation walks the stream one batch per logging interval (500 real steps)


def padded_length(step):
    """The longest lease in the batch at `step` of the sorted stream, from the corpus's token-count
    percentiles: p10 230, p25 520, p50 1,400, p70 2,500, p80 3,400, p90 5,200, p95 7,200, truncated at 8,192."""
    q = step / float(MAX_STEPS)
    points = ((0.0, 180), (0.10, 230), (0.25, 520), (0.50, 1400), (0.70, 2500), (0.80, 3400), (0.90, 5200),
              (0.95, 7200), (1.0, MAX_LEN))
    for (q0, l0), (q1, l1) in zip(points, points[1:]):
        if q <= q1:
            return int(l0 + (l1 - l0) * (q - q0) / (q1 - q0))
    return MAX_LEN


# ---- transformers' ModernBertForSequenceClassification (sizes only) ------------------------------------
class ModernBertEncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Module()
        self.attn.Wqkv = torch.nn.Parameter(torch.empty(HIDDEN * 3 * HIDDEN * 4, device="cuda"))
        self.attn.Wo = torch.nn.Parameter(torch.empty(HIDDEN * HIDDEN * 4, device="cuda"))
        self.mlp = torch.nn.Module()
        self.mlp.Wi = torch.nn.Parameter(torch.empty(HIDDEN * 5248 * 4, device="cuda"))
        self.mlp.Wo = torch.nn.Parameter(torch.empty(2624 * HIDDEN * 4, device="cuda"))

    def forward(self, hidden_states, attention_mask=None):
        tokens = hidden_states.nbytes // (HIDDEN * 4)
        qkv = torch.empty(tokens * 3 * HIDDEN * 2, device="cuda")            # bf16, kept for backward
        attn_out = torch.empty(tokens * HIDDEN * 2, device="cuda")
        wi = torch.empty(tokens * 5248 * 2, device="cuda")                    # GeGLU input and gate
        act = torch.empty(tokens * 2624 * 2, device="cuda")
        normed = torch.empty(tokens * HIDDEN * 4, device="cuda")              # the two LayerNorm inputs
        out = torch.empty(tokens * HIDDEN * 4, device="cuda")                 # fp32 residual stream
        out._saved = [hidden_states, qkv, attn_out, wi, act, normed]
        return out


class ModernBertModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Module()
        self.embeddings.tok_embeddings = torch.nn.Parameter(torch.empty(50368 * HIDDEN * 4, device="cuda"))
        self.layers = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), ModernBertEncoderLayer())
        self.gradient_checkpointing = False

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids
        self.embeddings.tok_embeddings
        hidden = torch.empty(batch * seq * HIDDEN * 4, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, attention_mask)
        return hidden


class SequenceClassifierOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class ModernBertForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.model = ModernBertModel()
        self.classifier = torch.nn.Parameter(torch.empty(HIDDEN * num_labels * 4, device="cuda"))
        self.num_labels = num_labels

    @classmethod
    def from_pretrained(cls, name, num_labels, problem_type=None, attn_implementation="sdpa"):
        return cls(num_labels)

    def forward(self, input_ids, attention_mask, labels):
        hidden = self.model(input_ids, attention_mask)
        self.classifier
        pooled = torch.empty(input_ids[0] * HIDDEN * 4, device="cuda")
        pooled._saved = hidden
        logits = torch.empty(input_ids[0] * self.num_labels * 4, device="cuda")
        logits._saved = pooled
        loss = torch.nn.functional.nll_loss(logits, labels)                 # BCEWithLogitsLoss
        return SequenceClassifierOutput(loss, logits)


def backward(loss):
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor):
            nxt = getattr(t, "_saved", None)
            t._saved = None
            if nxt is not None:
                todo.append(nxt)


# ---- datasets / transformers, as far as this job uses them ---------------------------------------------
class IterableDataset(object):
    """datasets.IterableDataset over the 64 Parquet shards, read in file order."""

    def __init__(self, files):
        self.files = files

    def __iter__(self):
        for step in range(0, MAX_STEPS, STRIDE):
            n = padded_length(step)
            for _ in range(BATCH):
                yield {"input_ids": n, "labels": None}


def load_dataset(kind, data_files, split="train", streaming=False):
    return IterableDataset(data_files)


class DataCollatorWithPadding(object):
    def __init__(self, tokenizer, padding=True):
        self.tokenizer = tokenizer

    def __call__(self, features):
        longest = max(f["input_ids"] for f in features)                        # pad to the batch's longest
        return {"input_ids": (len(features), longest), "attention_mask": None, "labels": None}


class TrainingArguments(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, bf16=False, learning_rate=5e-5, max_steps=-1,
                 logging_steps=500, save_steps=500, gradient_checkpointing=False, **kwargs):
        self.output_dir = output_dir
        self.per_device_train_batch_size = per_device_train_batch_size
        self.bf16, self.learning_rate, self.max_steps = bf16, learning_rate, max_steps
        self.logging_steps, self.save_steps = logging_steps, save_steps
        self.gradient_checkpointing = gradient_checkpointing


class Trainer(object):
    def __init__(self, model, args, train_dataset, data_collator, compute_metrics=None):
        self.model, self.args = model, args
        self.train_dataset, self.data_collator = train_dataset, data_collator
        self.global_step = 0

    def get_train_dataloader(self):
        # a map-style dataset gets a RandomSampler; an IterableDataset is read in the order it yields
        batch = []
        for example in self.train_dataset:
            batch.append(example)
            if len(batch) == self.args.per_device_train_batch_size:
                yield self.data_collator(batch)
                batch = []

    def train(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate, weight_decay=0.01)
        return self._inner_training_loop()

    def _inner_training_loop(self):
        for inputs in self.get_train_dataloader():
            self.training_step(self.model, inputs)
            self.optimizer.step()
            self.model.zero_grad()
            self.global_step += STRIDE
            if self.global_step % 10_000 == 0:
                print("{'loss': 0.0712, 'grad_norm': 0.39, 'learning_rate': 2.1e-05, 'epoch': %.2f}  "
                      "step %d  seq %d" % (self.global_step / float(MAX_STEPS), self.global_step,
                                           inputs["input_ids"][1]))

    def training_step(self, model, inputs):
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.compute_loss(model, inputs)
        backward(loss)
        return 0.0

    def compute_loss(self, model, inputs):
        outputs = model(**inputs)
        return outputs.loss


def f1_micro(eval_pred):
    return {"f1_micro": 0.0}


try:
    tok = object()
    model = ModernBertForSequenceClassification.from_pretrained(
        "answerdotai/ModernBERT-large", num_labels=41, problem_type="multi_label_classification",
        attn_implementation="sdpa")                                  # .to("cuda") by the Trainer
    stream = load_dataset("parquet", data_files=["tok/leases-%05d-of-00064.parquet" % i for i in range(64)],
                          split="train", streaming=True)
    args = TrainingArguments("out/modernbert-leases", per_device_train_batch_size=BATCH, bf16=True,
                             learning_rate=3e-5, max_steps=MAX_STEPS, logging_steps=500, save_steps=5_000)
    trainer = Trainer(model=model, args=args, train_dataset=stream, data_collator=DataCollatorWithPadding(tok),
                      compute_metrics=f1_micro)
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
