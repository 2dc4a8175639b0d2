"""train_prm.py -- a process reward model (PRM) for an RLHF/best-of-N math pipeline: Qwen2.5-Math-1.5B
fine-tuned Math-Shepherd style, where every reasoning step ends with a tag token and the label is the "+" or
"-" token there; trained as a causal LM with Hugging Face's Trainer on ONE A100-SXM4-80GB, run with plain
`LD_PRELOAD=liboomguard.so python train_prm.py`:

    args = TrainingArguments(per_device_train_batch_size=4, per_device_eval_batch_size=8, bf16=True,
                             gradient_checkpointing=True, eval_strategy="steps", eval_steps=200, ...)
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val_2000,
                      compute_metrics=step_accuracy)          # reads the "+"/"-" logits at the step tags
    trainer.train()

Sizes.  1.54B parameters (28 layers, 1536 hidden, 151,936-token vocabulary): fp32 weights 5.7 GiB, AdamW state
11.5 GiB (alive during evaluation: training continues after it).  Training steps (4 x 1024 tokens,
checkpointing) peak near 30 GiB and run fine for 200 steps.

Why it fails.  At step 200 the Trainer evaluates 2,000 solutions, 8 x 1024 tokens a batch.  Because
compute_metrics is set and neither preprocess_logits_for_metrics nor eval_accumulation_steps is, the
evaluation loop keeps every batch's full logits ON THE GPU (EvalLoopContainer / nested_concat) until the
whole set is done: 8 x 1024 x 151,936 bf16 = 2.3 GiB a batch, 580 GiB for the set -- and each concatenation
briefly holds the old and the new tensor.  Memory climbs 2.3 GiB per evaluation batch and the 13th-14th
batch fails in the concatenation (or the next forward pass).  Training itself fits.

What an expert says first: the metric needs two numbers per step tag, not the whole vocabulary --
preprocess_logits_for_metrics that slices the "+"/"-" logits (or argmax) before they are accumulated; or at
least eval_accumulation_steps so the accumulated predictions go to the CPU every few batches.  Wrong advice:
a smaller eval batch (the total kept is the same), inference_mode/no_grad (prediction_step already runs
under no_grad), gradient checkpointing or mixed precision (training fits; bf16 is on), empty_cache or
expandable_segments (the memory is live, kept tensors), freeing the optimizer state for evaluation (17 GiB
against a 580 GiB accumulation).
"""
import sys

import torch
from torch import nn

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
HIDDEN, INTER, LAYERS, VOCAB, KV_DIM = 1536, 8960, 28, 151936, 256
LAYER_NUMEL = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_DIM + 3 * HIDDEN * INTER + 2 * HIDDEN
SEQ_LEN = 1024


class Output(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Qwen2DecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(LAYER_NUMEL, dtype=torch.float32, device="cuda"))

    def forward(self, hidden, tokens):
        out = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        if torch.is_grad_enabled():
            out._saved = hidden                    # gradient checkpointing: the layer's input only
        return out


class Qwen2ForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.float32, device="cuda"))
        self.layers = [Qwen2DecoderLayer() for _ in range(LAYERS)]
        for i, layer in enumerate(self.layers):
            self._modules["layers.%d" % i] = layer
        self.norm = nn.Parameter(torch.empty(HIDDEN, dtype=torch.float32, device="cuda"))

    def forward(self, batch_size, labels=None):
        tokens = batch_size * SEQ_LEN
        hidden = torch.empty(tokens * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden, tokens)
        logits = torch.empty(tokens * VOCAB, dtype=torch.bfloat16, device="cuda")      # lm_head (tied), autocast
        if torch.is_grad_enabled():
            logits._saved = hidden
        loss = None
        if labels is not None:
            # ForCausalLMLoss: logits.float(), cross-entropy over the labelled step tags
            loss = nn.functional.cross_entropy(torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda"),
                                               labels)
            if torch.is_grad_enabled():
                loss._saved._saved._saved = logits
            else:
                loss._saved = None                 # no graph under no_grad: a scalar and nothing saved
        return Output(loss=loss, logits=logits)


def nested_concat(tensors, new_tensors, padding_index=-100):
    """transformers.trainer_pt_utils.nested_concat -> torch_pad_and_concatenate: torch.cat of the kept
    predictions and the new batch's, into a new tensor (both inputs alive while it is made)."""
    itemsize = torch._ITEMSIZE[tensors.dtype]
    return torch.empty((tensors.nbytes + new_tensors.nbytes) // itemsize, dtype=tensors.dtype, device="cuda")


class EvalLoopContainer(object):
    """transformers.trainer_pt_utils.EvalLoopContainer: accumulates on the device until to_cpu_and_numpy()."""

    def __init__(self, do_nested_concat=True, padding_index=-100):
        self.do_nested_concat = do_nested_concat
        self.padding_index = padding_index
        self.tensors = None

    def add(self, tensors):
        if self.tensors is None:
            self.tensors = tensors
        else:
            self.tensors = nested_concat(self.tensors, tensors, padding_index=self.padding_index)


class Trainer(object):
    """transformers.Trainer, as far as memory goes."""

    def __init__(self, model, train_batches, eval_examples, compute_metrics=None, eval_steps=200,
                 per_device_eval_batch_size=8, eval_accumulation_steps=None, preprocess_logits_for_metrics=None):
        self.model = model
        self.train_batches = train_batches
        self.eval_examples = eval_examples
        self.compute_metrics = compute_metrics
        self.eval_steps = eval_steps
        self.eval_batch = per_device_eval_batch_size
        self.eval_accumulation_steps = eval_accumulation_steps
        self.preprocess_logits_for_metrics = preprocess_logits_for_metrics
        self.optimizer = torch.optim.AdamW(model.parameters(), lr=2e-6)

    def training_step(self, model, batch_size):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(batch_size, labels=batch_size)
        scen_truth.backward(out.loss)             # loss.backward(); the saved activations are freed
        del out

    def train(self):
        self.model.train()
        for step in range(1, self.train_batches + 1):
            self.training_step(self.model, 4)
            self.optimizer.step()
            self.optimizer.zero_grad()
            if step % self.eval_steps == 0:
                self.evaluate()

    def prediction_step(self, model, batch_size):
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                outputs = model(batch_size, labels=batch_size)
            loss = outputs.loss
            logits = outputs.logits
        return loss, logits, None

    def evaluate(self):
        return self.evaluation_loop("Evaluation")

    def evaluation_loop(self, description):
        model = self.model
        model.eval()
        all_losses = EvalLoopContainer()
        all_preds = EvalLoopContainer()
        for step in range(self.eval_examples // self.eval_batch):
            losses, logits, labels = self.prediction_step(model, self.eval_batch)
            all_losses.add(losses)
            if logits is not None:
                if self.preprocess_logits_for_metrics is not None:
                    logits = self.preprocess_logits_for_metrics(logits, labels)
                all_preds.add(logits)
            del losses, logits
            if self.eval_accumulation_steps is not None and (step + 1) % self.eval_accumulation_steps == 0:
                all_preds.tensors = None                        # to_cpu_and_numpy()
        model.train()
        return all_preds


def step_accuracy(eval_pred):
    return {}


scen_truth.note_every_empty(torch)
try:
    model = Qwen2ForCausalLM()
    trainer = Trainer(model, train_batches=3000, eval_examples=2000, compute_metrics=step_accuracy, eval_steps=200,
                      per_device_eval_batch_size=8)
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
