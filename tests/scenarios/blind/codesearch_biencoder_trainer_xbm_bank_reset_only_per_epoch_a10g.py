"""train_codesearch.py -- the developer-tools team fine-tunes a code-search bi-encoder: UniXcoder-base
(RoBERTa-base, 125M parameters, fp32 weights, bf16 autocast) on 4.1M (docstring/query, function) pairs from
CodeSearchNet and the company's monorepo, with the Hugging Face Trainer on one A10G (g5.2xlarge, 22.5 GiB
usable), batch 128, queries up to 48 tokens and code up to 192.  In-batch negatives alone were too easy, so
the loss adds a cross-batch memory (XBM): the code embeddings of earlier steps serve as extra negatives.
Embeddings "drift as the encoder trains", so the memory is cleared at the start of each epoch:

    class ContrastiveTrainer(Trainer):
        bank = None
        def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
            q = F.normalize(model(**inputs["query"]).pooler_output, dim=-1)
            c = F.normalize(model(**inputs["code"]).pooler_output, dim=-1)
            keys = c if self.bank is None else torch.cat([c, self.bank])
            logits = q @ keys.T / 0.05                      # 128 x (128 + bank)
            loss = F.cross_entropy(logits, torch.arange(len(q), device=q.device))
            self.bank = c.detach() if self.bank is None else torch.cat([self.bank, c.detach()])
            return loss

    class ResetBank(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            trainer.bank = None

An epoch is 32,000 steps.  Each step adds 128 embeddings (384 KiB) to the bank and never removes any until
the next epoch; the keys of each step are a fresh copy of the whole bank (torch.cat) that the matmul keeps
for backward, the next bank is built by torch.cat beside the old one, and the logits and cross_entropy's
log-softmax grow by a column per stored embedding.  The step's real work (weights and AdamW state 1.4 GiB,
~9.5 GiB of encoder activations, the gradients in backward) is the same every step; what grows is the
bank, ~1.2 MiB of live memory per step at the step's peak.  The loss curve looked good for hours; about
8,800 steps into the first epoch (the bank at 1.12M embeddings, 3.2 GiB) compute_loss fails building the
next bank: a 3.2 GiB request beside the old bank and this step's 3.2 GiB copy of it in `keys`.

An expert: the memory bank is unbounded within an epoch -- bound it to a fixed size (XBM uses a FIFO of a
few tens of thousands: keep the last 65,536 rows, a preallocated ring buffer written in place, or
self.bank = self.bank[-65536:] after the cat); that caps it at 192 MiB and the step at ~12 GiB.  Wrong
first advice: a smaller batch or gradient checkpointing (the encoder's memory is constant; the bank would
still grow and fail later), mixed precision (already bf16), expandable_segments or empty_cache (the bank is
live, referenced by the trainer), an 8-bit optimizer, a bigger GPU (it only postpones the failure).
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
BATCH, Q_LEN, C_LEN, DIM = 128, 48, 192, 768
STEPS_PER_EPOCH = 32_000


class ModelOutput(object):
    def __init__(self, pooler_output):
        self.pooler_output = pooler_output


class RobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(7_087_872 * 4, device="cuda"))

    def forward(self, hidden, tokens):
        self.weight
        out = torch.empty(tokens * 27 * 1024, device="cuda")     # what a layer keeps for backward, bf16
        out._saved = hidden
        return out


class RobertaModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Parameter(torch.empty(39_000_000 * 4, device="cuda"))
        self.encoder = torch.nn.Module()
        for i in range(12):
            setattr(self.encoder, str(i), RobertaLayer())

    def forward(self, input_ids, attention_mask):
        batch, seq = input_ids
        tokens = batch * seq
        self.embeddings
        hidden = torch.empty(tokens * DIM * 4, device="cuda")
        for i in range(12):
            hidden = getattr(self.encoder, str(i))(hidden, tokens)
        pooled = torch.empty(batch * DIM * 4, device="cuda")
        pooled._saved = hidden
        return ModelOutput(pooled)


def normalize(x, dim=-1):
    out = torch.empty(x.nbytes, device="cuda")
    out._saved = x
    return torch._derive(out, x)


def cat(tensors):
    out = torch.empty(sum(t.nbytes for t in tensors), device="cuda")
    return torch._derive(out, *tensors)


def matmul_t(q, keys, n_q, n_k):
    logits = torch.empty(n_q * n_k * 4, device="cuda")
    logits._saved = [q, keys]
    return torch._derive(logits, q, keys)


def backward(loss):
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


# ---- transformers.Trainer, as far as this job uses it --------------------------------------------------
class TrainerCallback(object):
    def on_epoch_begin(self, args, state, control, **kwargs):
        pass


class TrainerState(object):
    def __init__(self):
        self.global_step, self.epoch, self.log_history = 0, 0.0, []


class TrainingArguments(object):
    def __init__(self, output_dir, per_device_train_batch_size=8, learning_rate=5e-5, num_train_epochs=3,
                 bf16=False, logging_steps=500, warmup_ratio=0.0, **kwargs):
        self.output_dir = output_dir
        self.per_device_train_batch_size = per_device_train_batch_size
        self.learning_rate, self.num_train_epochs, self.bf16 = learning_rate, num_train_epochs, bf16
        self.logging_steps = logging_steps


class Trainer(object):
    def __init__(self, model, args, train_dataset, callbacks=()):
        self.model, self.args, self.train_dataset = model, args, train_dataset
        self.callbacks = list(callbacks)
        self.state = TrainerState()
        self.optimizer = None

    def create_optimizer(self):
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate, weight_decay=0.01)

    def train(self):
        self.create_optimizer()
        return self._inner_training_loop()

    def _inner_training_loop(self):
        tr_loss = 0.0
        for epoch in range(self.args.num_train_epochs):
            for cb in self.callbacks:
                cb.on_epoch_begin(self.args, self.state, None)
            for step, inputs in enumerate(self.train_dataset.epoch()):
                tr_loss_step = self.training_step(self.model, inputs)
                self.optimizer.step()
                self.model.zero_grad()
                self.state.global_step += 1
                if self.state.global_step % self.args.logging_steps == 0:
                    self.state.log_history.append({"loss": 0.0, "step": self.state.global_step})
                    print("{'loss': %.4f, 'grad_norm': 0.41, 'learning_rate': 2e-05, 'epoch': %.2f}"
                          % (1.9 / (1 + self.state.global_step / 2000.0), self.state.global_step / float(STEPS_PER_EPOCH)))

    def training_step(self, model, inputs, num_items_in_batch=None):
        model.train()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = self.compute_loss(model, inputs, num_items_in_batch=num_items_in_batch)
        backward(loss)                                   # self.accelerator.backward(loss)
        return 0.0


# ---- the team's code -------------------------------------------------------------------------------------
class ContrastiveTrainer(Trainer):
    bank = None
    temperature = 0.05

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        q = normalize(model(**inputs["query"]).pooler_output, dim=-1)
        c = normalize(model(**inputs["code"]).pooler_output, dim=-1)
        keys = c if self.bank is None else cat([c, self.bank])
        n_keys = keys.nbytes // (DIM * 4)
        logits = matmul_t(q, keys, BATCH, n_keys)                # q @ keys.T / self.temperature
        loss = torch.nn.functional.cross_entropy(logits, None)
        self.bank = c.detach() if self.bank is None else cat([self.bank, c.detach()])
        return loss


class CodeSearchPairs(object):
    def epoch(self):
        for _ in range(STEPS_PER_EPOCH):
            yield {"query": {"input_ids": (BATCH, Q_LEN), "attention_mask": None},
                   "code": {"input_ids": (BATCH, C_LEN), "attention_mask": None}}


try:
    model = RobertaModel()                    # AutoModel.from_pretrained("microsoft/unixcoder-base").cuda()
    args = TrainingArguments("out/unixcoder-xbm", per_device_train_batch_size=BATCH, learning_rate=2e-5,
                             num_train_epochs=3, bf16=True, logging_steps=500, warmup_ratio=0.05)
    trainer = ContrastiveTrainer(model=model, args=args, train_dataset=CodeSearchPairs())

    class ResetBank(TrainerCallback):
        def on_epoch_begin(self, args, state, control, **kwargs):
            trainer.bank = None

    trainer.callbacks.append(ResetBank())
    trainer.train()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
