"""train_arcface.py -- a face-verification startup trains its recognizer on one cloud A100 40GB
(39.6 GiB usable): IResNet-50 backbone under fp16 autocast, 512-d embedding, ArcFace margin head
(s=64, m=0.5), SGD with momentum, batch 512.  The head is the ArcMarginProduct that half the
face-recognition repositories on GitHub copy:

    cosine = F.linear(F.normalize(input), F.normalize(self.weight))          # B x C
    sine = torch.sqrt((1.0 - torch.pow(cosine, 2)).clamp(0, 1))
    phi = cosine * self.cos_m - sine * self.sin_m
    phi = torch.where(cosine > self.th, phi, cosine - self.mm)
    one_hot = torch.zeros(cosine.size(), device="cuda")
    one_hot.scatter_(1, label.view(-1, 1).long(), 1)
    output = (one_hot * phi) + ((1.0 - one_hot) * cosine)
    output *= self.s
    loss = F.cross_entropy(output, label)

On MS1MV3 (93k identities) every B x C tensor was 0.18 GiB and the job ran at 16 GiB.  The team has
now licensed WebFace42M: 2.06M identities.  The class-centre matrix is 3.9 GiB (fp32), F.normalize
copies all of it every step, and every B x C tensor above is 512 x 2.06M x 4 B = 3.9 GiB; the head
materializes a dozen of them, most kept for backward: written this way it needs ~52 GiB at batch
512, more than the card even with no backbone at all.  The backbone's forward fits (16.6 GiB with
the weights, 12.5 of them activations); the first iteration fails inside the margin head, at
`sine * self.sin_m`, its fifth 3.9 GiB batch x classes tensor, with 19.6 GiB already in the
normalized copy of the class centres and four logits-sized tensors.

An expert: the classification layer over 2M identities is the memory, not the backbone: that is what
Partial FC was made for (sample 10-30% of the class centres each step, positives always included:
the logits and their temporaries shrink 3-10x, the accuracy stays), computed with a margin loss that
changes only the target logit in place (insightface's CombinedMarginLoss) instead of a dozen B x C
temporaries; with more GPUs, the class centres are split across them (model-parallel FC).  Wrong
first advice: gradient checkpointing or mixed precision for the backbone (already fp16; its
activations are 12.5 GiB; the head alone needs 52), empty_cache or expandable_segments (the memory is
live), inference_mode (training), stopping other processes.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

GiB = 1 << 30
NUM_CLASSES = 2_059_906          # WebFace42M identities
EMB = 512
BATCH = 512


class IResNet50(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.body = torch.nn.Parameter(torch.empty(43_590_000, dtype=torch.float32, device="cuda"))

    def forward(self, img):
        # 4 stages (3, 4, 14, 3 blocks) at 112x112 -> 7x7, fp16 under autocast: what backward keeps
        x = img
        for stage_bytes, blocks in ((96, 3), (48, 4), (24, 14), (12, 3)):
            for _ in range(blocks):
                y = torch.empty(BATCH * stage_bytes * 1024 * 15, dtype=torch.float16, device="cuda")
                y._saved = x
                x = y
        emb = torch.empty(BATCH * EMB, dtype=torch.float16, device="cuda")
        emb._saved = x
        return emb


class ArcMarginProduct(torch.nn.Module):
    def __init__(self, in_features, out_features, s=64.0, m=0.50):
        torch.nn.Module.__init__(self)
        self.out_features = out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features * in_features, dtype=torch.float32,
                                                     device="cuda"))

    def forward(self, input, label):
        def bxc(dtype=torch.float32):
            return torch.empty(BATCH * self.out_features, dtype=dtype, device="cuda")

        x_n = torch.empty(BATCH * EMB, dtype=torch.float32, device="cuda")               # F.normalize(input)
        w_n = torch.empty(self.out_features * EMB, dtype=torch.float32, device="cuda")   # F.normalize(self.weight)
        cosine = bxc()                                                                  # F.linear(x_n, w_n)
        cosine._saved = w_n
        sq = bxc()                                                                      # torch.pow(cosine, 2)
        one_minus = bxc()                                                               # 1.0 - ...
        del sq
        clamped = bxc()                                                                 # .clamp(0, 1)
        sine = bxc()                                                                    # torch.sqrt(...)
        del clamped
        a = bxc()                                                                       # cosine * self.cos_m
        b = bxc()                                                                       # sine * self.sin_m
        phi = bxc()                                                                     # a - b
        del a, b
        cond = bxc(torch.uint8)                                                         # cosine > self.th
        alt = bxc()                                                                     # cosine - self.mm
        phi2 = bxc()                                                                    # torch.where(...)
        del alt
        one_hot = bxc()                                                                 # torch.zeros(cosine.size())
        t1 = bxc()                                                                      # one_hot * phi
        t2 = bxc()                                                                      # 1.0 - one_hot
        t3 = bxc()                                                                      # ... * cosine
        output = bxc()                                                                  # t1 + t3
        return output


def loader():
    for step in range(2):
        img = torch.empty(BATCH * 3 * 112 * 112, dtype=torch.float16, device="cuda")
        label = torch.empty(BATCH * 8, dtype=torch.uint8, device="cuda")
        yield img, label


try:
    backbone = IResNet50().cuda().train()
    head = ArcMarginProduct(EMB, NUM_CLASSES).cuda().train()
    opt = torch.optim.SGD(backbone.parameters() + head.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    scaler = torch.cuda.amp.GradScaler()
    print("weights on GPU: %.1f GiB" % (torch.cuda.memory_allocated() / GiB))
    for step, (img, label) in enumerate(loader()):
        with torch.autocast("cuda", dtype=torch.float16):
            emb = backbone(img)
        print("step %d backbone forward: %.1f GiB allocated" % (step, torch.cuda.memory_allocated() / GiB))
        logits = head(emb, label)
        loss = torch.nn.functional.cross_entropy(logits, label)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
