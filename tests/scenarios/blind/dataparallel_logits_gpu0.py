"""train_lm_dp.py -- continued pre-training of a 400M-parameter GPT-style LM (fp32, AdamW) on a
node with four 24 GiB GPUs, with the one-line multi-GPU change:

    model = torch.nn.DataParallel(GPT.from_pretrained(ckpt).cuda())     # devices 0-3
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for input_ids in loader:                                            # batch 32 x 1024
        logits = model(input_ids)                                       # gathered on cuda:0
        loss = F.cross_entropy(logits.view(-1, vocab), input_ids.view(-1))
        loss.backward(); optimizer.step(); optimizer.zero_grad()

DataParallel re-broadcasts the weights every forward, runs 8 sequences per GPU and gathers all 32
sequences' logits (32 x 1024 x 50k fp32 = 6.1 GiB) on GPU 0, where the loss, the gradients and
the AdamW state live too.  The first step just fits; in the second step's forward (the previous
logits are still referenced until the new ones replace them) GPU 0 fails at ~23 GiB while GPUs 1-3
hold ~7.5 GiB each.  An expert: DistributedDataParallel (one process per GPU, each
computing its own loss; torchrun), which also removes the broadcast; the model and batch fit four
GPUs fine.  Not a bigger GPU, not quantization.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
N_GPUS = 4
LOGITS_PER_GPU = 8 * 1024 * 50304 * 4          # 8 sequences x 1024 tokens x vocab, fp32


class GPT(torch.nn.Module):
    def __init__(self, n_layers=24):
        torch.nn.Module.__init__(self)
        self.wte = torch.nn.Parameter(torch.empty(196 * MiB, device="cuda"))
        for i in range(n_layers):
            setattr(self, "h%d" % i, torch.nn.Parameter(torch.empty(56 * MiB, device="cuda")))
        self.n_layers = n_layers

    @classmethod
    def from_pretrained(cls, path):
        return cls()


class DataParallel(torch.nn.Module):
    """torch.nn.DataParallel: scatter the batch, replicate the module on every device (a copy of
    the weights per forward), run the replicas, gather the outputs on device 0."""

    def __init__(self, module, device_ids):
        torch.nn.Module.__init__(self)
        self.module = module
        self.device_ids = device_ids

    def forward(self, input_ids):
        prev = input_ids
        for d in self.device_ids:
            replica = None
            if d != self.device_ids[0]:
                replica = []
                for p in self.module.parameters():               # replicate(): the weights, copied
                    replica.append(torch.empty(p.nbytes, device=d))
            h = torch.empty(8 * 1024 * 8, device=d)              # scatter(): this GPU's 8 sequences
            h._saved, h._replica = prev, replica
            for _ in range(self.module.n_layers):               # activations saved for backward, 4 GiB a GPU
                a = torch.empty(170 * MiB + 682 * 1024, device=d)
                a._saved = h
                h = a
            out = torch.empty(LOGITS_PER_GPU, device=d)          # this replica's logits
            out._saved = h
            prev = out
        gathered = torch.empty(LOGITS_PER_GPU * N_GPUS, device=self.device_ids[0])   # gather(outputs, 0)
        gathered._saved, gathered._params = prev, tuple(self.module.parameters())
        return gathered


def cross_entropy(logits, n_bytes):
    log_probs = torch.empty(n_bytes, device=0)           # log_softmax, saved for backward
    log_probs._saved, log_probs._params = logits, logits._params
    return log_probs


def main():
    model = DataParallel(GPT.from_pretrained("ckpt/gpt-400m"), device_ids=list(range(N_GPUS)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(10000):
        input_ids = torch.empty(32 * 1024 * 8, device=0)
        logits = model(input_ids)
        loss = cross_entropy(logits, LOGITS_PER_GPU * N_GPUS)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark(0)
    raise
sys.exit(0)
