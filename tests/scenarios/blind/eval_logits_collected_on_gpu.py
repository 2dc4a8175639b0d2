"""eval_ppl.py -- evaluates a 1.1B-parameter Llama-style checkpoint (bf16, 2.1 GiB) on a held-out set of
2,400 sequences of 512 tokens, batch 8, on one 24 GiB card, to report perplexity and next-token
accuracy.  The script collects the model's outputs for the whole set and computes the metrics at the end:

    all_logits, all_labels = [], []
    with torch.no_grad():
        for batch in val_loader:
            out = model(batch["input_ids"].cuda())
            all_logits.append(out.logits)                  # 8 x 512 x 32,000 bf16 = 250 MiB a batch
            all_labels.append(batch["labels"].cuda())
    logits = torch.cat(all_logits); labels = torch.cat(all_labels)
    ppl = F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten()).exp()
    acc = (logits.argmax(-1) == labels).float().mean()

Autograd is off, so each batch's forward frees its temporaries; only the logits appended to the list
stay, 250 MiB per batch, all on the GPU.  The set has 300 batches (73 GiB of logits): after about 85
batches the lm_head's output of the next batch no longer fits.

An expert: do not keep the full logits -- reduce each batch to what the metrics need while it is on
the GPU (the summed token loss and the count of correct argmax predictions, a few bytes), or move
each batch's outputs to the CPU (HF Trainer: eval_accumulation_steps).  Not inference_mode (already
no_grad), not a smaller batch (the total is what grows), not quantization, not the cache.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

BATCH, SEQ, HIDDEN, VOCAB = 8, 512, 2048, 32000


class LlamaDecoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(44 * MiB, dtype=torch.bfloat16, device="cuda"))

    def forward(self, hidden):
        attn = torch.empty(BATCH * SEQ * HIDDEN * 3, dtype=torch.bfloat16, device="cuda")   # qkv, freed
        out = torch.empty(BATCH * SEQ * HIDDEN, dtype=torch.bfloat16, device="cuda")
        del attn
        return out


class CausalLMOutput(object):
    def __init__(self, logits):
        self.logits = logits


class LlamaForCausalLM(torch.nn.Module):
    def __init__(self, n_layers=22):
        torch.nn.Module.__init__(self)
        self.embed_tokens = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(VOCAB * HIDDEN, dtype=torch.bfloat16, device="cuda"))
        self.layers = [LlamaDecoderLayer() for _ in range(n_layers)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layers_%d" % i, layer)

    def forward(self, input_ids):
        hidden = torch.empty(BATCH * SEQ * HIDDEN, dtype=torch.bfloat16, device="cuda")
        for layer in self.layers:
            hidden = layer(hidden)
        logits = torch.empty(BATCH * SEQ * VOCAB, dtype=torch.bfloat16, device="cuda")   # lm_head
        return CausalLMOutput(logits)


def val_loader(n_batches):
    for _ in range(n_batches):
        yield {"input_ids": torch.empty(BATCH * SEQ * 8, device="cuda"),
               "labels": torch.empty(BATCH * SEQ * 8, device="cuda")}


def evaluate(model, n_batches=300):
    model.eval()
    all_logits, all_labels = [], []
    with torch.no_grad():
        for batch in val_loader(n_batches):
            out = model(batch["input_ids"])
            all_logits.append(out.logits)
            all_labels.append(batch["labels"])
    return all_logits, all_labels


def main():
    model = LlamaForCausalLM()
    evaluate(model)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
