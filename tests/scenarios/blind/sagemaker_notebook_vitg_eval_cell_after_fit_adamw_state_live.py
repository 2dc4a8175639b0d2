"""A SageMaker Studio notebook (ml.g5.2xlarge: one A10G, 24 GiB; image with PyTorch 2.1.2) in which a
user fine-tunes a ViT-g/14 classifier (1.0B parameters, fp32 weights 3.75 GiB) on 448 px product photos,
then evaluates it -- each step its own cell of the same long-lived kernel:

    # cell 3
    model = ViTg14(num_classes=1000).cuda()
    model.set_grad_checkpointing(True)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05)
    # cell 4 -- one epoch (three steps here), micro-batch 8, bf16 autocast, activation checkpointing
    for images, labels in train_loader:
        optimizer.zero_grad()                       # at the top of the step, as in the tutorial
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
    # cell 5 -- evaluation, a bigger batch since "no_grad needs far less memory"
    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        for images, labels in val_loader:           # batch 64
            preds = model(images).argmax(-1)

Training fits (weights 3.75 + gradients 3.75 + AdamW's two moments 7.5 GiB + a small checkpointed
micro-batch).  The evaluation cell fails in the first block's attention (the fp32 softmax of 64 x 16 heads
x 1025^2 scores, 4 GiB), because the kernel still holds everything the training cell made: the optimizer
(and with it exp_avg / exp_avg_sq, 7.5 GiB) is a global of the kernel, and the last step's gradients (3.75
GiB) are still on the parameters -- zero_grad() runs at the top of a step, so after the loop they stay.
None of it is used by evaluation.  The same evaluation with those 11.25 GiB released fits with 10 GiB to
spare.

An expert: at evaluation the training state is dead weight -- `del optimizer`, `model.zero_grad(
set_to_none=True)`, `gc.collect(); torch.cuda.empty_cache()` before the evaluation cell (or evaluate in a
fresh kernel from the saved checkpoint).  A smaller evaluation batch would also get through, but it only
works around 11 GiB nobody needs.  Not autocast (on), not inference_mode (no_grad is on already), not
checkpointing or an 8-bit optimizer (nothing trains here), not fragmentation.
"""
import sys

import torch
import torch.nn.functional as F

import scen_truth

MiB = 1 << 20
scen_truth.note_every_empty(torch)

# The kernel runs each cell as IPython does: compiled under the kernel's cell file name, executed in the
# notebook's one namespace (the globals here), so everything a cell binds stays alive for the next one.
CELL_FILE = "/tmp/ipykernel_2817/%s.py"

CELL_3 = '''
class Attention(torch.nn.Module):
    def __init__(self, dim=1408, heads=16):
        torch.nn.Module.__init__(self)
        self.heads = heads
        self.qkv = torch.nn.Parameter(torch.empty(dim * 3 * dim * 4, device="cuda"))     # 22.7 MiB
        self.proj = torch.nn.Parameter(torch.empty(dim * dim * 4, device="cuda"))        # 7.6 MiB

    def forward(self, x, batch, tokens):
        qkv = torch.empty(batch * tokens * 1408 * 3 * 2, device="cuda")                  # bf16
        scores = torch.empty(batch * self.heads * tokens * tokens * 4, device="cuda")   # fp32 (autocast)
        probs = torch.empty(batch * self.heads * tokens * tokens * 4, device="cuda")    # softmax, fp32
        del scores
        out = torch.empty(batch * tokens * 1408 * 2, device="cuda")
        out._saved = [qkv, probs] if torch.is_grad_enabled() and not self.training_checkpointed else None
        return out


class Block(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = Attention()
        self.mlp_fc1 = torch.nn.Parameter(torch.empty(1408 * 6144 * 4, device="cuda"))   # 33 MiB
        self.mlp_fc2 = torch.nn.Parameter(torch.empty(6144 * 1408 * 4, device="cuda"))   # 33 MiB

    def forward(self, x, batch, tokens):
        y = self.attn(x, batch, tokens)
        h = torch.empty(batch * tokens * 6144 * 2, device="cuda")                        # MLP hidden, bf16
        out = torch.empty(batch * tokens * 1408 * 2, device="cuda")
        del h
        return out


class ViTg14(torch.nn.Module):
    def __init__(self, num_classes=1000):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(3 * 14 * 14 * 1408 * 4, device="cuda"))
        self.pos_embed = torch.nn.Parameter(torch.empty(1025 * 1408 * 4, device="cuda"))
        self.blocks = []
        for i in range(40):
            b = Block()
            setattr(self, "block%d" % i, b)
            self.blocks.append(b)
        self.head = torch.nn.Parameter(torch.empty(1408 * num_classes * 4, device="cuda"))
        self.grad_checkpointing = False

    def set_grad_checkpointing(self, enable=True):
        self.grad_checkpointing = enable
        for b in self.blocks:
            b.attn.training_checkpointed = enable

    def forward(self, images, batch, tokens=1025):
        x = torch.empty(batch * tokens * 1408 * 2, device="cuda")
        saved = []
        for b in self.blocks:
            if torch.is_grad_enabled() and self.grad_checkpointing:
                saved.append(x)                  # checkpoint: only each block's input is kept
            x = b(x, batch, tokens)
        logits = torch.empty(batch * 1000 * 4, device="cuda")
        logits._saved = saved
        return logits


model = ViTg14(num_classes=1000).cuda()
model.set_grad_checkpointing(True)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05)
'''

CELL_4 = '''
train_batch = 8
for step in range(3):
    images = torch.empty(train_batch * 3 * 448 * 448 * 4, device="cuda")
    labels = torch.empty(train_batch * 8, device="cuda")
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = F.cross_entropy(model(images, train_batch), labels)
    loss.backward()
    optimizer.step()
    del loss
print("epoch done")
'''

CELL_5 = '''
model.eval()
eval_batch = 64
correct = 0
with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
    for i in range(4):
        images = torch.empty(eval_batch * 3 * 448 * 448 * 4, device="cuda")
        preds = model(images, eval_batch)
        correct += 1
print("accuracy", correct)
'''


def run_cell(src, cell_id):
    exec(compile(src, CELL_FILE % cell_id, "exec"), globals())


run_cell(CELL_3, "1203466271")
run_cell(CELL_4, "2409118837")
try:
    run_cell(CELL_5, "3311902254")
except torch.cuda.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
