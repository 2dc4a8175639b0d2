"""finetune_lm.py -- fine-tuning a 500M-parameter causal LM (fp32, AdamW) with a token-accuracy
metric computed at the end of the epoch from every step's logits:

    all_logits, all_labels = [], []
    for step, batch in enumerate(loader):
        out = model(**batch)
        out.loss.backward(); optimizer.step(); optimizer.zero_grad()
        all_logits.append(out.logits)              # 256 MiB per step, kept on the GPU
        all_labels.append(batch["labels"])
    accuracy = token_accuracy(torch.cat(all_logits), torch.cat(all_labels))

Weights, grads and AdamW state are 8 GiB, the step's activations 6 GiB (freed after backward and
reused from the cache).  Each step adds 256 MiB of logits that nothing frees: memory climbs step
after step and a forward pass around step 37 fails.  A true leak across iterations.  An expert:
keep a running count instead (or out.logits.argmax(-1).cpu() / .detach().cpu()): release the
references; a smaller batch or checkpointing only postpones it, and a bigger card just fails later
(it must not be told the run "fits" a bigger card).
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(128 * MiB, device="cuda"))

    def forward(self, h):
        out = torch.empty(512 * MiB, device="cuda")      # saved for backward
        out._saved = h
        return out


class CausalLM(torch.nn.Module):
    def __init__(self, n_layers=12):
        torch.nn.Module.__init__(self)
        self.embed = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
        self.lm_head = torch.nn.Parameter(torch.empty(256 * MiB, device="cuda"))
        for i in range(n_layers):
            setattr(self, "layer%d" % i, Layer())
        self.n_layers = n_layers

    def forward(self, input_ids):
        h = input_ids
        for i in range(self.n_layers):
            h = getattr(self, "layer%d" % i)(h)
        logits = torch.empty(256 * MiB, device="cuda")    # 8 x 512 x 32k x fp32 ... per step
        logits._saved = h
        return logits


all_logits = []


def train(model, optimizer, steps):
    import time
    for step in range(steps):
        input_ids = torch.empty(64 * 1024, device="cuda")
        logits = model(input_ids)
        loss = torch.empty(512, device="cuda")
        loss._params, loss._saved = model.parameters(), logits
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        all_logits.append(logits)                          # for the epoch's token accuracy
        time.sleep(0.01)


try:
    model = CausalLM().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5)
    train(model, optimizer, 1000)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
