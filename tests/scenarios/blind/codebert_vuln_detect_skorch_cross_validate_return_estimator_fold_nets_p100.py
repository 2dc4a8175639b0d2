"""cv_codebert.py -- a Kaggle notebook (P100 16 GB, 15.9 GiB usable) for a vulnerable-function
detection competition: microsoft/codebert-base (RoBERTa-base, 124.6M params, fp32: Pascal has no
bf16 and gains little from fp16) fine-tuned as a binary classifier through skorch, evaluated with
scikit-learn's 5-fold stratified cross-validation.  The author wants the five fold models afterwards
to average their predictions on the hidden test set, so the CV keeps them:

    net = NeuralNetClassifier(CodeBertClassifier, criterion=nn.CrossEntropyLoss,
                              optimizer=torch.optim.AdamW, lr=2e-5, max_epochs=2, batch_size=16,
                              device="cuda", train_split=None)
    cv = cross_validate(net, X, y, cv=StratifiedKFold(5, shuffle=True, random_state=0),
                        scoring="roc_auc", return_estimator=True)
    test_proba = np.mean([est.predict_proba(X_test)[:, 1] for est in cv["estimator"]], axis=0)

cross_validate clones the net for each fold, fits it, scores it, and with return_estimator=True
keeps the fitted net in its list of fold results until all folds are done.  A fitted skorch net
keeps module_ (475 MiB of weights), the gradients of its last step (475 MiB: zero_grad runs at the
start of a step) and optimizer_ with AdamW's two moments (950 MiB): 1.9 GiB per finished fold, on the
GPU, referenced only by sklearn's list.  One fold's training needs ~7.3 GiB of activations (16 x 512
tokens, fp32, 12 layers).  Folds 1-4 fit (each a little tighter); fold 5's first training steps run
out, after ~3 hours of notebook time.

An expert: nothing in fold 5 is bigger than in fold 1; the previous folds' nets are still on the
GPU, held by the cross-validation result list (a Python object).  Don't keep fitted nets on the GPU:
write the fold loop by hand (fit, predict the test set, save the params to disk, del the net, then
gc.collect() + empty_cache()), or keep the estimators but move each to the CPU / drop its optimizer
and gradients after fit (skorch: net.set_params(device="cpu") or a callback on_train_end).  Wrong
first advice: a smaller batch or gradient checkpointing (fold 6 would fail the same way), mixed
precision (P100), empty_cache or expandable_segments (the nets are referenced), a bigger GPU.
"""
import sys

import torch

import scen_truth

scen_truth.note_every_empty(torch)

MiB = 1 << 20
GiB = 1 << 30
N_SAMPLES = 21_850
SEQ_LEN, HIDDEN, HEADS, FFN, LAYERS, VOCAB = 512, 768, 12, 3072, 12, 50265


# ---- microsoft/codebert-base (RoBERTa-base) + a classification head, fp32 ----
class RobertaLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = torch.nn.Parameter(torch.empty(4 * (HIDDEN * HIDDEN + HIDDEN) * 4, device="cuda"))
        self.ffn = torch.nn.Parameter(torch.empty((2 * HIDDEN * FFN + FFN + HIDDEN + 4 * HIDDEN) * 4, device="cuda"))

    def forward(self, hidden, batch):
        tok = batch * SEQ_LEN
        a, f = self.attention, self.ffn
        h = hidden
        for nbytes in (3 * tok * HIDDEN * 4,                  # q, k, v
                       batch * HEADS * SEQ_LEN * SEQ_LEN * 4,  # softmax(scores)
                       batch * HEADS * SEQ_LEN * SEQ_LEN,      # its dropout mask
                       2 * tok * HIDDEN * 4,                   # context, attention output + LayerNorm
                       2 * tok * FFN * 4,                      # intermediate, gelu
                       2 * tok * HIDDEN * 4):                  # output + LayerNorm
            out = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            if torch.is_grad_enabled():
                out._saved = h
            h = out
        del a, f
        return h


class CodeBertClassifier(torch.nn.Module):
    def __init__(self, name="microsoft/codebert-base", num_labels=2):
        torch.nn.Module.__init__(self)
        # AutoModel.from_pretrained(name): weights in float32
        self.embeddings = torch.nn.Parameter(torch.empty((VOCAB + 514 + 1) * HIDDEN * 4, device="cuda"))
        for i in range(LAYERS):
            setattr(self, "layer_%d" % i, RobertaLayer())
        self.classifier = torch.nn.Parameter(torch.empty((HIDDEN * HIDDEN + HIDDEN * num_labels) * 4, device="cuda"))

    def forward(self, input_ids, attention_mask):
        batch = input_ids.batch
        e = self.embeddings
        h = torch.empty(batch * SEQ_LEN * HIDDEN * 4 * 2, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            h._saved = input_ids
        for i in range(LAYERS):
            h = getattr(self, "layer_%d" % i)(h, batch)
        c = self.classifier
        logits = torch.empty(batch * 2 * 4, dtype=torch.uint8, device="cuda")
        if torch.is_grad_enabled():
            logits._saved = h
        del e, c
        return logits


# ---- skorch, as far as this notebook goes (the stand-in torch has no skorch: written with skorch's
# ---- names and call structure: fit -> partial_fit -> fit_loop -> run_single_epoch -> train_step) ----
class NeuralNetClassifier(object):
    def __init__(self, module, criterion=None, optimizer=None, lr=0.01, max_epochs=10, batch_size=128,
                 device="cpu", train_split=None, **kwargs):
        self.module, self.criterion, self.optimizer = module, criterion, optimizer
        self.lr, self.max_epochs, self.batch_size, self.device = lr, max_epochs, batch_size, device
        self.train_split = train_split
        self.initialized_ = False

    def get_params(self, deep=False):
        return dict(module=self.module, criterion=self.criterion, optimizer=self.optimizer, lr=self.lr,
                    max_epochs=self.max_epochs, batch_size=self.batch_size, device=self.device,
                    train_split=self.train_split)

    def initialize(self):
        self.module_ = self.module()                        # .to(self.device)
        self.optimizer_ = self.optimizer(self.module_.parameters(), lr=self.lr)
        self.history = []
        self.initialized_ = True
        return self

    def fit(self, X, y, **fit_params):
        self.initialize()
        return self.partial_fit(X, y, **fit_params)

    def partial_fit(self, X, y, **fit_params):
        self.fit_loop(X, y, **fit_params)
        return self

    def fit_loop(self, X, y, epochs=None, **fit_params):
        for epoch in range(epochs or self.max_epochs):
            self.run_single_epoch(X, y, training=True)
            self.history.append({"epoch": epoch + 1})

    def run_single_epoch(self, X, y, training):
        for batch in X.batches(self.batch_size, steps=3):   # (the stand-in runs 3 steps per epoch)
            step = self.train_step(batch)
            self.history.append({"batch_size": batch.batch})

    def train_step(self, batch):
        self.optimizer_.zero_grad()
        step = self.train_step_single(batch)
        self.optimizer_.step()
        return step

    def train_step_single(self, batch):
        self.module_.train()
        y_pred = self.infer(batch)
        loss = self.get_loss(y_pred)
        scen_truth.backward(loss)                           # loss.backward()
        return {"loss": loss, "y_pred": y_pred}

    def infer(self, batch):
        return self.module_(input_ids=batch, attention_mask=batch)

    def get_loss(self, y_pred):
        loss = torch.empty(512, device="cuda")
        loss._saved = y_pred
        loss._params = y_pred._params
        return loss

    def evaluation_step(self, batch):
        with torch.no_grad():
            self.module_.eval()
            return self.infer(batch)

    def predict_proba(self, X):
        out = []
        for batch in X.batches(self.batch_size, steps=2):
            y = self.evaluation_step(batch)
            out.append(0.5)                                 # to_numpy(softmax(y)): on the CPU
            del y
        return out


class TokenizedFunctions(object):
    """The tokenized functions (input_ids / attention_mask, 512 tokens) in host memory; skorch moves
    each batch to the device."""

    def __init__(self, n):
        self.n = n

    def __getitem__(self, idx):
        return TokenizedFunctions(len(idx))

    def batches(self, batch_size, steps):
        for _ in range(steps):
            b = torch.empty(batch_size * SEQ_LEN * 8 * 2, dtype=torch.uint8, device="cuda")
            b.batch = batch_size
            yield b


# ---- scikit-learn's cross_validate (n_jobs=None: joblib runs the folds one after the other) ----
def clone(estimator):
    return estimator.__class__(**estimator.get_params(deep=False))


class StratifiedKFold(object):
    def __init__(self, n_splits=5, shuffle=False, random_state=None):
        self.n_splits = n_splits

    def split(self, X, y):
        fold = X.n // self.n_splits
        for k in range(self.n_splits):
            test = list(range(k * fold, (k + 1) * fold))
            train = [i for i in range(0, X.n, 97) if not k * fold <= i < (k + 1) * fold]
            yield train, test


def delayed(function):
    def delayed_function(*args, **kwargs):
        return function, args, kwargs
    return delayed_function


class Parallel(object):
    def __init__(self, n_jobs=None, verbose=0, pre_dispatch="2*n_jobs"):
        self.n_jobs = n_jobs

    def __call__(self, iterable):
        self._output = []
        for func, args, kwargs in iterable:
            self._output.append(func(*args, **kwargs))
        return self._output


def _fit_and_score(estimator, X, y, scorer, train, test, return_estimator=False):
    X_train, X_test = X[train], X[test]
    estimator.fit(X_train, None)
    test_scores = scorer(estimator, X_test, None)
    result = {"test_scores": test_scores, "fit_time": 0.0}
    if return_estimator:
        result["estimator"] = estimator
    print("fold done: auc %.3f, %.1f GiB allocated" % (test_scores, torch.cuda.memory_allocated() / GiB))
    sys.stdout.flush()
    return result


def cross_validate(estimator, X, y=None, *, scoring=None, cv=None, n_jobs=None, return_estimator=False):
    indices = cv.split(X, y)
    parallel = Parallel(n_jobs=n_jobs)
    results = parallel(
        delayed(_fit_and_score)(clone(estimator), X, y, scorer=scoring, train=train, test=test,
                                return_estimator=return_estimator)
        for train, test in indices)
    out = {"test_score": [r["test_scores"] for r in results]}
    if return_estimator:
        out["estimator"] = [r["estimator"] for r in results]
    return out


def roc_auc(estimator, X, y):
    estimator.predict_proba(X)
    return 0.71


def main():
    X = TokenizedFunctions(N_SAMPLES)
    y = None
    net = NeuralNetClassifier(CodeBertClassifier, criterion=torch.nn.Module, optimizer=torch.optim.AdamW,
                              lr=2e-5, max_epochs=2, batch_size=16, device="cuda", train_split=None)
    cv = cross_validate(net, X, y, cv=StratifiedKFold(5, shuffle=True, random_state=0), scoring=roc_auc,
                        return_estimator=True)
    print("CV AUC", cv["test_score"])


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
