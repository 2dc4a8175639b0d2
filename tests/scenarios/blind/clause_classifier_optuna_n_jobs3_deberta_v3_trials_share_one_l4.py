"""tune_clauses.py -- a legal-tech team tunes a DeBERTa-v3-base contract-clause classifier (41 clause types,
max_length 384, bf16 autocast, AdamW) with Optuna on one cloud L4 (24 GB, 22.5 GiB usable).  A trial alone
was timed at 9 minutes with the GPU at 40% utilization, so to "fill the GPU" the sweep runs three trials at
once, in one process:

    study = optuna.create_study(direction="maximize", sampler=TPESampler(seed=42),
                                pruner=optuna.pruners.MedianPruner(n_warmup_steps=1))
    study.optimize(objective, n_trials=60, n_jobs=3)      # Optuna runs n_jobs trials in threads

    def objective(trial):
        lr = trial.suggest_float("lr", 1e-5, 8e-5, log=True)
        batch_size = trial.suggest_categorical("batch_size", [8, 16, 32])
        model = AutoModelForSequenceClassification.from_pretrained("microsoft/deberta-v3-base",
                                                                   num_labels=41).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
        ...

Each trial holds its own model, gradients and AdamW state (2.75 GiB: 184M parameters in float32, most of
them the 128k-token embedding) and, while it steps, its activations (about 264 MiB per example at 384
tokens: 2.1 / 4.1 / 8.3 GiB at batch 8 / 16 / 32).  Threads interleave kernel by kernel, so the three
trials' passes overlap.  The first three trials (batch 16, 8, 16) run side by side and peak at 17.4 GiB;
when trials 0 and 2 finish, trials 3 and 4 (both drawn at batch 32) start beside trial 1 (batch 8, in its
second epoch): three models plus up to 18.7 GiB of activations at once.  Trial 4's first forward pass fails in its
last encoder layer (a 288 MiB FFN activation) with 21.5 GiB allocated, while trial 3 is in its first
backward and trial 1 is half way through a forward.  Any one of these trials alone peaks at 11.2 GiB.

An expert: the card is shared by three concurrent trials in one process, each with its own copy of the
model and optimizer; nothing leaks and no single trial is too big: run the trials one at a time (n_jobs=1;
the GPU is better used by a larger batch or by several GPUs / processes with one trial each), or cap the
concurrency by what the worst combination needs.  Wrong first advice: a smaller batch or gradient
checkpointing (it changes what the sweep measures, and batch 32 fits alone), empty_cache or
expandable_segments (the memory is live), a bigger GPU, quantization, stopping other processes (there are
none).
"""
import sys
import threading

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
MAX_LEN = 384
TRAIN_EXAMPLES = 960          # the simulation's epoch (the real one is 28,000 clauses)
VAL_BATCHES = 3


# ---- a stand-in for a CUDA kernel launch: PyTorch releases the GIL around its kernels, so Optuna's trial
#      threads interleave; here they take turns in a fixed order, one kernel each, so that a run repeats ----
class _KernelTurns(object):
    def __init__(self):
        self.cv = threading.Condition()
        self.order = []            # the workers' slots, in turn order
        self.pos = 0
        self.mine = threading.local()

    def start(self, n):
        self.order, self.pos = list(range(n)), 0

    def _wait(self):
        while self.order[self.pos] != self.mine.slot:
            self.cv.wait()

    def enter(self, slot):
        self.mine.slot = slot
        with self.cv:
            self._wait()

    def leave(self):
        with self.cv:
            i = self.order.index(self.mine.slot)
            self.order.pop(i)
            if self.order:
                self.pos = i % len(self.order)
            self.cv.notify_all()

    def launch(self):
        if getattr(self.mine, "slot", None) is None:
            return
        with self.cv:
            if len(self.order) == 1:
                return
            self.pos = (self.order.index(self.mine.slot) + 1) % len(self.order)
            self.cv.notify_all()
            self._wait()


_turns = _KernelTurns()
kernel = _turns.launch


# ---- optuna, as far as this script uses it ------------------------------------------------------------
class TrialPruned(Exception):
    pass


class TPESampler(object):
    """The draws TPESampler(seed=42) made in this sweep, in order."""
    DRAWS = [{"lr": 3.1e-5, "batch_size": 16}, {"lr": 1.4e-5, "batch_size": 8}, {"lr": 5.6e-5, "batch_size": 16},
             {"lr": 2.2e-5, "batch_size": 32}, {"lr": 4.4e-5, "batch_size": 32}, {"lr": 2.7e-5, "batch_size": 16}]

    def __init__(self, seed=None):
        self.seed = seed


class MedianPruner(object):
    def __init__(self, n_warmup_steps=0):
        self.n_warmup_steps = n_warmup_steps


class Trial(object):
    def __init__(self, study, number):
        self.study, self.number, self.params = study, number, {}
        self._draw = TPESampler.DRAWS[number % len(TPESampler.DRAWS)]

    def suggest_float(self, name, low, high, log=False):
        self.params[name] = self._draw[name]
        return self.params[name]

    def suggest_categorical(self, name, choices):
        self.params[name] = self._draw[name]
        return self.params[name]

    def report(self, value, step):
        pass

    def should_prune(self):
        return False


class Study(object):
    def __init__(self, direction, sampler, pruner):
        self.direction, self.sampler, self.pruner = direction, sampler, pruner
        self.trials = []
        self._lock = threading.Lock()
        self._next = 0
        self._stop_flag = False
        self._error = None

    def _run_trial(self, func, number):
        trial = Trial(self, number)
        try:
            value = func(trial)
        except torch.OutOfMemoryError as e:
            scen_truth.torch_oom_mark()
            print("[W] Trial %d failed with parameters: %s because of the following error: %r" % (
                number, trial.params, e))
            raise
        except TrialPruned:
            value = None
        print("[I] Trial %d finished with value: %s and parameters: %s." % (number, value, trial.params))
        self.trials.append((number, value, trial.params))

    def _worker(self, func, n_trials, slot):
        _turns.enter(slot)
        try:
            while True:
                with self._lock:
                    if self._stop_flag or self._next >= n_trials:
                        break
                    number, self._next = self._next, self._next + 1
                self._run_trial(func, number)
        except BaseException as e:
            with self._lock:
                self._stop_flag = True
                self._error = self._error or e
            self._done.set()
            return                      # (the stand-in stops the sweep here: the other trials stay parked)
        _turns.leave()
        with self._lock:
            self._running -= 1
            if self._running == 0:
                self._done.set()

    def optimize(self, func, n_trials, n_jobs=1):
        """As Optuna's: with n_jobs > 1, n_jobs threads run trials at once (a ThreadPoolExecutor); a trial
        that raises fails and its exception is raised here.  (Optuna lets the trials still running finish
        first; the stand-in raises at once and leaves them parked.)"""
        self._done = threading.Event()
        self._running = n_jobs
        _turns.start(n_jobs)
        workers = [threading.Thread(target=self._worker, args=(func, n_trials, k), daemon=True) for k in range(n_jobs)]
        for w in workers:
            w.start()
        self._done.wait()
        if self._error is not None:
            raise self._error


def create_study(direction, sampler=None, pruner=None):
    return Study(direction, sampler, pruner)


# ---- transformers' DebertaV2ForSequenceClassification, as far as memory goes --------------------------
class DebertaV2Layer(torch.nn.Module):
    def __init__(self, i):
        torch.nn.Module.__init__(self)
        setattr(self, "layer%d_attention" % i, torch.nn.Parameter(torch.empty(2_360_000 * 4, device="cuda")))
        setattr(self, "layer%d_ffn" % i, torch.nn.Parameter(torch.empty(4_720_000 * 4, device="cuda")))

    def forward(self, hidden, batch_size):
        # disentangled attention (c2c, c2p, p2c scores), softmax, dropout masks, the 3072-wide FFN, in bf16
        kernel()
        attn = torch.empty(batch_size * 13 * MiB, dtype=torch.uint8, device="cuda")
        kernel()
        ffn = torch.empty(batch_size * 9 * MiB, dtype=torch.uint8, device="cuda")
        out = torch.empty(batch_size * MAX_LEN * 768 * 2, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            out._saved = [hidden, attn, ffn]
        return out


class DebertaV2ForSequenceClassification(torch.nn.Module):
    def __init__(self, num_labels):
        torch.nn.Module.__init__(self)
        self.word_embeddings = torch.nn.Parameter(torch.empty(128_100 * 768 * 4, device="cuda"))
        self.encoder = torch.nn.Module()
        for i in range(12):
            setattr(self.encoder, "layer_%d" % i, DebertaV2Layer(i))
        self.classifier = torch.nn.Parameter(torch.empty(768 * num_labels * 4, device="cuda"))

    def forward(self, input_ids, batch_size):
        hidden = torch.empty(batch_size * MAX_LEN * 768 * 2, dtype=torch.uint8, device="cuda")
        for i in range(12):
            hidden = getattr(self.encoder, "layer_%d" % i)(hidden, batch_size)
        logits = torch.empty(batch_size * 41 * 4, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = hidden
        return logits


def from_pretrained(name, num_labels):
    kernel()
    return DebertaV2ForSequenceClassification(num_labels)


def backward(loss):
    """loss.backward(), then what autograd does with the graph afterwards: its saved tensors are freed."""
    kernel()
    loss.backward()
    todo = [loss]
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor):
            nxt = getattr(t, "_saved", None)
            t._saved = None
            if nxt is not None:
                todo.append(nxt)
    kernel()


def batches(n_examples, batch_size):
    for _ in range(n_examples // batch_size):
        yield torch.empty(batch_size * MAX_LEN * 8, dtype=torch.uint8, device="cuda")   # input_ids, int64


# ---- the sweep -----------------------------------------------------------------------------------------
def objective(trial):
    lr = trial.suggest_float("lr", 1e-5, 8e-5, log=True)
    batch_size = trial.suggest_categorical("batch_size", [8, 16, 32])
    model = from_pretrained("microsoft/deberta-v3-base", num_labels=41).cuda()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    for epoch in range(2):
        model.train()
        for input_ids in batches(TRAIN_EXAMPLES, batch_size):
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.bfloat16):
                logits = model(input_ids, batch_size)
                loss = torch.nn.functional.cross_entropy(logits, None)
            backward(loss)
            kernel()
            optimizer.step()
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            for input_ids in batches(VAL_BATCHES * 64, 64):
                model(input_ids, 64)
        macro_f1 = 0.71 + 0.01 * epoch
        trial.report(macro_f1, epoch)
        if trial.should_prune():
            raise TrialPruned()
    return macro_f1


if __name__ == "__main__":
    study = create_study(direction="maximize", sampler=TPESampler(seed=42), pruner=MedianPruner(n_warmup_steps=1))
    try:
        study.optimize(objective, n_trials=60, n_jobs=3)
    finally:
        print("peak allocated %.2f GiB" % (torch.cuda.max_memory_allocated() / GiB))
    sys.exit(0)
