"""train_ctc.py -- a student fine-tunes facebook/hubert-large-ll60k (315M parameters) with a CTC head on Common
Voice 17 Swahili on the lab's RTX 4090 (24 GB): fp16 autocast, AdamW, freeze_feature_encoder(), batches of
about 150 s of audio from a duration-bucketed sampler.  The first version resampled the 48 kHz MP3s on the
CPU in the DataLoader workers; it trained, peaking at 20.1 GiB reserved (torch.cuda.max_memory_reserved),
but the 8 workers could not keep the GPU busy.  So the dataset moved its preprocessing to the GPU:

    class CommonVoiceCTC(Dataset):
        def __getitem__(self, i):
            wav, sr = torchaudio.load(self.paths[i])                      # 48 kHz MP3, CPU
            wav = torchaudio.functional.resample(wav.to("cuda"), sr, 16000)
            speech = self.vad(wav)                              # silero-VAD on the GPU: trim silence
            return {"input_values": speech.cpu(), "labels": self.tokenize(self.text[i])}

The next run died in the workers with "RuntimeError: Cannot re-initialize CUDA in forked subprocess. To
use CUDA with multiprocessing, you must use the 'spawn' start method", so the loader became

    loader = DataLoader(ds, batch_sampler=DurationBucketSampler(ds, max_seconds=150), num_workers=8,
                        collate_fn=collator, persistent_workers=True, prefetch_factor=4,
                        multiprocessing_context="spawn")

and it starts.  Each of the 8 spawned workers now has a CUDA context of its own (512 MiB) plus its caching
allocator's blocks from the resampling and the VAD (22 MiB): 4.2 GiB of the card held by 8 other processes
of this job.  Step 1 goes through (AdamW's state does not exist yet: 17.4 GiB reserved); step 2's
backward, the first to need weights + AdamW state + a full batch of activations + gradients (the
20.1 GiB the old run peaked at), fails making the gradients with 22 MiB free.  nvidia-smi lists nine
python processes, all the student's.

An expert: the memory missing is the workers' -- nine CUDA contexts on one card.  Keep CUDA out of the
Dataset: let the workers decode only and return the raw audio, and resample + VAD the whole batch on the
GPU in the main process (one context, one cache, one batched kernel instead of eight processes' small
ones: the speed they wanted), or resample once offline to 16 kHz files; then the default fork start
works again and the 4.2 GiB come back.
Wrong first advice: a smaller batch, gradient checkpointing, 8-bit AdamW or LoRA (they shrink the model's
side to make room for 8 needless CUDA contexts), expandable_segments / empty_cache (nothing is
fragmented; the main process's cache is in use), killing the other processes or restarting (they are this
job's own data workers and come back with the next run), a bigger GPU.
"""
import multiprocessing
import sys

import torch
import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
DEVICE = "cuda"


# ---------------------------------------------------------------------------------------------------------
# the dataset: GPU preprocessing in __getitem__ (runs in the DataLoader's worker processes)
class SileroVAD(object):
    """torch.hub.load("snakers4/silero-vad", "silero_vad") moved to the GPU: a small conv/LSTM net."""

    def __init__(self):
        self.weights = torch.empty(int(1.8 * MiB), device=DEVICE)

    def __call__(self, wav_bytes):
        # STFT frames and the 512-sample windows' features, then the speech probabilities
        feats = torch.empty(wav_bytes * 3, device=DEVICE)
        probs = torch.empty(wav_bytes // 512 + 512, device=DEVICE)
        speech = torch.empty(wav_bytes * 9 // 10, device=DEVICE)
        del feats, probs
        return speech


class CommonVoiceCTC(object):
    def __init__(self, n, seconds):
        self.seconds = seconds          # per clip, from the TSV's durations
        self.n = n
        self.vad = None

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if self.vad is None:
            self.vad = SileroVAD()
        sec = self.seconds[i % len(self.seconds)]
        wav48 = torch.empty(int(sec * 48000) * 4, device=DEVICE)          # wav.to("cuda"), 48 kHz float32
        wav16 = torch.empty(int(sec * 16000) * 4, device=DEVICE)          # torchaudio.functional.resample
        kernel = torch.empty(int(sec * 16000) * 4 * 2, device=DEVICE)     # its polyphase conv's frames
        del wav48, kernel
        speech = self.vad(wav16.nbytes)
        n = speech.nbytes // 4
        del wav16, speech                                                # speech.cpu(): host copy
        return {"input_values": n, "labels": int(sec * 14)}


def collator(items):
    return {"input_values": [it["input_values"] for it in items], "labels": [it["labels"] for it in items]}


# ---------------------------------------------------------------------------------------------------------
# stand-in gap: torch.utils.data.DataLoader with multiprocessing workers (as _MultiProcessingDataLoaderIter:
# an index queue per worker, one data queue, daemonic worker processes kept alive by persistent_workers)
def _worker_loop(dataset, index_queue, data_queue, collate_fn, worker_id):
    while True:
        task = index_queue.get()
        if task is None:
            break
        idx, batch_indices = task
        data_queue.put((idx, collate_fn([dataset[i] for i in batch_indices])))


class DataLoader(object):
    def __init__(self, dataset, batch_sampler, num_workers, collate_fn, persistent_workers=False,
                 prefetch_factor=2, multiprocessing_context=None):
        self.dataset, self.batch_sampler, self.num_workers = dataset, batch_sampler, num_workers
        self.collate_fn, self.prefetch_factor = collate_fn, prefetch_factor
        self.ctx = multiprocessing.get_context(multiprocessing_context)
        self.workers = None

    def _start(self):
        self.data_queue = self.ctx.Queue()
        self.index_queues, self.workers = [], []
        for w in range(self.num_workers):
            q = self.ctx.Queue()
            p = self.ctx.Process(target=_worker_loop,
                                 args=(self.dataset, q, self.data_queue, self.collate_fn, w))
            p.daemon = True
            p.start()
            self.index_queues.append(q)
            self.workers.append(p)

    def __iter__(self):
        if self.workers is None:
            self._start()
        batches = list(self.batch_sampler)
        sent = 0
        # prefetch: prefetch_factor batches per worker in flight
        for _ in range(min(len(batches), self.num_workers * self.prefetch_factor)):
            self.index_queues[sent % self.num_workers].put((sent, batches[sent]))
            sent += 1
        got = {}
        for want in range(len(batches)):
            # (timing: on the real GPU a step takes over a second, and by the second step every worker has
            # made its first batch; the stand-in waits for that explicitly, so that the run is the same
            # every time)
            need = range(want, min(len(batches), self.num_workers)) if want == 1 else (want,)
            while any(k not in got for k in need):
                idx, data = self.data_queue.get()
                got[idx] = data
            if sent < len(batches):
                self.index_queues[sent % self.num_workers].put((sent, batches[sent]))
                sent += 1
            yield got.pop(want)


def DurationBucketSampler(ds, max_seconds):
    """Batches of clips of similar length, about max_seconds of audio each."""
    out, cur, tot = [], [], 0.0
    for i in range(len(ds)):
        cur.append(i)
        tot += ds.seconds[i % len(ds.seconds)]
        if tot >= max_seconds:
            out.append(cur)
            cur, tot = [], 0.0
    return out


# ---------------------------------------------------------------------------------------------------------
# the model: HubertForCTC (hubert-large-ll60k + a 48-character CTC head)
def _param(n, requires_grad=True):
    return torch.nn.Parameter(torch.empty(n, dtype=torch.float32, device=DEVICE), requires_grad=requires_grad)


class HubertEncoderLayer(torch.nn.Module):
    def __init__(self, d=1024, ff=4096):
        torch.nn.Module.__init__(self)
        self.attention = _param(4 * d * d + 4 * d)
        self.layer_norm = _param(2 * d)
        self.feed_forward = _param(2 * d * ff + d + ff)
        self.final_layer_norm = _param(2 * d)

    def forward(self, x, frames):
        # fp16 autocast: what backward needs from one layer (hidden-sized tensors, the 4x-wide MLP
        # input, attention probabilities of 16 heads over each utterance's frames)
        saved = torch.empty(frames * 1024 * 2 * 34, device=DEVICE)
        saved._saved = x
        probs = torch.empty(frames * 1024 * 2 * 8, device=DEVICE)
        probs._saved = saved
        out = torch.empty(frames * 1024 * 2, device=DEVICE)
        out._saved = probs
        return out


class HubertForCTC(torch.nn.Module):
    def __init__(self, vocab=48, layers=24):
        torch.nn.Module.__init__(self)
        self.feature_extractor = _param(4_200_448)
        self.feature_projection = _param(512 * 1024 + 1024 + 1024)
        self.pos_conv_embed = _param(1024 * 64 * 128 + 1024)
        for i in range(layers):
            setattr(self, "layer%d" % i, HubertEncoderLayer())
        self.lm_head = _param(1024 * vocab + vocab)
        self.nlayers = layers

    def freeze_feature_encoder(self):
        self.feature_extractor.requires_grad = False

    def forward(self, input_values, frames):
        x = torch.empty(frames * 1024 * 2, device=DEVICE)
        for i in range(self.nlayers):
            x = getattr(self, "layer%d" % i)(x, frames)
        logits = torch.empty(frames * 48 * 4, device=DEVICE)
        logits._saved = x
        loss = torch.empty(512, device=DEVICE)
        loss._saved = logits
        return loss


def main():
    torch.cuda.init()
    durations = [3.1, 4.7, 5.2, 6.0, 4.4, 7.3, 5.9, 3.8, 9.6, 5.5, 4.9, 6.6]
    ds = CommonVoiceCTC(n=2400, seconds=durations)
    loader = DataLoader(ds, batch_sampler=DurationBucketSampler(ds, max_seconds=150), num_workers=8,
                        collate_fn=collator, persistent_workers=True, prefetch_factor=4,
                        multiprocessing_context="spawn")
    model = HubertForCTC()
    model.freeze_feature_encoder()
    model.train()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-5)
    frames = 150 * 50                      # about 150 s of audio at 50 frames/s, padded per bucket
    for step, batch in enumerate(loader, 1):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(batch["input_values"], frames)
        scen_truth.backward(loss)          # scaler.scale(loss).backward()
        optimizer.step()                   # scaler.step(optimizer); scaler.update()
        optimizer.zero_grad(set_to_none=True)
        del loss
        print("step %d done, reserved %.2f GiB" % (step, torch.cuda.memory_reserved() / 2.0 ** 30))
        sys.stdout.flush()


if __name__ == "__main__":
    try:
        main()
    except torch.OutOfMemoryError:
        scen_truth.torch_oom_mark()
        raise
    sys.exit(0)
