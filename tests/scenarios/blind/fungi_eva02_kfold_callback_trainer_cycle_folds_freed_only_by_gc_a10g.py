"""train_kfold.py -- a FungiCLEF entry: 5-fold cross-validation of an EVA02-Large/14 (timm, 304M parameters,
336 px, 1604 species) on an AWS g5.xlarge (one A10G, 24 GB, 22.5 GiB usable), bf16 autocast, AdamW, batch 16.
The team's own small training framework (Keras-like) runs the folds one after another in one process:

    class Callback:
        def set_trainer(self, trainer):
            self.trainer = trainer                       # callbacks reach the model through the trainer

    class Trainer:
        def __init__(self, model, optimizer, callbacks=()):
            self.model, self.optimizer = model, optimizer
            self.callbacks = list(callbacks)
            for cb in self.callbacks:
                cb.set_trainer(self)

    for fold in range(5):
        model = timm.create_model("eva02_large_patch14_clip_336", num_classes=1604).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
        trainer = Trainer(model, optimizer, callbacks=[EarlyStopping("val_f1", patience=2,
                                                                     restore_best_weights=True), CSVLogger()])
        trainer.fit(train_loader, val_loader, epochs=EPOCHS)
        oof[val_idx] = trainer.predict(val_loader)
        del model, optimizer, trainer
        torch.cuda.empty_cache()

Fold 0 peaks at about 18 GiB: weights 1.1 GiB, AdamW moments 2.3 GiB, the gradients of the last step (zero_grad
runs at the start of each step), EarlyStopping's best-weights copy 1.1 GiB, and 12 GiB of activations.  The
`del` and `empty_cache()` free nothing: trainer.callbacks -> EarlyStopping -> .trainer -> trainer is a reference
cycle, so when the names go the trainer, and with it the fold's model, optimizer state, gradients and best
weights (5.7 GiB), is garbage that only the cyclic garbage collector can free.  Its objects are old by then
(they survived a whole fold of collections), and a full collection is rare in a process that holds the
296k-row metadata table (a full collection waits until the survivors of younger collections reach a
quarter of the old objects), so nothing collects them before fold 1 needs the memory: fold 1's second training
step fails in its forward pass.  (The message also shows 1.3 GiB reserved but unallocated, in pieces: fold
0's leftovers pin the cached segments they sit in, which is why empty_cache() left 8.3 GiB reserved; but
even packed perfectly, fold 1 needs fold 0's 18.2 GiB plus the 5.7 GiB left over, on a 22 GiB card.)

An expert: the previous fold's training state is still allocated, kept by a reference cycle: call gc.collect()
after the `del` (before empty_cache), or break the cycle (clear trainer.callbacks at the end of fit, or keep a
weakref to the trainer in callbacks).  Then every fold peaks where fold 0 did.  Wrong first advice: empty_cache
(it is already called and cannot free allocated tensors), a smaller batch or gradient checkpointing (fold 0
fits), mixed precision (already bf16), expandable_segments, an 8-bit optimizer, a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH = 16
IMG = 3 * 336 * 336
EPOCHS = 2
STEPS_PER_EPOCH = 40          # the simulation's epoch (the real one is 3,700 steps)
VAL_STEPS = 6


# ---- the model: timm's eva02_large_patch14_clip_336, 24 blocks -----------------------------------------
class EvaBlock(torch.nn.Module):
    def __init__(self, i):
        torch.nn.Module.__init__(self)
        setattr(self, "blocks.%d.attn.qkv.weight" % i, torch.nn.Parameter(torch.empty(3_150_000 * 4, device="cuda")))
        setattr(self, "blocks.%d.attn.proj.weight" % i, torch.nn.Parameter(torch.empty(1_050_000 * 4, device="cuda")))
        setattr(self, "blocks.%d.mlp.fc1.weight" % i, torch.nn.Parameter(torch.empty(5_600_000 * 4, device="cuda")))
        setattr(self, "blocks.%d.mlp.fc2.weight" % i, torch.nn.Parameter(torch.empty(2_800_000 * 4, device="cuda")))

    def forward(self, x, batch):
        # what a block saves for backward per image in bf16 (577 tokens x 1024): norms, qkv, rope, the
        # SDPA output and its logsumexp, the SwiGLU MLP's 2730-wide activations
        attn_out = torch.empty(batch * 12 * MiB, dtype=torch.uint8, device="cuda")
        mlp_hidden = torch.empty(batch * 20 * MiB, dtype=torch.uint8, device="cuda")
        out = torch.empty(batch * 577 * 1024 * 2, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            out._saved = [x, attn_out, mlp_hidden]
        return out


class Eva(torch.nn.Module):
    def __init__(self, num_classes=1604):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(800_000 * 4, device="cuda"))
        self.blocks = torch.nn.Module()
        for i in range(24):
            setattr(self.blocks, "b%d" % i, EvaBlock(i))
        self.head = torch.nn.Parameter(torch.empty(1024 * num_classes * 4, device="cuda"))

    def forward(self, images):
        batch = images.nbytes // (IMG * 2)
        x = torch.empty(batch * 577 * 1024 * 2, dtype=torch.uint8, device="cuda")
        for i in range(24):
            x = getattr(self.blocks, "b%d" % i)(x, batch)
        logits = torch.empty(batch * 1604 * 4, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = x
        return logits


def create_model(name, num_classes):
    return Eva(num_classes)


def backward(loss):
    """loss.backward(), then what autograd does with the graph afterwards: its saved tensors are freed."""
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


# ---- the team's training framework ----------------------------------------------------------------
class Callback(object):
    trainer = None

    def set_trainer(self, trainer):
        self.trainer = trainer

    def on_epoch_end(self, epoch, logs):
        pass

    def on_train_end(self, logs):
        pass


class EarlyStopping(Callback):
    def __init__(self, monitor="val_f1", patience=2, restore_best_weights=True):
        self.monitor, self.patience, self.restore = monitor, patience, restore_best_weights
        self.best, self.wait, self.best_state = None, 0, None

    def on_epoch_end(self, epoch, logs):
        if self.best is None or logs[self.monitor] > self.best:
            self.best, self.wait = logs[self.monitor], 0
            if self.restore:
                self.best_state = {k: v.detach().clone() for k, v in self.trainer.model.state_dict().items()}
        else:
            self.wait += 1
            if self.wait >= self.patience:
                self.trainer.stop_training = True

    def on_train_end(self, logs):
        if self.restore and self.best_state is not None:
            self.trainer.model.load_state_dict(self.best_state)


class CSVLogger(Callback):
    def __init__(self, path="logs/fold.csv"):
        self.path, self.rows = path, []

    def on_epoch_end(self, epoch, logs):
        self.rows.append(dict(logs, epoch=epoch))


class Trainer(object):
    def __init__(self, model, optimizer, callbacks=(), amp_dtype=torch.bfloat16):
        self.model, self.optimizer, self.amp_dtype = model, optimizer, amp_dtype
        self.stop_training = False
        self.history = []
        self.callbacks = list(callbacks)
        for cb in self.callbacks:
            cb.set_trainer(self)

    def fit(self, train_loader, val_loader, epochs):
        for epoch in range(epochs):
            self.model.train()
            for step, batch in enumerate(train_loader()):
                self.optimizer.zero_grad()
                with torch.autocast("cuda", dtype=self.amp_dtype):
                    logits = self.model(batch["image"])
                    loss = torch.nn.functional.cross_entropy(logits, batch["label"])
                backward(loss)
                self.optimizer.step()
                self.history.append({"epoch": epoch, "step": step, "lr": 2e-5})
            logs = {"val_f1": self.evaluate(val_loader), "epoch": epoch}
            for cb in self.callbacks:
                cb.on_epoch_end(epoch, logs)
            if self.stop_training:
                break
        for cb in self.callbacks:
            cb.on_train_end({})

    def evaluate(self, val_loader):
        self.model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=self.amp_dtype):
            for batch in val_loader():
                logits = self.model(batch["image"])
        return 0.61

    def predict(self, val_loader):
        self.evaluate(val_loader)
        return [0.0] * 100


# ---- data: the FungiCLEF 2022 metadata table (DF20), folds stratified by species ---------------------
SUBSTRATES = ["soil", "wood", "leaf litter", "bark", "moss", "dead wood", "stems"]
records = [{"image_path": "DF20/2-%09d.JPG" % i, "class_id": i % 1604, "fold": i % 5,
            "observation": {"substrate": SUBSTRATES[i % 7], "month": 1 + i % 12, "country": "DK"},
            "tags": ["DF20", "fungi"]} for i in range(295_938)]


def make_loader(steps, batch_size):
    def loader():
        for _ in range(steps):
            yield {"image": torch.empty(batch_size * IMG, dtype=torch.bfloat16, device="cuda"),
                   "label": torch.empty(batch_size * 8, dtype=torch.uint8, device="cuda"),
                   "meta": [records[j] for j in range(batch_size)]}
    return loader


try:
    oof = {}
    for fold in range(5):
        train_loader = make_loader(STEPS_PER_EPOCH, BATCH)
        val_loader = make_loader(VAL_STEPS, 64)
        model = create_model("eva02_large_patch14_clip_336", num_classes=1604).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), lr=2e-5, weight_decay=0.05)
        trainer = Trainer(model, optimizer, callbacks=[EarlyStopping("val_f1", patience=2,
                                                                     restore_best_weights=True), CSVLogger()])
        trainer.fit(train_loader, val_loader, epochs=EPOCHS)
        oof[fold] = trainer.predict(val_loader)
        print("fold", fold, "done: peak %.2f GiB" % (torch.cuda.max_memory_allocated() / GiB))
        del model, optimizer, trainer
        torch.cuda.empty_cache()
        print("after del + empty_cache: allocated %.2f GiB, reserved %.2f GiB" % (
            torch.cuda.memory_allocated() / GiB, torch.cuda.memory_reserved() / GiB))
        torch.cuda.reset_peak_memory_stats()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
