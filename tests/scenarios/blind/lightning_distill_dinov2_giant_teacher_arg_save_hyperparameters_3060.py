"""distill_sku.py -- a retail-analytics startup's on-device shelf recogniser: knowledge distillation of
a DINOv2 ViT-g/14 classifier (1.1B parameters, fine-tuned earlier on a rented A100 for 1,200 SKUs; fp32,
4.2 GiB) into an EfficientNet-B0 student (5.3M parameters) that runs on the merchandisers' phones.  The
distillation runs on the office workstation's RTX 3060 (12 GB, 11.5 GiB usable), PyTorch Lightning 2.3,
16-mixed precision, batch 64 at 224 px.  The script checks the teacher first, then hands both models to
the LightningModule, which records its hyperparameters the way the Lightning docs show:

    teacher = load_teacher("ckpt/dinov2_g14_sku1200.pt").cuda().eval()
    print("teacher val top-1:", evaluate(teacher, val_loader))          # 94.1 -- sanity check
    student = timm.create_model("efficientnet_b0", num_classes=1200)
    model = LitDistill(student, teacher, temperature=4.0, alpha=0.7, lr=3e-3)
    L.Trainer(accelerator="gpu", devices=1, precision="16-mixed", max_epochs=30).fit(model, train_dl, val_dl)

    class LitDistill(L.LightningModule):
        def __init__(self, student, teacher, temperature=4.0, alpha=0.7, lr=3e-3):
            super().__init__()
            self.save_hyperparameters()          # so T, alpha and lr end up in the logger and the checkpoint
            self.student, self.teacher = student, teacher
            self.teacher.requires_grad_(False)
        def training_step(self, batch, batch_idx):
            x, y = batch
            with torch.no_grad():
                t_logits = self.teacher(x)
            s_logits = self.student(x)
            ...

save_hyperparameters() with no arguments records EVERY __init__ argument -- the two models included --
and Lightning keeps a deep copy of them as the initial hyperparameters (`_hparams_initial =
copy.deepcopy(self._hparams)`; it also prints "Attribute 'teacher' is an instance of `nn.Module` and is
already saved during checkpointing. It is recommended to ignore them...", one warning among the dozen at
start-up).  The teacher is already on the GPU when it is passed in, so the deep copy is a second 4.2 GiB
teacher on the GPU, never used.  Teacher 4.2 + its copy 4.2 + the context leave ~2.9 GiB: the sanity
validation passes (student only, no_grad), the teacher's forward of the first training batch passes
(no_grad, transient), and the student's forward of that batch -- 64 images at 224 px keep ~3 GiB for
backward -- fails in its last MBConv blocks.

An expert: the second teacher is the memory: exclude the models from the hyperparameters,
self.save_hyperparameters(ignore=["student", "teacher"]) (or pass only the teacher's checkpoint path and
load it inside), and the job peaks at ~7.4 GiB, 4 GiB to spare; it also stops writing the teacher into every
checkpoint.  Wrong first advice: a smaller batch or gradient checkpointing for the student (the student is
what the job is about and fits easily once the copy is gone), mixed precision (already 16-mixed),
torch.no_grad for the teacher (already), quantizing or half-casting the teacher (treats a symptom: the copy
stays), empty_cache / expandable_segments (the copy is live), a bigger GPU.
"""
import copy
import inspect
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH = 64
NUM_CLASSES = 1200


# ---- lightning.pytorch: hyperparameters as LightningModule.save_hyperparameters keeps them ----------
class AttributeDict(dict):
    def __getattr__(self, key):
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key)


def save_hyperparameters(obj, ignore=(), frame=None):
    """lightning.pytorch.utilities.parsing.save_hyperparameters: the __init__ arguments of the calling
    frame, less `ignore`, become obj._hparams; a deep copy is kept as the initial hyperparameters."""
    init_args = {k: v for k, v in inspect.getargvalues(frame)[3].items()
                 if k not in ("self", "__class__") and not k.startswith("_") and k not in ignore}
    obj._hparams = AttributeDict(init_args)
    for k, v in obj._hparams.items():
        if isinstance(v, torch.nn.Module):
            print("UserWarning: Attribute %r is an instance of `nn.Module` and is already saved during "
                  "checkpointing. It is recommended to ignore them using `self.save_hyperparameters(ignore=[%r])`."
                  % (k, k))
    # make a deep copy so there are no other runtime changes reflected
    obj._hparams_initial = copy.deepcopy(obj._hparams)


class LightningModule(torch.nn.Module):
    trainer = None

    def save_hyperparameters(self, *args, ignore=None, logger=True):
        self._log_hyperparams = logger
        frame = inspect.currentframe().f_back
        save_hyperparameters(self, ignore=ignore or (), frame=frame)

    @property
    def hparams(self):
        return self._hparams

    def log(self, name, value, **kwargs):
        pass


class Trainer(object):
    def __init__(self, accelerator="gpu", devices=1, precision="32-true", max_epochs=1, num_sanity_val_steps=2):
        self.precision = precision
        self.max_epochs = max_epochs
        self.num_sanity_val_steps = num_sanity_val_steps

    def fit(self, model, train_dataloaders, val_dataloaders):
        model.trainer = self
        model.cuda()                                        # the strategy moves the LightningModule
        self.optimizer = model.configure_optimizers()
        self._run_sanity_check(model, val_dataloaders)
        for epoch in range(self.max_epochs):
            model.train()
            for batch_idx, batch in enumerate(train_dataloaders()):
                with torch.autocast("cuda", dtype=torch.float16):
                    loss = model.training_step(batch, batch_idx)
                loss.backward()
                release_graph(loss)
                self.optimizer.step()
                self.optimizer.zero_grad()

    def _run_sanity_check(self, model, val_dataloaders):
        model.eval()
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.float16):
            for batch_idx, batch in enumerate(val_dataloaders()):
                if batch_idx >= self.num_sanity_val_steps:
                    break
                model.validation_step(batch, batch_idx)
        model.train()


def release_graph(loss):
    """What autograd does after backward: the saved activations go."""
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


# ---- the teacher: DINOv2 ViT-g/14 + a linear head (fine-tuned), as torch.hub builds it --------------
class NestedTensorBlock(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attn = torch.nn.Module()
        self.attn.qkv = torch.nn.Module()
        self.attn.qkv.weight = torch.nn.Parameter(torch.empty(1536 * 4608 * 4, device="cuda"))
        self.attn.proj = torch.nn.Module()
        self.attn.proj.weight = torch.nn.Parameter(torch.empty(1536 * 1536 * 4, device="cuda"))
        self.mlp = torch.nn.Module()                             # SwiGLU FFN, 4096 hidden
        self.mlp.w12 = torch.nn.Module()
        self.mlp.w12.weight = torch.nn.Parameter(torch.empty(1536 * 8192 * 4, device="cuda"))
        self.mlp.w3 = torch.nn.Module()
        self.mlp.w3.weight = torch.nn.Parameter(torch.empty(4096 * 1536 * 4, device="cuda"))

    def forward(self, x, batch):
        tokens = batch * 257
        qkv = torch.empty(tokens * 4608 * 2, device="cuda")
        attn = torch.empty(tokens * 1536 * 2, device="cuda")
        del qkv
        hidden = torch.empty(tokens * 8192 * 2, device="cuda")
        out = torch.empty(tokens * 1536 * 4, device="cuda")
        del hidden, attn
        return out


class DinoVisionTransformerClassifier(torch.nn.Module):
    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.patch_embed = torch.nn.Parameter(torch.empty(1536 * 3 * 14 * 14 * 4, device="cuda"))
        self.blocks = torch.nn.Module()
        for i in range(40):
            setattr(self.blocks, str(i), NestedTensorBlock())
        self.head = torch.nn.Parameter(torch.empty(2 * 1536 * num_classes * 4, device="cuda"))

    def forward(self, images):
        batch = images.nbytes // (3 * 224 * 224 * 4)
        x = torch.empty(batch * 257 * 1536 * 4, device="cuda")
        for i in range(40):
            x = getattr(self.blocks, str(i))(x, batch)
        return torch.empty(batch * NUM_CLASSES * 4, device="cuda")


def load_teacher(path):
    return DinoVisionTransformerClassifier(NUM_CLASSES)          # the fine-tuned weights, fp32


def evaluate(model, loader):
    with torch.no_grad():
        for images, labels in loader():
            model(images)
    return 94.1


# ---- the student: timm's efficientnet_b0 (built on the CPU, moved by Lightning) -----------------------
EFFNET_STAGES = (  # (channels out, expanded channels, spatial side, blocks) of efficientnet_b0 at 224 px
    (16, 32, 112, 1), (24, 96, 112, 2), (40, 144, 56, 2), (80, 240, 28, 3),
    (112, 480, 14, 3), (192, 672, 14, 4), (320, 1152, 7, 1))


class DepthwiseSeparable(torch.nn.Module):
    """An MBConv block: what it keeps for backward at fp16, per image, from its expanded activations."""

    def __init__(self, c_out, c_exp, side):
        torch.nn.Module.__init__(self)
        self.c_out, self.c_exp, self.side = c_out, c_exp, side
        self.conv_pw = None

    def forward(self, x, batch):
        px = self.side * self.side
        expanded = torch.empty(batch * px * self.c_exp * 2 * 4, device="cuda")   # conv, bn, act, dw, bn, act
        out = torch.empty(batch * px * self.c_out * 2 * 2, device="cuda")
        if torch.is_grad_enabled():
            out._saved = [x, expanded]
        return out


class EfficientNet(torch.nn.Module):
    def __init__(self, num_classes):
        torch.nn.Module.__init__(self)
        self.num_classes = num_classes
        self.blocks = torch.nn.Module()
        i = 0
        for c_out, c_exp, side, n in EFFNET_STAGES:
            for _ in range(n):
                setattr(self.blocks, str(i), DepthwiseSeparable(c_out, c_exp, side))
                i += 1
        self.n_blocks = i

    def cuda(self, device=None):
        if not getattr(self, "_on_gpu", False):
            self.conv_stem = torch.nn.Parameter(torch.empty(32 * 3 * 9 * 4, device="cuda"))
            self.weights = torch.nn.Parameter(torch.empty(5_300_000 * 4, device="cuda"))
            self._on_gpu = True
        return self

    def forward(self, images):
        batch = images.nbytes // (3 * 224 * 224 * 4)
        self.weights
        x = torch.empty(batch * 112 * 112 * 32 * 2 * 3, device="cuda")
        for i in range(self.n_blocks):
            x = getattr(self.blocks, str(i))(x, batch)
        feats = torch.empty(batch * 7 * 7 * 1280 * 2 * 3, device="cuda")
        logits = torch.empty(batch * self.num_classes * 4, device="cuda")
        if torch.is_grad_enabled():
            feats._saved = x
            logits._saved = feats
        return logits


def create_model(name, num_classes):
    return EfficientNet(num_classes)


# ---- the startup's LightningModule ---------------------------------------------------------------------
class LitDistill(LightningModule):
    def __init__(self, student, teacher, temperature=4.0, alpha=0.7, lr=3e-3):
        LightningModule.__init__(self)
        self.save_hyperparameters()
        self.student = student
        self.teacher = teacher
        for p in self.teacher.parameters():
            p.requires_grad_(False)

    def cuda(self, device=None):
        self.student.cuda()
        return self

    def training_step(self, batch, batch_idx):
        x, y = batch
        with torch.no_grad():
            t_logits = self.teacher(x)
        s_logits = self.student(x)
        kd = torch.nn.functional.log_softmax(s_logits, -1)
        loss = torch.nn.functional.nll_loss(kd, y)
        self.log("train/loss", loss)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        s_logits = self.student(x)
        self.log("val/acc", 0.0)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.student.parameters(), lr=self.hparams.lr, weight_decay=0.05)


def loader(n_batches, batch=BATCH):
    def it():
        for _ in range(n_batches):
            yield torch.empty(batch * 3 * 224 * 224 * 4, device="cuda"), None
    return it


train_loader, val_loader = loader(1850), loader(160)

try:
    teacher = load_teacher("ckpt/dinov2_g14_sku1200.pt").cuda().eval()
    print("teacher val top-1:", evaluate(teacher, loader(4)))
    student = create_model("efficientnet_b0", num_classes=NUM_CLASSES)
    model = LitDistill(student, teacher, temperature=4.0, alpha=0.7, lr=3e-3)
    trainer = Trainer(accelerator="gpu", devices=1, precision="16-mixed", max_epochs=30)
    trainer.fit(model, train_loader, val_loader)
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
