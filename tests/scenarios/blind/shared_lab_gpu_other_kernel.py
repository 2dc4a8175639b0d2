"""finetune_nli.py -- a student fine-tunes a 435M-parameter encoder (fp32, AdamW, batch 16 x 512)
for NLI on the lab's shared 24 GiB workstation GPU.  The job needs ~10 GiB and ran yesterday.
Today another user's Jupyter kernel (in their own container: its pid is not visible here) has
17 GiB of the card; nvidia-smi shows it.  The student's script:

    model = AutoModelForSequenceClassification.from_pretrained("deberta-v3-large", num_labels=3).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for batch in loader:
        loss = model(**batch).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

The first backward fails: 6.5 GiB was all the card had left.  This process holds nothing it could
give back (its cache is empty, nothing leaks), a restart changes nothing.  An expert: the memory
is another user's process -- ask them to free it (or shut their kernel down), or use another
GPU (CUDA_VISIBLE_DEVICES); shrinking this job is second.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class Encoder(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(512 * MiB, device="cuda"))
        for i in range(n_layers):
            setattr(self, "layer%d" % i, torch.nn.Parameter(torch.empty(48 * MiB, device="cuda")))
        self.n_layers = n_layers

    def forward(self, input_ids):
        h = input_ids
        for _ in range(self.n_layers):
            a = torch.empty(160 * MiB, device="cuda")     # attention + FFN activations, batch 16 x 512
            a._saved = h
            h = a
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    model = Encoder().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(5000):
        input_ids = torch.empty(16 * 512 * 8 * 3, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, input_ids


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
