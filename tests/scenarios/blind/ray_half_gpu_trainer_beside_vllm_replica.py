"""train_actor.py -- a Ray Train worker fine-tuning DeBERTa-v3-large (435M parameters, fp32, 1.8 GiB)
for ticket classification, on our team's single-node Ray dev cluster (one A100 80GB):

    trainer = TorchTrainer(train_loop, scaling_config=ScalingConfig(num_workers=1, use_gpu=True,
                                                                     resources_per_worker={"GPU": 0.5}))
    def train_loop(cfg):
        model = AutoModelForSequenceClassification.from_pretrained("microsoft/deberta-v3-large").cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        for batch in loader:                      # batch_size=32, max_length=512
            loss = model(**batch).loss            # <- CUDA out of memory in the first forward

"The same loop peaks at about 13 GB when I run it on a free card.  Tried to allocate 192 MiB with
80 GiB total and 0.1 GiB free, PyTorch holding only 7.4 GiB."  A colleague's Ray Serve app (Llama-3-8B on vLLM, num_gpus=0.5) was deployed on the
same node; Ray's fractional GPUs are only a scheduling label, and vLLM's default
gpu_memory_utilization=0.9 reserved 72 GiB of the card for its weights and KV cache the moment the
replica started.  nvidia-smi lists that replica's worker process with 72 GiB.

An expert: the missing 72 GiB belong to another process, not to this job; stop or shrink the
co-located replica (gpu_memory_utilization around 0.4, or schedule the trainer on a GPU of its own).
Nothing in this training loop needs to change: a smaller batch, checkpointing, 8-bit Adam, LoRA or a
bigger card are all wrong first answers (the card is 80 GB already), and empty_cache frees nothing.
"""
import sys

import torch
from torch import nn
import scen_truth

MiB = 1 << 20
batch_size = 32
max_length = 512


class DebertaLayer(nn.Module):
    def __init__(self):
        super().__init__()
        # attention (q, k, v, o, relative-position projections) and the 1024 -> 4096 -> 1024 MLP: 12.6M fp32
        self.attention = nn.Parameter(torch.empty(4 * 1024 * 1024 + 2 * 1024 * 1024, dtype=torch.float32))
        self.intermediate = nn.Parameter(torch.empty(1024 * 4096, dtype=torch.float32))
        self.output = nn.Parameter(torch.empty(4096 * 1024, dtype=torch.float32))

    def forward(self, hidden, saved):
        # attention scores (batch x 16 heads x 512 x 512, fp32, plus the disentangled c2p/p2c terms) and
        # the MLP's 4096-wide activations, kept for backward
        saved.append(torch.empty(192 * MiB))
        saved.append(torch.empty(64 * MiB))
        return hidden


class DebertaV2ForSequenceClassification(nn.Module):
    def __init__(self):
        super().__init__()
        self.embeddings = nn.Parameter(torch.empty(128100 * 1024, dtype=torch.float32))    # 500 MiB of fp32 word embeddings
        self.layers = [DebertaLayer() for _ in range(24)]
        for i, layer in enumerate(self.layers):
            setattr(self, "layer_%d" % i, layer)
        self.classifier = nn.Parameter(torch.empty(1024 * 1024 + 1024 * 12, dtype=torch.float32))

    @classmethod
    def from_pretrained(cls, name):
        return cls()

    def forward(self, input_ids, labels=None):
        saved = []
        hidden = torch.empty(batch_size * max_length * 1024 * 4)    # the embeddings' output, fp32
        for layer in self.layers:
            hidden = layer(hidden, saved)
        return saved


def train_loop(cfg):
    model = DebertaV2ForSequenceClassification.from_pretrained("microsoft/deberta-v3-large").cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    for step in range(cfg["steps"]):
        out = model(input_ids=None, labels=None)
        optimizer.zero_grad()
    return model


scen_truth.note_every_empty(torch)
try:
    train_loop({"steps": 1})
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
