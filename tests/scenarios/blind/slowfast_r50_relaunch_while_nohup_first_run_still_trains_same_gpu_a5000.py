"""SlowFast R50 8x8 fine-tuning for warehouse-safety action recognition, relaunched on a single RTX A5000 (24 GB)
while the first launch -- started with nohup from an SSH session that later dropped -- is still training on the
same card and holds 13.8 GiB. The new run fails in its very first forward pass.

The real program (PySlowFast, tools/run_net.py -> train_net.train, NUM_GPUS 1):

    $ nohup python tools/run_net.py --cfg configs/Kinetics/SLOWFAST_8x8_R50.yaml \
          DATA.PATH_TO_DATA_DIR data/forklift_actions TRAIN.BATCH_SIZE 24 NUM_GPUS 1 > train.log &
    ... the SSH session drops; on reconnect `tail train.log` shows nothing new for a while (the log is buffered),
    the user assumes the job died and launches the same command again, in the same directory.

    model = build_model(cfg)                                   # SlowFast(cfg).cuda()
    optimizer = optim.construct_optimizer(model, cfg)          # SGD, momentum 0.9, cosine schedule
    for cur_iter, (inputs, labels, _, meta) in enumerate(train_loader):
        inputs = [x.cuda(non_blocking=True) for x in inputs]   # [slow 24x3x8x224x224, fast 24x3x32x224x224]
        preds = model(inputs)                                  # OOM in the first forward (res2 lateral fusion)
        loss = loss_fun(preds, labels.cuda())
        ...

nvidia-smi would show two python processes: pid 48213 (the first run, in epoch 3, 13.8 GiB: its context, weights
and its caching allocator's reservation at its own peak) and the new one.

Sizes (fp32, batch 24, slow pathway 8 frames, fast pathway 32 frames at alpha=4, beta=1/8, 224x224):
  * model ~34M parameters = 0.13 GiB; a training step keeps the conv outputs of both pathways, 0.6 GiB per
    slow res2 map down to ~10 MiB in res5: the step peaks at 12.7 GiB allocated, 12.75 GiB reserved. It fits an
    idle 24 GiB card with 11 GiB to spare -- but not twice;
  * card 24 GiB - 13.8 GiB (pid 48213) - 0.5 GiB own context = ~9.7 GiB for the new run; its first forward
    fails at the fast-to-slow lateral fusion after res2 (torch.cat of the slow maps with the fused fast ones)
    with 9.1 GiB allocated, asking for 735 MiB.

What an expert says first: nothing is wrong with this run; another process holds most of the card. Look at
nvidia-smi, find the first launch (pid 48213: `ps -o pid,etime,cmd -p 48213`), and either let it finish or kill
it; then relaunch. Wrong advice: smaller batch / mixed precision / checkpointing (they would squeeze a second
copy of the same training next to the first, both at half speed, and change the recipe), empty_cache or
expandable_segments (this process caches nothing yet), a bigger GPU.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

import scen_truth

scen_truth.note_every_empty(torch)


class CfgNode(dict):
    __getattr__ = dict.__getitem__


cfg = CfgNode(
    TRAIN=CfgNode(BATCH_SIZE=24, ENABLE=True),
    DATA=CfgNode(NUM_FRAMES=32, TRAIN_CROP_SIZE=224, PATH_TO_DATA_DIR="data/forklift_actions"),
    SLOWFAST=CfgNode(ALPHA=4, BETA_INV=8, FUSION_CONV_CHANNEL_RATIO=2),
    MODEL=CfgNode(NUM_CLASSES=12, ARCH="slowfast"),
    SOLVER=CfgNode(BASE_LR=0.1, MOMENTUM=0.9, MAX_EPOCH=40),
    NUM_GPUS=1,
)


class Bottleneck3d(nn.Module):
    def __init__(self, dim_in, dim_inner, dim_out, temp_kernel, stride=1):
        super().__init__()
        self.a = nn.Conv3d(dim_in, dim_inner, (temp_kernel, 1, 1), bias=False)
        self.b = nn.Conv3d(dim_inner, dim_inner, (1, 3, 3), stride=stride, bias=False)
        self.c = nn.Conv3d(dim_inner, dim_out, 1, bias=False)

    def forward(self, x):
        return self.c(self.b(self.a(x)))


class ResStage(nn.Module):
    """One stage of one pathway: num_blocks bottlenecks, the first one strided."""

    def __init__(self, dim_in, dim_inner, dim_out, num_blocks, temp_kernel, stride):
        super().__init__()
        self.num_blocks = num_blocks
        for i in range(num_blocks):
            setattr(self, "res%d" % i, Bottleneck3d(dim_in if i == 0 else dim_out, dim_inner, dim_out,
                                                    temp_kernel, stride if i == 0 else 1))

    def forward(self, x):
        for i in range(self.num_blocks):
            x = getattr(self, "res%d" % i)(x)
        return x


class FuseFastToSlow(nn.Module):
    def __init__(self, dim_in):
        super().__init__()
        self.conv_f2s = nn.Conv3d(dim_in, dim_in * 2, (7, 1, 1), bias=False)

    def forward(self, x_s, x_f):
        fuse = self.conv_f2s(x_f)
        x_s_fuse = torch.empty(x_s.nbytes + fuse.nbytes // 4)  # torch.cat([x_s, fuse], 1): fuse has temporal stride 4
        x_s_fuse._saved = (x_s, fuse)
        return x_s_fuse, x_f


class SlowFast(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        b = cfg.SLOWFAST.BETA_INV
        self.s1_slow = nn.Conv3d(3, 64, (1, 7, 7), bias=False)
        self.s1_fast = nn.Conv3d(3, 64 // b, (5, 7, 7), bias=False)
        self.s1_fuse = FuseFastToSlow(64 // b)
        widths = [(64, 256, 3, 1), (128, 512, 4, 2), (256, 1024, 6, 2), (512, 2048, 3, 2)]
        dim_s, dim_f = 64 + 64 // b * 2, 64 // b
        for si, (inner, out, blocks, stride) in enumerate(widths):
            setattr(self, "s%d_slow" % (si + 2), ResStage(dim_s, inner, out, blocks, 1 if si < 2 else 3, stride))
            setattr(self, "s%d_fast" % (si + 2), ResStage(dim_f, inner // b, out // b, blocks, 3, stride))
            if si < 3:
                setattr(self, "s%d_fuse" % (si + 2), FuseFastToSlow(out // b))
            dim_s, dim_f = out + out // b * 2, out // b
        self.head = nn.Conv1d(2048 + 256, cfg.MODEL.NUM_CLASSES, 1)

    def forward(self, x):
        # stem: conv (1,2,2)-strided, then max_pool3d (1,3,3) stride (1,2,2): 1/16 of the positions
        x_s = F.interpolate(self.s1_slow(x[0]), scale_factor=0.25)
        x_f = F.interpolate(self.s1_fast(x[1]), scale_factor=0.25)
        x_s, x_f = self.s1_fuse(x_s, x_f)
        for s in range(2, 6):
            x_s = getattr(self, "s%d_slow" % s)(x_s)
            x_f = getattr(self, "s%d_fast" % s)(x_f)
            if s < 5:
                x_s, x_f = getattr(self, "s%d_fuse" % s)(x_s, x_f)
        pooled = torch.empty(cfg.TRAIN.BATCH_SIZE * (2048 + 256) * 4)   # ResNetBasicHead: avg pool + cat
        pooled._saved = (x_s, x_f)
        return self.head(pooled)


def construct_loader(cfg):
    bs = cfg.TRAIN.BATCH_SIZE
    t_fast = cfg.DATA.NUM_FRAMES
    t_slow = t_fast // cfg.SLOWFAST.ALPHA
    crop = cfg.DATA.TRAIN_CROP_SIZE
    for _ in range(2200):
        fast = torch.empty(bs * 3 * t_fast * crop * crop, dtype=torch.float32)
        slow = torch.empty(bs * 3 * t_slow * crop * crop, dtype=torch.float32)   # index_select of the fast clip
        labels = torch.empty(bs * 8, dtype=torch.uint8)
        yield [slow, fast], labels, None, {}


def train_epoch(train_loader, model, optimizer, cur_epoch, cfg):
    model.train()
    for cur_iter, (inputs, labels, _, meta) in enumerate(train_loader):
        preds = model(inputs)
        loss = F.cross_entropy(preds, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def train(cfg):
    torch.cuda.set_device(0)
    model = SlowFast(cfg).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.SOLVER.BASE_LR, momentum=cfg.SOLVER.MOMENTUM,
                                weight_decay=1e-4)
    for cur_epoch in range(cfg.SOLVER.MAX_EPOCH):
        train_epoch(construct_loader(cfg), model, optimizer, cur_epoch, cfg)


def main():
    train(cfg)


if __name__ == "__main__":
    try:
        main()
    except torch.cuda.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
