"""sft_qlora.py -- QLoRA SFT of Mistral-7B-v0.3 on 4,096-token support transcripts, one L4 (22.5 GiB) on a
GCP g2 VM; a hand-written loop (from a course notebook) instead of the Trainer.  To plot the train and
validation losses at the same x, the user put the validation pass right after the training forward:

    for step, batch in enumerate(train_loader):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)                                    # labels in the batch
        loss = out.loss
        if step > 0 and step % 250 == 0:
            val_loss = evaluate(model, val_loader)                  # model.eval(), no_grad, batch 8
            wandb.log({"train/loss": loss.item(), "val/loss": val_loss}, step=step)
        loss.backward()
        optimizer.step(); optimizer.zero_grad(set_to_none=True)

250 steps run flat (~15 GiB reserved); at step 250 the first validation batch dies in the loss of
the model's forward: "CUDA out of memory. Tried to allocate 4.00 GiB ... 1.46 GiB is free".

The user: "Validation is under no_grad, and 250 training steps went through -- does eval need a
smaller batch than training?  Should I turn on gradient checkpointing for eval too?"

What fills the memory: the training step's autograd graph.  When evaluate() runs, `out` and `loss`
of step 250 are alive and backward has not run, so everything saved for it is held: the 32
checkpointed layer inputs (4 x 4,096 tokens, 4 GiB), the bf16 logits, their float32 copy and
log-softmax (5 GiB) -- ~9 GiB -- beside the 4-bit base (4.1 GiB) and LoRA state.  The validation
batch (8 x 4,096, the Trainer's default eval batch, which the user copied) needs ~10 GiB for its
own float32 logits and log-softmax.  Alone, after the optimizer step, it fits (15.2 GiB reserved);
on top of the live graph it does not.

An expert: run the validation after loss.backward() and the optimizer step (then the graph is freed
and `loss.item()` is all that is kept) -- move the eval block to the end of the iteration.  No
catalogued remedy says exactly that: new remedy id `evaluate_after_backward` ("Run the evaluation
after backward() and the optimizer step, not while the training step's graph is alive");
`release_references` (the step's outputs keep their graph alive across the eval) is the closest
listed one.  A smaller eval batch would also fit but hides the bug.  Wrong first answers: inference
mode or no_grad (already on), gradient checkpointing (already on; eval keeps no activations),
quantization (the base is 4-bit), a bigger GPU, empty_cache/expandable_segments (the memory is live).
"""
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
GiB = 1 << 30
BF16 = torch.bfloat16

HIDDEN, INTER, LAYERS, VOCAB = 4096, 14336, 32, 32768
LAYER_4BIT_BYTES = 112 * MiB            # nf4 weights + absmax of one decoder layer (218M params)
LORA_BYTES = 5 * MiB                    # r=16 A/B for the 7 linear layers, float32


class Linear4bit(nn.Module):
    def __init__(self, nbytes):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(nbytes, dtype=torch.uint8, device="cuda"), requires_grad=False)


class LoraAdapters(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.lora_A = nn.Parameter(torch.empty(LORA_BYTES // 2, device="cuda"))
        self.lora_B = nn.Parameter(torch.empty(LORA_BYTES // 2, device="cuda"))


class MistralDecoderLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.base = Linear4bit(LAYER_4BIT_BYTES)
        self.lora = LoraAdapters()

    def forward(self, hidden, tokens):
        w = torch.empty(HIDDEN * INTER, dtype=BF16, device="cuda")           # dequantized for one matmul
        mlp = torch.empty(tokens * INTER * 2, dtype=BF16, device="cuda")     # gate/up (recomputed in backward)
        del w, mlp
        self.lora.lora_A, self.lora.lora_B
        out = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        if torch.is_grad_enabled() and self.training:
            out._saved = hidden                       # gradient checkpointing: only the layer's input
        return out


class CausalLMOutput(object):
    def __init__(self, loss, logits):
        self.loss, self.logits = loss, logits


class MistralForCausalLM(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.embed_tokens = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16, device="cuda"), requires_grad=False)
        self.layers = nn.Module()
        for i in range(LAYERS):
            setattr(self.layers, str(i), MistralDecoderLayer())
        self.lm_head = nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=BF16, device="cuda"), requires_grad=False)
        self.gradient_checkpointing = True

    def forward(self, input_ids, attention_mask=None, labels=None):
        tokens = input_ids.nbytes // 8
        hidden = torch.empty(tokens * HIDDEN, dtype=BF16, device="cuda")
        for i in range(LAYERS):
            hidden = getattr(self.layers, str(i))(hidden, tokens)
        logits = torch.empty(tokens * VOCAB, dtype=BF16, device="cuda")
        logits._saved = hidden
        logits = torch._derive(logits, hidden)
        logits32 = torch.empty(tokens * VOCAB, dtype=torch.float32, device="cuda")     # logits.float()
        logits32._saved = logits
        logits32 = torch._derive(logits32, logits)
        del logits
        loss = F.cross_entropy(logits32, labels)
        return CausalLMOutput(loss, logits32)


def load_qlora_model():
    """AutoModelForCausalLM.from_pretrained(..., quantization_config=BitsAndBytesConfig(nf4)) +
    prepare_model_for_kbit_training + get_peft_model(LoraConfig(r=16, target_modules="all-linear"))."""
    return MistralForCausalLM()


def evaluate(model, val_loader):
    model.eval()
    total = 0.0
    with torch.no_grad():
        for batch in val_loader:
            out = model(**batch)
            total += 0.0                          # out.loss.item()
            del out
    model.train()
    return total


def make_batch(batch_size, seq_len=4096):
    n = batch_size * seq_len * 8
    return {"input_ids": torch.empty(n, device="cuda"), "attention_mask": torch.empty(n, device="cuda"),
            "labels": torch.empty(n, device="cuda")}


def val_batches(n=4, eval_batch_size=8):
    for _ in range(n):
        yield make_batch(eval_batch_size)


def main():
    model = load_qlora_model()
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=2e-4)
    batch_size = 4
    for step in range(3000):
        batch = make_batch(batch_size)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = model(**batch)
        loss = out.loss
        if step > 0 and step % 250 == 0:
            val_loss = evaluate(model, val_batches())
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del out, loss, batch


torch.cuda.init()
scen_truth.note_every_empty(torch)
torch._C._cuda_attach_out_of_memory_observer(lambda dev, size, total, free: scen_truth.torch_oom_mark(dev))
try:
    main()
except torch.OutOfMemoryError:
    raise
sys.exit(0)
