"""finetune_lit.py -- QLoRA fine-tuning of Mistral-7B (4-bit base, LoRA r=16) with PyTorch Lightning 2.x on
a single A10G (24 GB, 22.5 GiB usable) in a SageMaker training job.  Lightning 2.0 dropped the `outputs`
argument of validation_epoch_end, so the user followed the migration guide half way:

    class LitLM(L.LightningModule):
        def __init__(self, ...):
            self.validation_step_outputs = []
        def validation_step(self, batch, batch_idx):
            out = self.model(**batch)                       # logits upcast to fp32 by the model
            self.validation_step_outputs.append({"loss": out.loss, "logits": out.logits})
        def on_validation_epoch_end(self):
            logits = torch.cat([o["logits"] for o in self.validation_step_outputs])
            self.log("val_token_acc", token_accuracy(logits, self.val_labels))
            # (the guide's `self.validation_step_outputs.clear()` was left out)

Every validation pass (16 batches of 4 x 1024 tokens, 32000-vocab fp32 logits: 500 MiB each, 8 GiB
per pass) appends to the same list, and nothing ever clears it.  Epoch 1 trains and validates; so does
epoch 2; epoch 3's first training step runs out of memory in its forward pass (the loss's log-softmax): two validation passes
(16 GiB of logits) are still on the GPU beside the 4-bit model.  The training step itself needs what it
needed in epoch 1.

An expert: the list on the LightningModule holds the memory -- clear it in on_validation_epoch_end
(and keep only what the metric needs: argmax ids or per-token losses, detached, moved to the CPU).  Not
a smaller batch, gradient checkpointing or a bigger GPU: the step is the same as in epoch 1.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

VAL_BATCHES = 16
TRAIN_STEPS_PER_EPOCH = 6
LOGITS_BYTES = 4 * 1024 * 32000 * 4            # fp32 logits of one batch: 500 MiB


class QuantLinear4bit(torch.nn.Module):
    """A bitsandbytes Linear4bit with a LoRA adapter: the packed 4-bit weight is frozen, A and B train."""

    def __init__(self, packed_bytes, lora_bytes):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(packed_bytes, dtype=torch.uint8, device="cuda"),
                                         requires_grad=False)
        self.lora_A = torch.nn.Parameter(torch.empty(lora_bytes, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(lora_bytes, device="cuda"))


class MistralForCausalLM(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.layers = [QuantLinear4bit(112 * MiB, 3 * MiB) for _ in range(32)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer%d" % i, layer)
        self.embed_and_head = torch.nn.Parameter(torch.empty(500 * MiB, dtype=torch.uint8, device="cuda"),
                                                 requires_grad=False)

    def forward(self, input_ids):
        h = input_ids
        for layer in self.layers:
            # gradient checkpointing: one saved hidden state per layer, plus the layer's LoRA inputs
            nxt = torch.empty(36 * MiB, device="cuda")
            if torch.is_grad_enabled():       # saved for backward only when autograd records
                nxt._saved = h
                nxt._params = (layer.lora_A, layer.lora_B)
            h = nxt
        logits = torch.empty(LOGITS_BYTES, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = h
            logits._params = h._params
        return logits


class LitLM(torch.nn.Module):
    """The LightningModule (lightning's base class reduced to nn.Module here)."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.model = MistralForCausalLM()
        self.validation_step_outputs = []

    def training_step(self, batch, batch_idx):
        logits = self.model(batch)
        work = torch.empty(LOGITS_BYTES, device="cuda")       # log_softmax of the logits, kept for backward
        work._saved = logits
        loss = torch.empty(512, device="cuda")
        loss._saved = work
        loss._params = logits._params
        return loss

    def validation_step(self, batch, batch_idx):
        logits = self.model(batch)
        loss = torch.empty(512, device="cuda")
        self.validation_step_outputs.append({"loss": loss, "logits": logits})

    def on_validation_epoch_end(self):
        n = len(self.validation_step_outputs)
        return n                       # the metric; the list is not cleared

    def configure_optimizers(self):
        return torch.optim.AdamW([p for p in self.parameters() if p.requires_grad], lr=2e-4)


def fit(lit, max_epochs=5):
    """What Trainer.fit does here: train an epoch, then validate with autograd off, model.eval()."""
    optimizer = lit.configure_optimizers()
    for epoch in range(max_epochs):
        lit.train()
        for step in range(TRAIN_STEPS_PER_EPOCH):
            batch = torch.empty(4 * 1024 * 8, device="cuda")
            loss = lit.training_step(batch, step)
            scen_truth.backward(loss)
            with torch.no_grad():
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, batch
        lit.eval()
        with torch.no_grad():
            for i in range(VAL_BATCHES):
                batch = torch.empty(4 * 1024 * 8, device="cuda")
                lit.validation_step(batch, i)
                del batch
        lit.on_validation_epoch_end()


lit = LitLM()
try:
    fit(lit)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
