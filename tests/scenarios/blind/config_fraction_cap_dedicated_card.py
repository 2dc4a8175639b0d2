"""train.py -- fine-tuning a 350M-parameter encoder (fp32, AdamW, batch 32 x 512) with the team's
Hydra recipe, written when two jobs shared each card; it caps PyTorch to 40% of the GPU:

    # conf/trainer/default.yaml:   gpu_memory_fraction: 0.4   (left from the shared-card days)
    @hydra.main(config_path="conf", config_name="train")
    def main(cfg):
        torch.cuda.set_per_process_memory_fraction(cfg.trainer.gpu_memory_fraction)
        model = Encoder(cfg.model).cuda()                            # 1.3 GiB
        optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr)
        for batch in loader:
            loss = model(**batch).loss; loss.backward(); optimizer.step(); model.zero_grad(set_to_none=True)

Today the job runs alone on a dedicated 24 GiB card.  The first step fits under the 9.6 GiB the
cap allows; its optimizer.step() adds AdamW's moments (2.6 GiB), and the second step's forward is
refused by PyTorch itself while ~14 GiB of the card are free: nobody else is on the GPU.  The job
needs ~12 GiB.  An expert: the cap from the config is the cause: raise it or drop it
(gpu_memory_fraction: 1.0 / null); no smaller batch, no bigger GPU, no other process to stop.
"""
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)
CFG = {"trainer": {"gpu_memory_fraction": 0.4}, "lr": 3e-5, "batch_size": 32, "layers": 24}


class EncoderLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Parameter(torch.empty(18 * MiB, device="cuda"))
        self.mlp = torch.nn.Parameter(torch.empty(36 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(144 * MiB, device="cuda")      # attention probabilities, saved
        a._saved = h
        m = torch.empty(128 * MiB, device="cuda")      # MLP activations, saved
        m._saved = a
        return m


class Encoder(torch.nn.Module):
    def __init__(self, layers):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(40 * MiB, device="cuda"))
        self.layers = [EncoderLayer() for _ in range(layers)]
        for i, l in enumerate(self.layers):
            setattr(self, "layer%d" % i, l)

    def forward(self, input_ids):
        h = input_ids
        for layer in self.layers:
            h = layer(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main(cfg):
    torch.cuda.set_per_process_memory_fraction(cfg["trainer"]["gpu_memory_fraction"])
    model = Encoder(cfg["layers"]).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
    for step in range(5000):
        input_ids = torch.empty(cfg["batch_size"] * 512 * 8, device="cuda")
        loss = model(input_ids)
        scen_truth.backward(loss)
        optimizer.step()
        model.zero_grad(set_to_none=True)
        del loss, input_ids


try:
    main(CFG)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
