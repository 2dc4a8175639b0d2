"""finetune_binding.py -- an antibody-engineering group fine-tunes ESM-2 3B (esm2_t36_3B_UR50D, 2.84B
parameters, fp32: 10.6 GiB) to classify paired VH-VL sequences as binders / non-binders of their target,
with LoRA from Microsoft's loralib on the query and value projections (r=8), fp16 autocast, batch 16 of
sequences padded to 256 residues, on one A100 40GB:

    import loralib as lora
    model = EsmForSequenceClassification.from_pretrained("facebook/esm2_t36_3B_UR50D", num_labels=2)
    for layer in model.esm.encoder.layer:
        layer.attention.self.query = lora.Linear(2560, 2560, r=8, lora_alpha=16)   # weights copied over
        layer.attention.self.value = lora.Linear(2560, 2560, r=8, lora_alpha=16)
    # lora.mark_only_lora_as_trainable(model)   # froze the classifier too: val AUROC stuck at 0.50
    model.cuda()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=5e-4)

In the first run mark_only_lora_as_trainable() froze the new classification head as well (it freezes
every parameter whose name lacks "lora_"), the AUROC stayed at 0.50, and the call was commented out.
Since then the job "trains LoRA" but every parameter except the wrapped query/value weights (lora.Linear
freezes its own weight) requires grad and is in the optimizer: 2.37B trainable parameters instead of
~10M (adapters + head).  Step 1 goes through (forward 21 GiB of activations; backward; AdamW makes
17.6 GiB of moments; zero_grad frees the 8.8 GiB of gradients).  Step 2's forward then starts with
weights + moments = 28.2 GiB and dies half way, in layer 19 of 36.

An expert: this is an accidental full fine-tune.  Make only the adapters (and the head) trainable: call
lora.mark_only_lora_as_trainable(model) and then model.classifier.requires_grad_(True) (or PEFT's
modules_to_save=["classifier"]); the optimizer then holds ~10M parameters, no moments or gradients for
the base, and batch 16 fits with 7 GiB to spare.  It is also why the loss curve looks odd: lr 5e-4 on the
whole 3B model.  Wrong first advice: a smaller batch or gradient checkpointing (the forward fails because
17.6 GiB of unintended optimizer state sits under it), an 8-bit optimizer / ZeRO / CPU offload (they
would make the accidental full fine-tune fit, at the LoRA learning rate), expandable_segments /
empty_cache, a bigger GPU.
"""
import sys
import types

import torch

import scen_truth

scen_truth.note_every_empty(torch)

HIDDEN = 2560
FFN = 10240
LAYERS = 36
HEADS = 40
BATCH_SIZE = 16
MAX_LEN = 256


# -- what the stand-in torch lacks, written as PyTorch behaves ------------------------------------------
_autograd_backward = torch.Tensor.backward


def _backward(self, gradient=None, retain_graph=None, create_graph=False, inputs=None):
    """loss.backward() (retain_graph=False).  PyTorch frees each layer's saved tensors as backward passes it
    while the gradients appear; the stand-in's engine makes every gradient at once, so the saved tensors
    are let go first (the peak is then weights + gradients, as in PyTorch for this model)."""
    todo = [self._saved]
    self._saved = None
    while todo:
        t = todo.pop()
        if isinstance(t, (list, tuple)):
            todo.extend(t)
        elif isinstance(t, torch.Tensor) and t.__dict__.get("_saved") is not None:
            todo.append(t._saved)
            t._saved = None
    del todo, t
    _autograd_backward(self, gradient, retain_graph, create_graph, inputs)


torch.Tensor.backward = _backward


def _named_parameters(self, prefix=""):
    """Module.named_parameters() with PyTorch's dotted names, in module order."""
    seen = []
    todo = [(prefix, self)]
    while todo:
        pre, m = todo.pop()
        for k, p in m._parameters.items():
            if p is not None and all(p is not q for q in seen):
                seen.append(p)
                yield pre + k, p
        todo.extend(reversed([(pre + name + ".", sub) for name, sub in m._modules.items()]))


torch.nn.Module.named_parameters = _named_parameters


def _records(*inputs):
    return torch.is_grad_enabled() and any(t is not None and (t._params or t.requires_grad) for t in inputs)


def _act(nbytes, *saved):
    """An activation of nbytes made from `saved`; what autograd saves for backward stays referenced from it."""
    out = torch.empty(nbytes, device="cuda")
    if _records(*saved):
        torch._derive(out, *saved)
        out._saved = saved
    return out


class ModuleList(torch.nn.Module):
    """torch.nn.ModuleList: submodules named 0, 1, 2, ..."""

    def __init__(self, modules=()):
        torch.nn.Module.__init__(self)
        for i, m in enumerate(modules):
            setattr(self, str(i), m)

    def __iter__(self):
        return iter(list(self._modules.values()))

    def __len__(self):
        return len(self._modules)


torch.nn.ModuleList = ModuleList


class Linear(torch.nn.Module):
    """torch.nn.Linear (fp32 weight; fp16 output under autocast): saves its input."""

    def __init__(self, fin, fout):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = fin, fout
        self.weight = torch.nn.Parameter(torch.empty(fin * fout * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(fout * 4, device="cuda"))

    def forward(self, x, tokens):
        out = torch.empty(tokens * self.out_features * 2, device="cuda")
        if torch.is_grad_enabled():
            out._saved = x
        return out


class LayerNorm(torch.nn.Module):
    def __init__(self, dim):
        torch.nn.Module.__init__(self)
        self.weight = torch.nn.Parameter(torch.empty(dim * 4, device="cuda"))
        self.bias = torch.nn.Parameter(torch.empty(dim * 4, device="cuda"))

    def forward(self, x, tokens):
        out = torch.empty(tokens * HIDDEN * 2, device="cuda")
        if torch.is_grad_enabled():
            out._saved = x
        return out


# loralib (github.com/microsoft/LoRA), as far as this job uses it
lora = types.ModuleType("loralib")


class _LoraLinear(Linear):
    """loralib.Linear: the pretrained weight, frozen by the constructor; lora_A (r x in), lora_B (out x r)."""

    def __init__(self, in_features, out_features, r=0, lora_alpha=1):
        Linear.__init__(self, in_features, out_features)
        self.r = r
        self.lora_A = torch.nn.Parameter(torch.empty(r * in_features * 4, device="cuda"))
        self.lora_B = torch.nn.Parameter(torch.empty(out_features * r * 4, device="cuda"))
        self.scaling = lora_alpha / r
        self.weight.requires_grad = False                 # loralib: "Freezing the pre-trained weight matrix"

    def forward(self, x, tokens):
        out = Linear.forward(self, x, tokens)
        down = torch.empty(tokens * self.r * 2, device="cuda")
        if torch.is_grad_enabled():
            down._saved = x
            out._saved = (x, down)
        return out


def _mark_only_lora_as_trainable(model, bias="none"):
    for n, p in model.named_parameters():
        if "lora_" not in n:
            p.requires_grad = False


lora.Linear = _LoraLinear
lora.mark_only_lora_as_trainable = _mark_only_lora_as_trainable


# -- transformers' EsmForSequenceClassification (rotary, eager attention) ---------------------------------
class EsmSelfAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.query = Linear(HIDDEN, HIDDEN)
        self.key = Linear(HIDDEN, HIDDEN)
        self.value = Linear(HIDDEN, HIDDEN)

    def forward(self, h, tokens, batch, seq):
        q, k, v = self.query(h, tokens), self.key(h, tokens), self.value(h, tokens)
        q_rot, k_rot = _act(tokens * HIDDEN * 2, q), _act(tokens * HIDDEN * 2, k)
        scores = _act(batch * HEADS * seq * seq * 2, q_rot, k_rot)
        probs = _act(batch * HEADS * seq * seq * 2, scores)
        return _act(tokens * HIDDEN * 2, probs, v)


class EsmAttention(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.LayerNorm = LayerNorm(HIDDEN)
        self.self = EsmSelfAttention()
        self.output = torch.nn.Module()
        self.output.dense = Linear(HIDDEN, HIDDEN)

    def forward(self, h, tokens, batch, seq):
        ctx = self.self(self.LayerNorm(h, tokens), tokens, batch, seq)
        out = self.output.dense(ctx, tokens)
        return _act(tokens * HIDDEN * 4, h, out)                  # residual, fp32 stream


class EsmLayer(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.attention = EsmAttention()
        self.LayerNorm = LayerNorm(HIDDEN)
        self.intermediate = torch.nn.Module()
        self.intermediate.dense = Linear(HIDDEN, FFN)
        self.output = torch.nn.Module()
        self.output.dense = Linear(FFN, HIDDEN)

    def forward(self, h, tokens, batch, seq):
        a = self.attention(h, tokens, batch, seq)
        up = self.intermediate.dense(self.LayerNorm(a, tokens), tokens)
        gelu = _act(tokens * FFN * 2, up)
        down = self.output.dense(gelu, tokens)
        return _act(tokens * HIDDEN * 4, a, down)


class EsmModel(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.embeddings = torch.nn.Module()
        self.embeddings.word_embeddings = torch.nn.Parameter(torch.empty(33 * HIDDEN * 4, device="cuda"))
        self.encoder = torch.nn.Module()
        self.encoder.layer = torch.nn.ModuleList([EsmLayer() for _ in range(LAYERS)])
        self.encoder.emb_layer_norm_after = LayerNorm(HIDDEN)
        self.contact_head = torch.nn.Module()
        self.contact_head.regression = Linear(LAYERS * HEADS, 1)

    def forward(self, input_ids, tokens, batch, seq):
        h = _act(tokens * HIDDEN * 4, input_ids, self.embeddings.word_embeddings)
        for layer in self.encoder.layer:
            h = layer(h, tokens, batch, seq)
        return self.encoder.emb_layer_norm_after(h, tokens)


class EsmClassificationHead(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.dense = Linear(HIDDEN, HIDDEN)
        self.out_proj = Linear(HIDDEN, 2)

    def forward(self, cls, batch):
        return self.out_proj(self.dense(cls, batch), batch)


class EsmForSequenceClassification(torch.nn.Module):
    def __init__(self):
        torch.nn.Module.__init__(self)
        self.esm = EsmModel()
        self.classifier = EsmClassificationHead()

    def forward(self, input_ids, labels):
        batch, seq = BATCH_SIZE, MAX_LEN
        tokens = batch * seq
        h = self.esm(input_ids, tokens, batch, seq)
        logits = self.classifier(_act(batch * HIDDEN * 2, h), batch)
        return _act(512, logits)                                   # cross-entropy over 2 classes


def paired_sequences(n):
    for _ in range(n):
        yield torch.empty(BATCH_SIZE * MAX_LEN * 8, device="cuda"), torch.empty(BATCH_SIZE * 8, device="cuda")


def main():
    model = EsmForSequenceClassification()
    for layer in model.esm.encoder.layer:
        layer.attention.self.query = lora.Linear(HIDDEN, HIDDEN, r=8, lora_alpha=16)
        layer.attention.self.value = lora.Linear(HIDDEN, HIDDEN, r=8, lora_alpha=16)
    # lora.mark_only_lora_as_trainable(model)   # froze the classifier too: val AUROC stuck at 0.50
    model.cuda()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=5e-4, weight_decay=0.01)
    print("LoRA r=8 on query/value; optimizer over %d tensors" % len(trainable))
    for epoch in range(10):
        model.train()
        for step, (input_ids, labels) in enumerate(paired_sequences(1200)):
            with torch.autocast("cuda", dtype=torch.float16):
                loss = model(input_ids, labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            print("epoch %d step %d allocated %.1f GiB" % (epoch, step, torch.cuda.memory_allocated() / 2**30))


try:
    main()
except torch.OutOfMemoryError:
    scen_truth.torch_oom_mark()
    raise
sys.exit(0)
