"""train_slowfast.py -- action recognition for a warehouse-safety product: SlowFast R50 8x8 (34.6M
parameters, BatchNorm converted to SyncBatchNorm) fine-tuned on 10-second 1080p clips from the
customers' cameras, PyTorch Lightning, DDP on a g5.12xlarge (4x NVIDIA A10G, 22.5 GiB usable each),
batch 8 clips per GPU, fp32.  To keep the CPUs free the clips are decoded on the GPU, NVDEC through
torchaudio, as in torchaudio's hardware-decoding tutorial:

    class WarehouseClips(Dataset):
        def __getitem__(self, i):
            r = StreamReader(self.paths[i])
            r.add_video_stream(frames_per_chunk=64, decoder="h264_cuvid", hw_accel="cuda:0")
            video = torch.cat([chunk for (chunk,) in r.stream()])      # (300, 3, 1080, 1920) uint8, on cuda:0
            fast = video[self.sample_idx(len(video), 32)].float() / 255 # 32 frames, then resize + crop 224
            ...
            return slow, fast, label                                    # Lightning moves the batch to its GPU
    trainer = pl.Trainer(accelerator="gpu", devices=4, strategy="ddp", sync_batchnorm=True, max_epochs=30)
    trainer.fit(SlowFastModule(), DataModule(num_workers=0))          # CUDA decoding: no worker processes

A run with devices=1 trained for hours (10.5 GiB on its A10G: the decoder's frames cached, then reused
by the step's 9.8 GiB peak).  With devices=4 Lightning starts ranks 1-3 as copies of the script and gives
each its own GPU (torch.cuda.set_device(local_rank)); but the decoder's hw_accel="cuda:0" names a device
of its own: every rank decodes its clips on GPU 0.  Each of ranks 1-3 puts a CUDA context (0.5 GiB) and
its caching allocator's decoder blocks (the 1.9 GiB stacked video, its 64-frame chunks, the float
frames: 4.2 GiB reserved) on GPU 0, 14.2 GiB in all.  The sanity-check validation passes (3.3 GiB left
free); rank 0's first training step fails in the forward pass of the fast pathway with 7.4 GiB
allocated of the 9.8 it needs, while GPUs 1-3 are each about a third used.

An expert: GPU 0 is full of this job's own other ranks: each decodes on cuda:0.  Give every rank's
decoder its own GPU (hw_accel=f"cuda:{self.trainer.local_rank}", or torch.cuda.current_device() read in
the dataset), as the rest of the rank already does; then each GPU holds one rank.  Wrong: killing the
other processes (they are the job), a smaller batch or checkpointing (each rank's own load fits),
expandable_segments or empty_cache in rank 0 (the memory is other processes'), fewer ranks.
"""
import os
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import scen_truth
from torch.autograd._graph import derive      # the stand-in's record of what an operation's output depends on

scen_truth.note_every_empty(torch)

WORLD_SIZE = 4
BATCH_SIZE = 8
CLIP_FRAMES, H, W = 300, 1080, 1920          # 10 s at 30 fps, 1080p
FAST_T, SLOW_T, CROP = 32, 8, 224
NUM_SANITY_VAL_STEPS = 2


def new(*shape, dtype=torch.float32, device="cuda"):
    """A tensor of that shape (the stand-in tensor is its bytes; its shape is noted)."""
    n = 1
    for s in shape:
        n *= int(s)
    t = torch.empty(n, dtype=dtype, device=device)
    t.shape = tuple(int(s) for s in shape)
    return t


def op(*shape, saved=()):
    """An operation's output on the current device, keeping what autograd saves for backward."""
    t = new(*shape)
    if torch.is_grad_enabled():
        t._saved = tuple(saved)
        derive(t, *saved)
    return t


def backward(loss):
    """loss.backward() as PyTorch runs it: gradients made, then every tensor the graph saved is freed."""
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        s = t.__dict__.pop("_saved", None)
        if isinstance(s, (tuple, list)):
            todo.extend(x for x in s if isinstance(x, torch.Tensor))


# ---------------------------------------------------------------- torch.distributed, as far as this job goes
class FileProcessGroup(object):
    """init_process_group(init_method="file://...") and its collectives, as far as who waits for whom:
    a collective returns once every rank has entered it (no data moves in the stand-in)."""

    def __init__(self, path, rank, world_size):
        self.path, self.rank, self.world_size = path, rank, world_size
        self._n = 0

    def _collective(self):
        self._n += 1
        open(os.path.join(self.path, "c%d.%d" % (self._n, self.rank)), "w").close()
        deadline = time.time() + 120
        while time.time() < deadline:
            if all(os.path.exists(os.path.join(self.path, "c%d.%d" % (self._n, r))) for r in range(self.world_size)):
                return
            time.sleep(0.01)
        sys.exit(3)                                              # NCCL watchdog timeout

    barrier = all_reduce = broadcast = _collective


# ---------------------------------------------------------------- Lightning's subprocess launcher (strategy="ddp")
class SubprocessScriptLauncher(object):
    """Rank 0 is this process; ranks 1..N-1 are the same command line run again with LOCAL_RANK set."""

    def __init__(self, num_processes):
        self.num_processes = num_processes
        self.procs = []

    def launch(self):
        if "LOCAL_RANK" in os.environ:
            return int(os.environ["LOCAL_RANK"])
        os.environ["PL_DIST_FILE"] = tempfile.mkdtemp(prefix="pl-dist-")
        for local_rank in range(1, self.num_processes):
            env = dict(os.environ, LOCAL_RANK=str(local_rank), NODE_RANK="0", WORLD_SIZE=str(self.num_processes))
            self.procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
        return 0

    def kill(self):
        for p in self.procs:
            p.kill()
            p.wait()


# ---------------------------------------------------------------- torchaudio.io.StreamReader with NVDEC
class StreamReader(object):
    def __init__(self, src):
        self.src = src

    def add_video_stream(self, frames_per_chunk, decoder=None, hw_accel=None):
        self.frames_per_chunk, self.device = frames_per_chunk, hw_accel or "cpu"

    def stream(self):
        left = CLIP_FRAMES
        while left > 0:
            n = min(self.frames_per_chunk, left)
            left -= n
            yield (new(n, 3, H, W, dtype=torch.uint8, device=self.device),)


class WarehouseClips(object):
    def __init__(self, n):
        self.paths = ["s3://wh-safety/clips/%06d.mp4" % i for i in range(n)]

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        r = StreamReader(self.paths[i])
        r.add_video_stream(frames_per_chunk=64, decoder="h264_cuvid", hw_accel="cuda:0")
        video = torch.cat([chunk for (chunk,) in r.stream()])
        frames = new(FAST_T, 3, H, W, dtype=torch.uint8, device=video.device)       # video[idx]
        x = new(FAST_T, 3, H, W, device=video.device)                               # .float() / 255
        del video, frames
        x = new(FAST_T, 3, 256, 455, device=x.device)                                # resize, short side 256
        fast = new(3, FAST_T, CROP, CROP, device=x.device)                           # random crop, permute
        slow = new(3, SLOW_T, CROP, CROP, device=x.device)                           # every 4th frame
        return slow, fast, i % 14


def _cat(tensors):
    """torch.cat (the stand-in torch has none): one new tensor on the inputs' device."""
    return torch.empty(sum(t.nbytes for t in tensors), dtype=torch.uint8, device=tensors[0].device)


torch.cat = _cat


def collate(items, device):
    """default_collate (torch.stack on cuda:0), then Lightning's transfer_batch_to_device."""
    slow = new(BATCH_SIZE, 3, SLOW_T, CROP, CROP, device="cuda:0")
    fast = new(BATCH_SIZE, 3, FAST_T, CROP, CROP, device="cuda:0")
    del items
    return new(*slow.shape, device=device), new(*fast.shape, device=device)


def loader(dataset, device, batches):
    for b in range(batches):
        items = [dataset[b * BATCH_SIZE + k] for k in range(BATCH_SIZE)]
        yield collate(items, device)


# ---------------------------------------------------------------- SlowFast R50 8x8 (pytorchvideo), SyncBatchNorm
class ResStage(nn.Module):
    def __init__(self, cin, width, cout, blocks):
        nn.Module.__init__(self)
        self.weight = nn.Parameter(torch.empty(((cin * width + width * width * 9 + width * cout) * blocks) * 4,
                                               device="cuda"))
        self.width, self.cout, self.blocks = width, cout, blocks

    def forward(self, x, t, hw):
        B = x.shape[0]
        for _ in range(self.blocks):
            a = op(B, 4 * self.width, t, hw, hw, saved=(x,))     # conv-SyncBN-ReLU x2
            x = op(B, 3 * self.cout, t, hw, hw, saved=(a, x))    # conv-SyncBN, add, ReLU
        return x


class SlowFast(nn.Module):
    def __init__(self):
        nn.Module.__init__(self)
        self.slow = [ResStage(64, 64, 256, 3), ResStage(256, 128, 512, 4), ResStage(512, 256, 1024, 6),
                     ResStage(1024, 512, 2048, 3)]
        self.fast = [ResStage(8, 8, 32, 3), ResStage(32, 16, 64, 4), ResStage(64, 32, 128, 6),
                     ResStage(128, 64, 256, 3)]
        for i, (s, f) in enumerate(zip(self.slow, self.fast)):
            setattr(self, "slow_res%d" % (i + 2), s)
            setattr(self, "fast_res%d" % (i + 2), f)
        self.head = nn.Parameter(torch.empty((2048 + 256) * 14 * 4, device="cuda"))
        self.fuse = nn.Parameter(torch.empty(15_400_000 * 4, device="cuda"))      # laterals, stems, SyncBN

    def forward(self, slow, fast):
        B = slow.shape[0]
        xs = op(B, 64, SLOW_T, 56, 56, saved=(slow,))            # stem
        xf = op(B, 8, FAST_T, 56, 56, saved=(fast,))
        for s, f, hw in zip(self.slow, self.fast, (56, 28, 14, 7)):
            xf = f(xf, FAST_T, hw)
            xs = s(xs, SLOW_T, hw)
            xs = op(*xs.shape, saved=(xs, xf))                   # lateral time-strided conv fuse
        return op(B, 14, saved=(xs, xf))


def main():
    launcher = SubprocessScriptLauncher(WORLD_SIZE)
    local_rank = launcher.launch()
    try:
        torch.cuda.set_device(local_rank)
        device = "cuda:%d" % local_rank
        pg = FileProcessGroup(os.environ["PL_DIST_FILE"], local_rank, WORLD_SIZE)
        pg.barrier()                                             # init_process_group("nccl")
        model = SlowFast().cuda()                                # SyncBatchNorm.convert_sync_batchnorm(model)
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
        pg.broadcast()                                           # DDP: rank 0's parameters to every rank
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        val = WarehouseClips(2_400)
        train = WarehouseClips(48_000)

        ddp.eval()                                               # sanity check: 2 validation batches
        with torch.no_grad():
            for slow, fast in loader(val, device, NUM_SANITY_VAL_STEPS):
                ddp(slow, fast)
        pg.all_reduce()                                          # self.log("val/acc", sync_dist=True)
        if local_rank == 0:
            print("sanity check done; GPU 0: %.1f GiB free" % (torch.cuda.mem_get_info(0)[0] / 2 ** 30))
            sys.stdout.flush()

        ddp.train()
        for step, (slow, fast) in enumerate(loader(train, device, len(train) // (BATCH_SIZE * WORLD_SIZE))):
            logits = ddp(slow, fast)
            loss = op(1, saved=(logits,))                        # F.cross_entropy
            backward(loss)                                       # loss.backward()
            pg.all_reduce()                                      # DDP's gradient buckets
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
    except torch.OutOfMemoryError:
        if local_rank == 0:
            scen_truth.torch_oom_mark()
        raise
    finally:
        if local_rank == 0:
            launcher.kill()                                      # Lightning's on_exception: the other ranks


main()
sys.exit(0)
