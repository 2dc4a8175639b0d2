"""evaluate.py -- the test-set evaluation of an extreme multi-label classifier for Amazon-670K (product titles and
descriptions; 670,091 labels, 153,025 test products, 5.45 labels each): bert-base-uncased + a dense linear head
768 x 670,091 (515M parameters; 625M in all, 2.3 GiB in float32), trained on a p4d node, evaluated on a g5.xlarge
(one NVIDIA A10G, 24 GB) because evaluation "only needs the weights".  P@1/3/5 are computed at the end, as in
the training script's validation on a 2,000-product sample:

    model.load_state_dict(torch.load("bert_xmc_amazon670k.pt", map_location="cpu")); model.cuda().eval()
    all_scores, all_labels = [], []
    with torch.no_grad():
        for batch in tqdm(test_loader):                       # batch_size=256, max_len=128
            logits = model(batch["input_ids"].cuda(), batch["attention_mask"].cuda())
            all_scores.append(torch.sigmoid(logits))
            all_labels.append(batch["labels"])                # CSR rows, CPU
    scores = torch.cat(all_scores)                            # [153025, 670091]
    top5 = scores.topk(5, dim=1).indices.cpu()
    print(precision_at_k(top5, all_labels, ks=(1, 3, 5)))

Each batch appends a [256, 670,091] float32 score matrix, 654 MiB, and keeps it: the 2,000-product validation
sample held 5 GiB and went through on the A100; the whole test set would be 382 GiB.  On the A10G the loop
dies at batch 29 of 598 (about 7,400 products) inside the model's forward, the tqdm bar under 5%.  The model and
one batch's forward need under 4 GiB; the list holds 18 GiB.  Autograd is off (no_grad), so no graph is kept:
the memory is the scores themselves, held by a Python list.

An expert: never materialise the full score matrix; reduce each batch on the GPU to what the metrics need and
move that to the CPU -- torch.topk(logits, k=5) (sigmoid is monotonic; k=100 for PSP@k or recall@100 is still
only 256 x 100 indices), i.e. stop keeping the per-batch tensors alive across iterations.  Memory then stays
flat at ~3.5 GiB for all 598 batches.
Wrong first advice: a smaller batch (the list grows by 2.6 MB per product whatever the batch), mixed precision /
fp16 scores (halves the growth: 191 GiB for the test set), inference_mode (already under no_grad; there is no
graph to drop), gradient checkpointing (no backward), quantization / CPU offload of the model (2.3 GiB is not
what grows), expandable_segments / empty_cache (every cached byte is live scores), a bigger GPU or several
(382 GiB fits on none), `.cpu()` on every batch (moves the problem to 382 GiB of host RAM).
"""
import sys

import torch
import torch.nn as nn

import scen_truth

scen_truth.note_every_empty(torch)

# ---- stand-in gaps: torch.int64, torch.sigmoid (C functions in PyTorch), compiled as part of torch's own
# file so that the failing line stays the program's.
if not hasattr(torch, "int64"):
    torch.int64 = torch.long = "int64"
    torch._ITEMSIZE["int64"] = 8
_GAPS = '''
def sigmoid(input):
    """torch.sigmoid: a new tensor of the input's size and dtype."""
    out = torch.empty(input.nbytes // 4, dtype=torch.float32, device=input.device)
    return out
'''
_ns = {"torch": torch}
exec(compile(_GAPS, torch.__file__, "exec"), _ns)
if not hasattr(torch, "sigmoid"):
    torch.sigmoid = _ns["sigmoid"]
# ----

NUM_LABELS = 670091
N_TEST = 153025
BATCH = 256
MAX_LEN = 128
HIDDEN = 768


def _param(n):
    return nn.Parameter(torch.empty(n, dtype=torch.float32, device="cuda"))


class BertLayer(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.attention = _param(4 * HIDDEN * HIDDEN + 4 * HIDDEN + 2 * HIDDEN)
        self.intermediate = _param(HIDDEN * 3072 + 3072)
        self.output = _param(3072 * HIDDEN + HIDDEN + 2 * HIDDEN)

    def forward(self, hidden, mask):
        tok = BATCH * MAX_LEN
        qkv = [torch.empty(tok * HIDDEN, dtype=torch.float32, device="cuda") for _ in range(3)]
        scores = torch.empty(BATCH * 12 * MAX_LEN * MAX_LEN, dtype=torch.float32, device="cuda")
        probs = torch.empty(BATCH * 12 * MAX_LEN * MAX_LEN, dtype=torch.float32, device="cuda")
        del scores
        ctx = torch.empty(tok * HIDDEN, dtype=torch.float32, device="cuda")
        del probs, qkv
        attn_out = torch.empty(tok * HIDDEN, dtype=torch.float32, device="cuda")
        del ctx
        inter = torch.empty(tok * 3072, dtype=torch.float32, device="cuda")
        out = torch.empty(tok * HIDDEN, dtype=torch.float32, device="cuda")
        del inter, attn_out
        return out


class BertXMC(nn.Module):
    """BertModel("bert-base-uncased") + nn.Linear(768, NUM_LABELS) on the [CLS] vector."""

    def __init__(self):
        nn.Module.__init__(self)
        self.embeddings = _param(30522 * HIDDEN + 512 * HIDDEN + 2 * HIDDEN + 2 * HIDDEN)
        self.layers = []
        for i in range(12):
            layer = BertLayer()
            setattr(self, "layer%d" % i, layer)
            self.layers.append(layer)
        self.pooler = _param(HIDDEN * HIDDEN + HIDDEN)
        self.classifier = _param(HIDDEN * NUM_LABELS + NUM_LABELS)

    def forward(self, input_ids, attention_mask):
        h = torch.empty(BATCH * MAX_LEN * HIDDEN, dtype=torch.float32, device="cuda")
        for layer in self.layers:
            h = layer(h, attention_mask)
        cls = torch.empty(BATCH * HIDDEN, dtype=torch.float32, device="cuda")
        del h
        return torch.empty(BATCH * NUM_LABELS, dtype=torch.float32, device="cuda")


class TestLoader(object):
    """DataLoader over the tokenized test split (batch_size=256, shuffle=False); labels stay CSR on the CPU."""

    def __len__(self):
        return (N_TEST + BATCH - 1) // BATCH

    def __iter__(self):
        for i in range(len(self)):
            yield {"input_ids": torch.empty(BATCH * MAX_LEN, dtype=torch.int64, device="cuda"),
                   "attention_mask": torch.empty(BATCH * MAX_LEN, dtype=torch.int64, device="cuda"),
                   "labels": [("row", i)]}


def main():
    model = BertXMC()
    # model.load_state_dict(torch.load("bert_xmc_amazon670k.pt", map_location="cpu")); model.cuda()
    model.eval()
    test_loader = TestLoader()
    print("evaluating %d test products, %d labels, %d batches" % (N_TEST, NUM_LABELS, len(test_loader)))
    all_scores, all_labels = [], []
    with torch.no_grad():
        for i, batch in enumerate(test_loader):
            logits = model(batch["input_ids"], batch["attention_mask"])
            all_scores.append(torch.sigmoid(logits))
            all_labels.append(batch["labels"])
            print("%3d/%d [%2d%%]  allocated %.1f GiB" % (i, len(test_loader), 100 * i // len(test_loader),
                                                        torch.cuda.memory_allocated() / 2.0 ** 30))
    # scores = torch.cat(all_scores); top5 = scores.topk(5, dim=1).indices.cpu()
    print("P@1/3/5 ...")


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
