"""train_enhancer.py -- a speech-enhancement model (a 60M-parameter conformer, fp32, AdamW, batch 32
x 8 s) trained in PyTorch on a 24 GiB card.  The features are computed once at start-up on the GPU
with CuPy (cuSignal's STFT and a mel filterbank: "50x faster than librosa") and copied to host
memory; then training starts in the same process:

    import cupy as cp, cusignal
    feats = []
    for chunk in chunks(wav_paths, 128):                                 # clips of varying length
        x = cp.asarray(load_padded(chunk))                               # 128 x longest clip
        spec = cp.abs(cusignal.stft(x, nperseg=512, noverlap=384)[2]) ** 2
        feats.append(cp.asnumpy(cp.log(mel_fb @ spec + 1e-6)))          # back to host memory
    del x, spec
    model = Conformer(...).cuda()
    for batch in DataLoader(FeatureDataset(feats), batch_size=32):
        loss = model(batch.cuda()).loss; loss.backward(); optimizer.step(); optimizer.zero_grad()

Every chunk has another length, so CuPy's memory pool gets a new block for nearly every one; the
blocks return to the pool when freed, never to the driver, and the pool ends the preprocessing with
~16.2 GiB reserved and nothing in use.  PyTorch then has ~7.3 GiB; the first forward saves ~8 GiB
of activations (weights, gradients and AdamW state are under 1 GiB) and fails in its last block.  Alone the
training fits with room to spare; nothing else runs on the card.  An expert: give CuPy's cached
blocks back after preprocessing (cp.get_default_memory_pool().free_all_blocks()), or cap the pool
(set_limit / CUPY_GPU_MEMORY_LIMIT), or make CuPy allocate from PyTorch's allocator; not a smaller
batch, not checkpointing, not a bigger card.
"""
import ctypes
import os
import sys
import torch
import scen_truth

MiB = 1 << 20
GiB = 1 << 30
scen_truth.note_every_empty(torch)


class cupy(object):
    """The parts of CuPy used here: arrays from the default memory pool (cupy/cuda/memory.so), which
    keeps freed blocks for reuse by size."""
    _pool = ctypes.CDLL(os.environ["SCEN_CUPY"])
    _pool.cupy_malloc.restype = ctypes.c_void_p
    _pool.cupy_malloc.argtypes = [ctypes.c_size_t]
    _pool.cupy_free.argtypes = [ctypes.c_void_p]

    class ndarray(object):
        def __init__(self, nbytes):
            # whole 2 MiB granules (the chunk padded a little): the simulator charges device memory in
            # 2 MiB granules, and the truth checks count requested bytes as charged ones
            nbytes = (nbytes + 2 * MiB - 1) // (2 * MiB) * (2 * MiB)
            self.nbytes = nbytes
            self.ptr = cupy._pool.cupy_malloc(nbytes)
            if not self.ptr:
                raise MemoryError("cupy.cuda.memory.OutOfMemoryError: out of memory to allocate %d bytes" % nbytes)

        def __del__(self):
            if getattr(self, "ptr", None):
                cupy._pool.cupy_free(self.ptr)
                self.ptr = None


def stft_features(n_clips, longest_s):
    """One chunk: the padded waveforms, the STFT (complex64), its power, the log-mel features."""
    samples = int(longest_s * 16000)
    frames = samples // 128
    x = cupy.ndarray(n_clips * samples * 4)
    spec = cupy.ndarray(n_clips * frames * 257 * 8)                 # complex64
    power = cupy.ndarray(n_clips * frames * 257 * 4)
    mel = cupy.ndarray(n_clips * frames * 80 * 4)
    host = ("numpy", mel.nbytes)                                     # cp.asnumpy
    return host


class ConformerBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.ffn = torch.nn.Parameter(torch.empty(8 * MiB, device="cuda"))
        self.attn = torch.nn.Parameter(torch.empty(4 * MiB, device="cuda"))
        self.conv = torch.nn.Parameter(torch.empty(3 * MiB, device="cuda"))

    def forward(self, h):
        a = torch.empty(500 * MiB, device="cuda")       # batch 32 x 800 frames: attention scores, FFN, conv
        a._saved = h
        return a


class Conformer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.blocks = [ConformerBlock() for _ in range(16)]
        for i, b in enumerate(self.blocks):
            setattr(self, "block%d" % i, b)

    def forward(self, feats):
        h = feats
        for b in self.blocks:
            h = b(h)
        loss = torch.empty(512, device="cuda")
        loss._saved, loss._params = h, tuple(self.parameters())
        return loss


def main():
    torch.cuda.init()
    feats = []
    for i in range(48):                                   # 48 chunks of 128 clips, 4 to 11 s long
        feats.append(stft_features(128, 4.0 + 0.15 * i))
    model = Conformer().cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-4)
    for step in range(10000):
        batch = torch.empty(32 * 800 * 80 * 4, device="cuda")
        loss = model(batch)
        scen_truth.backward(loss)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del loss, batch


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
