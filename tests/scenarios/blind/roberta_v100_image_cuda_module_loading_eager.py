"""train_intent.py -- RoBERTa-large (355M parameters) fine-tuned for intent classification on support
tickets, fp16 autocast, batch 32 x 512 tokens, on a V100 16GB of the lab's older nodes:

    model = AutoModelForSequenceClassification.from_pretrained("roberta-large", num_labels=142).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = torch.cuda.amp.GradScaler()
    for batch in loader:
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(**batch).loss
        scaler.scale(loss).backward(); scaler.step(optimizer); scaler.update(); optimizer.zero_grad()

It ran for months on these cards with about 15.2 GiB in use (nvidia-smi; PyTorch reserving 14.8
GiB once AdamW's moments exist).  After the move to the serving team's new shared image it fails in
the first backward, with PyTorch reporting only 13.7 GiB reserved on a 16 GiB card.  The new image sets
`ENV CUDA_MODULE_LOADING=EAGER` (a workaround the serving team needed for CUDA-graph capture): the
driver loads every kernel of PyTorch, cuDNN and cuBLAS into the context at start-up, and the context
takes about 2.25 GiB instead of the 0.4 GiB of lazy loading.  nvidia-smi shows the process at 16.0
GiB while torch.cuda.memory_reserved() says 13.7 GiB.

An expert: the memory outside PyTorch is the CUDA context, blown up by eager module loading; unset
CUDA_MODULE_LOADING (lazy is the default since CUDA 11.7) or set it to LAZY for the training jobs,
and the job fits as before.  Not the cache, fragmentation or another process; a smaller batch or
checkpointing would also fit it, but they change a job that is not at fault.
"""
import sys

import torch

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

LAYERS = 24
LAYER_PARAMS = 48 * MiB             # fp32 bytes of one encoder layer (12.6M parameters)
EMBED_PARAMS = 196 * MiB            # 50,265 x 1,024 word embeddings + positions
LAYER_ACT = 400 * MiB               # fp16 activations saved per layer: 32 x 512 tokens


class Layer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(LAYER_PARAMS, device="cuda"))

    def forward(self, x):
        h = torch.empty(LAYER_ACT, device="cuda")
        h._saved = x
        return h


class RobertaForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(EMBED_PARAMS, device="cuda"))
        self.classifier = torch.nn.Parameter(torch.empty(4 * MiB + num_labels * 4096, device="cuda"))
        self.layers = []
        for i in range(LAYERS):
            layer = Layer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)

    def forward(self, input_ids, labels):
        h = torch.empty(32 * 512 * 1024 * 2, device="cuda")        # embedding output
        h._saved = input_ids
        for layer in self.layers:
            h = layer(h)
        loss = torch.empty(512, device="cuda")
        loss._saved = h
        return loss


def main():
    model = RobertaForSequenceClassification(num_labels=142).cuda()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    scaler = None            # torch.cuda.amp.GradScaler(): scaling changes no memory here
    batch_size = 32
    for epoch in range(3):
        for step in range(5000):
            input_ids = torch.empty(batch_size * 512 * 8, device="cuda")
            labels = torch.empty(batch_size * 8, device="cuda")
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(input_ids, labels)
            scen_truth.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            del loss, input_ids, labels


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
