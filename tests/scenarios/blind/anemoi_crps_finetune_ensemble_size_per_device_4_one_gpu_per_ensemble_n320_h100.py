"""Fine-tuning an ensemble (CRPS) weather model with anemoi-training, the way ECMWF trained AIFS-CRPS: a graph
encoder from the N320 grid (542,080 points, ~31 km) to a hidden o96 mesh (40,320 nodes), a 16-layer transformer
processor (hidden 1024, flash attention, noise injected per member), a graph decoder back to N320; about 230M
parameters.  A national met service fine-tunes it on its own reanalysis on 4 nodes x 4 H100 80GB (16 ranks,
srun, bf16-mixed), starting from a run that used two members per GPU.  To get a better spread estimate for the
fair CRPS, the scientist doubled the members in the Hydra config:

    training:
      model_task: anemoi.training.train.tasks.GraphEnsForecaster
      ensemble_size_per_device: 4          # was 2
      training_loss: {_target_: anemoi.training.losses.AlmostFairKernelCRPS, alpha: 0.95}
    hardware:
      num_gpus_per_node: 4
      num_nodes: 4
      num_gpus_per_model: 1
      num_gpus_per_ensemble: 1             # unchanged: every GPU holds its own whole ensemble
    dataloader:
      batch_size: {training: 1, validation: 1}
    model:
      processor: {num_layers: 16, num_chunks: 1}

Lightning's sanity check (two validation steps, no autograd) passes; the first training step dies in the forward,
in the MLP of the 11th of the 16 processor layers: torch.OutOfMemoryError, "Tried to allocate 1.85 GiB", with
78.5 GiB allocated by PyTorch, on every rank.

What happens: the members of one date are one batch dimension of the forward (x[batch, ens, time, grid, var]),
and the fair CRPS needs all of them at once (its spread term compares every member with every other), so the
graph of every member is alive until the loss: about 32 GiB of saved activations per member at N320 (6.5 GiB in
the encoder, 1.1 GiB per processor layer, 8 GiB in the decoder).  Two members fitted (~69 GiB with the weights,
DDP's buckets and the input); four need ~132 GiB.  The weights, gradients and DDP buckets are under 3 GiB.

An expert: keep the effective ensemble and spread it, or recompute instead of storing: set
hardware.num_gpus_per_ensemble: 2 (anemoi's ensemble parallelism: two GPUs share the four members of one date, two
members each, the CRPS gathered across them -- the per-GPU memory of the old run), and/or turn on activation
checkpointing in the processor (model.processor.num_chunks > 1; torch.utils.checkpoint around the mapper
blocks): the saved activations drop to the chunk boundaries at the cost of a second forward.
Wrong first advice: smaller batch with gradient accumulation, or backward per micro-batch (the batch is one date
already; splitting the members across accumulation steps computes a different loss -- the fair CRPS couples all
members of a date, each member's gradient depends on the others), mixed precision (already bf16-mixed), flash
attention (already on; the processor's attention is not what fills the card), inference_mode (training), an
8-bit optimizer or ZeRO/FSDP (model and optimizer state are ~3.5 GiB of the 80), expandable_segments or
empty_cache (a single step's live activations exceed the card; nothing is fragmented), CPU offload of the
weights, a bigger GPU (doubling the members again would need ~260 GiB).
"""
import os
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
MiB = 1 << 20

# ---- stand-in gaps: the pieces of anemoi-models / anemoi-training the step runs, and torch.nn.LayerNorm/Linear
# parameters as plain Parameters (the stand-in torch has no Linear).  Sizes in bytes: N320 grid 542,080 points,
# o96 hidden mesh 40,320 nodes, hidden 1024, 99 variables, bf16 activations under autocast.
GRID = 542_080
HIDDEN_NODES = 40_320
HIDDEN = 1024
N_VARS = 99
MULTISTEP = 2
BF16 = 2

CONFIG = {
    "training": {"model_task": "anemoi.training.train.tasks.GraphEnsForecaster", "ensemble_size_per_device": 4,
                 "training_loss": {"_target_": "anemoi.training.losses.AlmostFairKernelCRPS", "alpha": 0.95},
                 "precision": "bf16-mixed", "multistep_input": MULTISTEP, "rollout": {"start": 1, "max": 1}},
    "hardware": {"num_gpus_per_node": 4, "num_nodes": 4, "num_gpus_per_model": 1, "num_gpus_per_ensemble": 1},
    "dataloader": {"batch_size": {"training": 1, "validation": 1}},
    "model": {"processor": {"num_layers": 16, "num_chunks": 1, "num_heads": 16}, "num_channels": HIDDEN},
}


def _param(nparams):
    return torch.nn.Parameter(torch.empty(nparams, dtype=torch.float32, device="cuda"))


def _act(nbytes, saved):
    t = torch.empty(nbytes // BF16, dtype=torch.bfloat16, device="cuda")
    saved.append(t)
    return t


class GraphTransformerForwardMapper(torch.nn.Module):
    """Encoder: grid (data) nodes -> hidden mesh nodes, one graph-transformer block over the ~1.6M edges."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.emb_nodes_src = _param((N_VARS * MULTISTEP + 4) * HIDDEN)
        self.proc = _param(13_000_000)

    def forward(self, x, n_ens, saved):
        per_member = [1.10 * GiB, 1.10 * GiB, 3.00 * GiB, 0.70 * GiB, 0.60 * GiB]   # src emb, dst emb, edges, attn, mlp
        for nbytes in per_member:
            _act(int(nbytes) * n_ens, saved)
        return _act(HIDDEN_NODES * HIDDEN * BF16 * n_ens, saved)


class TransformerProcessorBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * HIDDEN * HIDDEN + 4 * HIDDEN)
        self.mlp = _param(8 * HIDDEN * HIDDEN + 5 * HIDDEN)
        self.layer_norms = _param(4 * HIDDEN)

    def forward(self, x, n_ens, saved):
        u = HIDDEN_NODES * HIDDEN * BF16 * n_ens          # one [ens, nodes, hidden] bf16 tensor
        _act(u, saved)                                    # layer_norm1 out
        _act(3 * u, saved)                                # qkv
        _act(u, saved)                                    # flash-attention out (+ logsumexp, small)
        _act(u, saved)                                    # projection, residual
        _act(u, saved)                                    # noise conditioning
        _act(u, saved)                                    # layer_norm2 out
        _act(6 * u, saved)                                # mlp up (hidden x 4), GELU's input (6 u: up + gelu in)
        return _act(u, saved)                             # mlp down, residual


class TransformerProcessor(torch.nn.Module):
    def __init__(self, num_layers, num_chunks):
        torch.nn.Module.__init__(self)
        self.num_chunks = num_chunks
        self.num_layers = num_layers
        for i in range(num_layers):
            setattr(self, "proc_%d" % i, TransformerProcessorBlock())

    def forward(self, x, n_ens, saved):
        for i in range(self.num_layers):
            x = getattr(self, "proc_%d" % i)(x, n_ens, saved)
        return x


class GraphTransformerBackwardMapper(torch.nn.Module):
    """Decoder: hidden mesh -> grid nodes."""

    def __init__(self):
        torch.nn.Module.__init__(self)
        self.proc = _param(14_000_000)
        self.node_data_extractor = _param(HIDDEN * N_VARS + N_VARS)

    def forward(self, x, n_ens, saved):
        for nbytes in [3.00 * GiB, 1.10 * GiB, 1.10 * GiB, 1.70 * GiB, 1.10 * GiB]:   # edges, dst, attn, mlp, out
            _act(int(nbytes) * n_ens, saved)
        y = torch.empty(GRID * N_VARS * n_ens, dtype=torch.float32, device="cuda")
        saved.append(y)
        return y


class AnemoiEnsModelEncProcDec(torch.nn.Module):
    def __init__(self, config):
        torch.nn.Module.__init__(self)
        self.encoder = GraphTransformerForwardMapper()
        self.processor = TransformerProcessor(config["model"]["processor"]["num_layers"],
                                              config["model"]["processor"]["num_chunks"])
        self.decoder = GraphTransformerBackwardMapper()
        self.noise_injector = _param(2 * HIDDEN * HIDDEN)

    def forward(self, x, fcstep=0):
        n_ens = x.shape[1]
        saved = []
        h = self.encoder(x, n_ens, saved)
        h = self.processor(h, n_ens, saved)
        y = self.decoder(h, n_ens, saved)
        y._saved = saved
        return y


class GraphEnsForecaster(object):
    """anemoi.training.train.tasks.GraphEnsForecaster (a LightningModule): the members of a date are the ens
    dimension of one forward; the loss is the fair CRPS over them."""

    def __init__(self, config):
        self.config = config
        self.nens_per_device = config["training"]["ensemble_size_per_device"]
        self.nens_per_group = (config["training"]["ensemble_size_per_device"]
                               * config["hardware"]["num_gpus_per_ensemble"] // config["hardware"]["num_gpus_per_model"])
        self.model = AnemoiEnsModelEncProcDec(config)
        # DDPEnsGroupStrategy: DistributedDataParallel over the ranks that hold different dates
        self.ddp_model = torch.nn.parallel.DistributedDataParallel(self.model, device_ids=[0], bucket_cap_mb=25)
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=6.25e-5, betas=(0.9, 0.95))

    def training_step(self, batch, batch_idx):
        batch_size = self.config["dataloader"]["batch_size"]["training"]
        # x[batch, ens, multistep, grid, vars]: the date's inputs, one copy per member (each gets its own noise)
        x = torch.empty(batch_size * self.nens_per_device * MULTISTEP * GRID * N_VARS, dtype=torch.float32,
                        device="cuda")
        x.shape = (batch_size, self.nens_per_device, MULTISTEP, GRID, N_VARS)
        y = batch["target"]
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            y_pred = self.ddp_model(x, fcstep=0)
            loss = self.loss(y_pred, y)
        return loss

    def loss(self, y_pred, y):
        # AlmostFairKernelCRPS: |x_i - y| over members minus the spread term over member pairs
        return torch.empty(1, dtype=torch.float32, device="cuda")


def fit(task, batches):
    task.model.train()
    for batch_idx, batch in enumerate(batches):
        task.optimizer.zero_grad(set_to_none=True)
        loss = task.training_step(batch, batch_idx)
        scen_truth.backward(loss)
        task.optimizer.step()
# ----


def main():
    print("ensemble_size_per_device=%d, num_gpus_per_ensemble=%d: %d members per ensemble group on each GPU"
          % (CONFIG["training"]["ensemble_size_per_device"], CONFIG["hardware"]["num_gpus_per_ensemble"],
             CONFIG["training"]["ensemble_size_per_device"] * CONFIG["hardware"]["num_gpus_per_ensemble"]))
    task = GraphEnsForecaster(CONFIG)
    n = sum(p.nbytes for p in task.model.parameters()) // 4
    print("AnemoiEnsModelEncProcDec: %.0fM parameters" % (n / 1e6))
    # Lightning's sanity check ran the validation loop (no autograd) before this; then the training epoch
    target = torch.empty(GRID * N_VARS, dtype=torch.float32, device="cuda")
    fit(task, [{"target": target} for _ in range(4)])


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
