"""sweep.py -- a thesis student's hyperparameter sweep for a RoBERTa-large stance classifier (355M
parameters, fp32, max_length 256), all trials in one Python process on one A100 40 GB of the
university cluster (torch 2.4).  To be safe against big batch sizes the student wrapped each trial:

    for cfg in grid:                                   # lr x batch_size
        try:
            acc = run_trial(cfg)
        except torch.cuda.OutOfMemoryError:
            print("OOM, halving the batch")
            cfg["batch_size"] //= 2; cfg["grad_accum"] *= 2
            acc = run_trial(cfg)                       # retried inside the except block
        results.append((cfg, acc))

    def run_trial(cfg):
        model = AutoModelForSequenceClassification.from_pretrained("roberta-large", num_labels=3).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
        for batch in loader(cfg["batch_size"]): ...    # forward, backward, step

Batch 16 and 32 trials run (32 peaks at ~34 GiB).  Batch 64 runs out in its first forward, half way
through the 24 layers, as it should.  The retry at batch 32 -- which fitted a minute earlier -- then
fails at once, while .cuda() moves the new model's first weights: the exception being handled keeps
its traceback, whose frames keep the failed trial's model and the ~35 GiB of activations of the
half-done forward pass alive, so nothing was freed for the retry.

An expert: leave the except block before retrying (note the failure in a flag, then retry after it;
del the references, gc.collect(), torch.cuda.empty_cache()) -- or use accelerate's
find_executable_batch_size, which does exactly that.  Not a smaller batch (the retry already halves
it and would fail at any size), not empty_cache inside the handler (the memory is live), not
checkpointing or mixed precision for this failure.
"""
import torch
import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)
LAYERS = 24
PER_SAMPLE_LAYER = 40 * MiB      # activations one sequence of 256 tokens keeps per layer (fp32)


class RobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention_weight = torch.nn.Parameter(torch.empty(16 * MiB, device="cuda"))
        self.ffn_weight = torch.nn.Parameter(torch.empty(32 * MiB, device="cuda"))

    def forward(self, hidden, batch_size):
        attn = torch.empty(batch_size * PER_SAMPLE_LAYER // 2, device="cuda")    # scores, probs, context
        attn._saved = hidden
        ffn = torch.empty(batch_size * PER_SAMPLE_LAYER // 2, device="cuda")     # intermediate, GELU
        ffn._saved = attn
        return ffn


class RobertaForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(torch.empty(196 * MiB, device="cuda"))   # 50265 x 1024
        self.encoder = torch.nn.Module()
        for i in range(LAYERS):
            setattr(self.encoder, "layer%d" % i, RobertaLayer())
        self.classifier = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))

    @classmethod
    def from_pretrained(cls, name, num_labels=2):
        return cls()

    def forward(self, input_ids, batch_size):
        hidden = torch.empty(batch_size * 256 * 1024 * 4, device="cuda")
        hidden._saved = input_ids
        for i in range(LAYERS):
            hidden = getattr(self.encoder, "layer%d" % i)(hidden, batch_size)
        logits = torch.empty(batch_size * 3 * 4, device="cuda")
        logits._saved = hidden
        return logits


def run_trial(cfg):
    model = RobertaForSequenceClassification.from_pretrained("roberta-large", num_labels=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    batch_size = cfg["batch_size"]
    for step in range(2):
        input_ids = torch.empty(batch_size * 256 * 8, device="cuda")
        logits = model(input_ids, batch_size)
        loss = torch.nn.functional.cross_entropy(logits, None)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, logits
    return 0.71


def main():
    grid = [{"lr": lr, "batch_size": bs, "grad_accum": 1} for lr in (1e-5,) for bs in (16, 32, 64)]
    results = []
    for cfg in grid:
        try:
            acc = run_trial(cfg)
        except torch.OutOfMemoryError:
            print("OOM at batch %d, halving the batch" % cfg["batch_size"])
            cfg["batch_size"] //= 2
            cfg["grad_accum"] *= 2
            acc = run_trial(cfg)
        results.append((cfg, acc))
    return results


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
