"""finetune_whisper_hi.py -- a developer follows Hugging Face's "Fine-Tune Whisper For Multilingual ASR with
Transformers" blog: openai/whisper-small (242M parameters) on Common Voice 11 Hindi (6,540 training and
2,894 test utterances), Seq2SeqTrainer, on their own RTX 3090 (24 GB), with the blog's arguments --
per_device_train_batch_size=16, gradient_checkpointing=True, fp16=True, per_device_eval_batch_size=8,
max_steps=4000 -- except two.  They want a WER every 250 steps instead of every 1000, and evaluation with
generate() took 25 minutes, so they turned it off and compute a teacher-forced WER from the logits:

    training_args = Seq2SeqTrainingArguments(..., evaluation_strategy="steps", eval_steps=250,
                                             predict_with_generate=False, ...)
    def compute_metrics(pred):
        pred_ids = np.argmax(pred.predictions, axis=-1)
        ...
    trainer = Seq2SeqTrainer(args=training_args, model=model, train_dataset=..., eval_dataset=cv["test"],
                             data_collator=data_collator, compute_metrics=compute_metrics, tokenizer=...)
    trainer.train()

Training runs at about 6 GiB (weights 0.9 GiB, AdamW's moments 1.8 GiB, checkpointed activations).  At step
250 the Trainer evaluates.  Without predict_with_generate its prediction_step returns the model's logits --
batch x label length x 51,865 vocabulary entries, float16 under autocast, up to 114 MB per eval batch of 8
-- and, with eval_accumulation_steps unset, evaluation_loop keeps all of them on the GPU, padding and
concatenating each batch onto the ones before (nested_concat -> torch_pad_and_concatenate: a new tensor of
the whole so far, the old one freed after).  The 2,894 test utterances would need 41 GB of logits (about
14.3 MB each at the 138 tokens of the longest label).  At eval step 84 of 362 the concatenation of 672
utterances (8.96 GiB) cannot be made beside the 8.85 GiB it replaces: 8.92 GiB are free, and 2.4 GiB more
sit cached in the freed block of an earlier accumulation, now split by the current batch's logits.  Training
itself never came near the limit.

An expert: the evaluation is keeping the full vocabulary-wide logits of every test utterance on the GPU only
to take an argmax later.  Reduce them before they are kept: preprocess_logits_for_metrics=lambda logits,
labels: logits.argmax(-1) (token ids: 51,865 times smaller), or go back to predict_with_generate=True; at
least set eval_accumulation_steps so the Trainer moves what it gathered to the CPU every few steps (there it
still costs 41 GB of RAM, so the argmax is the real fix).
Wrong first advice: a smaller eval batch (the total kept is the same), gradient checkpointing or mixed
precision (already on; evaluation does no backward and the logits are already float16), inference_mode
(prediction_step already runs under no_grad), expandable_segments / empty_cache (one live accumulation is
half the card and must double: they would buy two or three eval steps), 8-bit AdamW or freeing the optimizer
(1.8 GiB of 41 GB, and training continues after this eval), a bigger GPU (the test set is what it is; a
larger one fails again).
"""
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

DEVICE = "cuda"
VOCAB = 51865
D, FF = 768, 3072


def _param(n, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=DEVICE), requires_grad=requires_grad)


class WhisperLayer(torch.nn.Module):
    def __init__(self, cross=False):
        torch.nn.Module.__init__(self)
        self.self_attn = _param(4 * D * D + 3 * D)
        if cross:
            self.encoder_attn = _param(4 * D * D + 3 * D)
        self.fc = _param(2 * D * FF + D + FF)
        self.norms = _param((6 if cross else 4) * D)

    def forward(self, x, tokens):
        if torch.is_grad_enabled():
            # gradient checkpointing: only the layer's input is kept; the layer is recomputed in backward
            out = torch.empty(tokens * D * 2, device=DEVICE)
            out._saved = x
            return out
        mlp = torch.empty(tokens * FF * 2, device=DEVICE)     # float16 under autocast, transient
        del mlp
        return torch.empty(tokens * D * 2, device=DEVICE)


class WhisperForConditionalGeneration(torch.nn.Module):
    """openai/whisper-small: 12 encoder and 12 decoder layers of 768, the output projection tied to the
    token embedding."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.conv = _param(80 * D * 3 + D * D * 3 + 2 * D)
        self.embed_positions = _param(1500 * D, requires_grad=False)
        for i in range(12):
            setattr(self, "enc%d" % i, WhisperLayer())
        self.embed_tokens = _param(VOCAB * D)
        self.dec_positions = _param(448 * D)
        for i in range(12):
            setattr(self, "dec%d" % i, WhisperLayer(cross=True))
        self.layer_norms = _param(4 * D)

    def forward(self, input_features, labels, batch, label_len):
        x = torch.empty(batch * 1500 * D * 2, device=DEVICE)
        for i in range(12):
            x = getattr(self, "enc%d" % i)(x, batch * 1500)
        y = torch.empty(batch * label_len * D * 2, device=DEVICE)
        y._saved = x
        for i in range(12):
            y = getattr(self, "dec%d" % i)(y, batch * label_len)
        logits = torch.empty(batch * label_len * VOCAB, dtype=torch.float16, device=DEVICE)
        logits._saved = y
        # loss: CrossEntropyLoss on logits.float() (view(-1, vocab))
        upcast = torch.empty(batch * label_len * VOCAB, dtype=torch.float32, device=DEVICE)
        loss = torch.nn.functional.cross_entropy(upcast, labels)
        if not torch.is_grad_enabled():
            del upcast
        else:
            upcast._saved = logits
        return {"loss": loss, "logits": logits}


# ---- stand-in gap: transformers' Trainer pieces (trainer_pt_utils.py, trainer.py), as they run here ----
def torch_pad_and_concatenate(tensor1, tensor2, padding_index=-100):
    """Concatenates tensor1 and tensor2 on the first axis, padding the second if needed."""
    if getattr(tensor1, "_shape", None) is None:           # 1-d (the losses): torch.cat
        return torch.empty(tensor1.nbytes + tensor2.nbytes, device=DEVICE)
    n1, l1 = tensor1._shape
    n2, l2 = tensor2._shape
    if l1 == l2:
        result = torch.empty((n1 + n2) * l1 * VOCAB, dtype=torch.float16, device=DEVICE)      # torch.cat
    else:
        # result = tensor1.new_full(new_shape, padding_index); result[:n1, :l1] = tensor1; ...
        result = torch.empty((n1 + n2) * max(l1, l2) * VOCAB, dtype=torch.float16, device=DEVICE)
    result._shape = (n1 + n2, max(l1, l2))
    return result


def nested_concat(tensors, new_tensors, padding_index=-100):
    return torch_pad_and_concatenate(tensors, new_tensors, padding_index=padding_index)


class EvalLoopContainer(object):
    """Container to store intermediate results of evaluation loop; do_nested_concat keeps one tensor,
    concatenated on the device until to_cpu_and_numpy() (every eval_accumulation_steps, or at the end)."""

    def __init__(self, do_nested_concat=True, padding_index=-100):
        self.do_nested_concat = do_nested_concat
        self.padding_index = padding_index
        self.tensors = None

    def add(self, tensors):
        if self.tensors is None:
            self.tensors = tensors
        elif self.do_nested_concat:
            self.tensors = nested_concat(self.tensors, tensors, padding_index=self.padding_index)


class Seq2SeqTrainingArguments(object):
    def __init__(self, **kw):
        self.__dict__.update(kw)


class Seq2SeqTrainer(object):
    def __init__(self, args, model, optimizer):
        self.args, self.model, self.optimizer = args, model, optimizer

    def training_step(self, batch, label_len):
        with torch.autocast("cuda", dtype=torch.float16):
            out = self.model(batch["input_features"], batch["labels"], self.args.per_device_train_batch_size,
                             label_len)
        scen_truth.backward(out["loss"])          # self.accelerator.backward(loss)
        del out

    def prediction_step(self, batch, label_len):
        with torch.no_grad():
            with torch.autocast("cuda", dtype=torch.float16):
                out = self.model(batch["input_features"], batch["labels"], self.args.per_device_eval_batch_size,
                                 label_len)
        logits = out["logits"]
        logits._shape = (self.args.per_device_eval_batch_size, label_len)
        return out["loss"], logits, batch["labels"]

    def evaluation_loop(self, eval_lengths):
        all_losses = EvalLoopContainer()
        all_preds = EvalLoopContainer(padding_index=-100)
        labels_host = []
        self.model.eval()
        for step, label_len in enumerate(eval_lengths):
            batch = _eval_batch(self.args.per_device_eval_batch_size, label_len)
            loss, logits, labels = self.prediction_step(batch, label_len)
            # logits = self.accelerator.gather_for_metrics(logits); preprocess_logits_for_metrics is None
            all_losses.add(loss)
            all_preds.add(logits)
            labels_host.append(labels)
            acc = self.args.eval_accumulation_steps
            if acc is not None and (step + 1) % acc == 0:
                pass  # all_preds.to_cpu_and_numpy(), all_labels.to_cpu_and_numpy() ...: off the GPU
            del batch, logits, loss
            if step % 10 == 0:
                print("eval step %d/%d: predictions kept %.2f GiB, allocated %.2f GiB" % (
                    step, len(eval_lengths), all_preds.tensors.nbytes / 2.0 ** 30,
                    torch.cuda.memory_allocated() / 2.0 ** 30))
                sys.stdout.flush()
        self.model.train()


def _train_batch(bs, label_len):
    return {"input_features": torch.empty(bs * 80 * 3000, dtype=torch.float32, device=DEVICE),
            "labels": torch.empty(bs * label_len, dtype=torch.uint8, device=DEVICE)}


def _eval_batch(bs, label_len):
    return {"input_features": torch.empty(bs * 80 * 3000, dtype=torch.float32, device=DEVICE),
            "labels": torch.empty(bs * label_len * 8, dtype=torch.uint8, device=DEVICE)}


def main():
    args = Seq2SeqTrainingArguments(per_device_train_batch_size=16, gradient_accumulation_steps=1,
                                    learning_rate=1e-5, warmup_steps=500, max_steps=4000,
                                    gradient_checkpointing=True, fp16=True, evaluation_strategy="steps",
                                    per_device_eval_batch_size=8, predict_with_generate=False,
                                    generation_max_length=225, save_steps=1000, eval_steps=250,
                                    eval_accumulation_steps=None)
    model = WhisperForConditionalGeneration()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.learning_rate)
    trainer = Seq2SeqTrainer(args, model, optimizer)
    train_lengths = [58, 71, 96, 64, 83, 121, 77, 69, 90, 102, 66, 88]
    # label lengths (tokens) of the 362 eval batches of 8: the longest label of the test split is 138 tokens
    eval_lengths = [[84, 97, 72, 138, 91, 66, 103, 88, 79, 115, 95, 70, 82][i % 13] for i in range(362)]
    for step in range(1, args.max_steps + 1):
        batch = _train_batch(args.per_device_train_batch_size, train_lengths[step % len(train_lengths)])
        trainer.training_step(batch, train_lengths[step % len(train_lengths)])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del batch
        if step % 50 == 0:
            print("step %d: reserved %.2f GiB" % (step, torch.cuda.memory_reserved() / 2.0 ** 30))
            sys.stdout.flush()
        if step % args.eval_steps == 0:
            trainer.evaluation_loop(eval_lengths)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
